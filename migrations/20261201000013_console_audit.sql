-- Every operator action taken in the console: who, what, on which target, when.
CREATE TABLE console_audit (
    id      bigserial PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    staff   text NOT NULL,
    action  text NOT NULL,
    target  text NOT NULL,
    detail  text NOT NULL DEFAULT ''
);
-- Console search by user id: their latest deliveries.
CREATE INDEX notification_deliveries_user ON notification_deliveries (user_id, id DESC);
CREATE INDEX notification_events_type ON notification_events (type, id DESC);
