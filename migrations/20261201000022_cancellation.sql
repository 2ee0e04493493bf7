-- Cancellation (issue 17, item 2): CancelEvent by event id, event key or a caller's
-- cancellation key, for the whole event or some recipients only.

-- The caller's grouping key for cancels (e.g. 'cart:123:reminders'); not unique.
ALTER TABLE notification_events
    ADD COLUMN cancellation_key text NULL,
    -- Set when the whole event was canceled, with who did it (caller or staff name).
    ADD COLUMN canceled_at timestamptz NULL,
    ADD COLUMN canceled_by text NULL;
CREATE INDEX notification_events_cancellation_key ON notification_events (caller, cancellation_key)
    WHERE cancellation_key IS NOT NULL;

-- Cancels of some recipients only: no delivery of the event is sent to (or planned for)
-- these users any more.
CREATE TABLE event_cancellations (
    event_id    uuid NOT NULL REFERENCES notification_events (id),
    user_id     text NOT NULL,
    canceled_at timestamptz NOT NULL DEFAULT now(),
    canceled_by text,
    PRIMARY KEY (event_id, user_id)
);

-- A canceled topic event's fan-out stops where it was (its checkpoint is kept).
ALTER TABLE notification_events DROP CONSTRAINT notification_events_fanout_status_check;
ALTER TABLE notification_events ADD CONSTRAINT notification_events_fanout_status_check
    CHECK (fanout_status IN ('none', 'pending', 'done', 'canceled'));

-- No path puts a delivery of a canceled event (or recipient) back to 'pending': a
-- retry recorded after the cancel, the sweeper's requeue of an expired lease, a
-- deferral at due time, the console's retry of a failed delivery. Such an update ends it
-- 'canceled' instead. (A retry racing the cancel's own transaction is caught by the
-- cancel, which cancels every pending delivery again while it waits for those in flight.)
CREATE FUNCTION deliveries_stay_canceled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    who text;
BEGIN
    SELECT coalesce(e.canceled_by, c.canceled_by, '') INTO who
    FROM notification_events e
    LEFT JOIN event_cancellations c ON c.event_id = e.id AND c.user_id = NEW.user_id
    WHERE e.id = NEW.event_id AND (e.canceled_at IS NOT NULL OR c.event_id IS NOT NULL);
    IF FOUND THEN
        NEW.status := 'canceled';
        NEW.last_error := 'canceled by ' || who;
        NEW.lease_token := NULL;
        NEW.lease_expires_at := NULL;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER deliveries_stay_canceled BEFORE UPDATE OF status ON notification_deliveries
    FOR EACH ROW WHEN (NEW.status = 'pending' AND OLD.status IS DISTINCT FROM 'pending')
    EXECUTE FUNCTION deliveries_stay_canceled();
