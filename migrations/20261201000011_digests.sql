-- Digests: a type with digest_window_s W collects the events of one aggregate_key for one
-- user into one delivery per channel and window. Windows are aligned to the Unix epoch in
-- UTC: [k*W, (k+1)*W) seconds; the digest delivery is due when its window closes and
-- lists the events attached to it in digest_items. In-app is not held: each event updates
-- the user's one inbox row of the group in place (group_key, item_count).
ALTER TABLE notification_types
    ADD COLUMN digest_window_s integer NOT NULL DEFAULT 0 CHECK (digest_window_s >= 0);
ALTER TABLE notification_events ADD COLUMN aggregate_key text;
ALTER TABLE notification_deliveries ADD COLUMN digest_key text;

CREATE TABLE digest_items (
    delivery_id uuid NOT NULL REFERENCES notification_deliveries (id),
    event_id    uuid NOT NULL REFERENCES notification_events (id),
    added_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (delivery_id, event_id)
);

ALTER TABLE notifications
    ADD COLUMN group_key    text,
    ADD COLUMN item_count   integer NOT NULL DEFAULT 1,
    ADD COLUMN delivery_ids uuid[] NOT NULL DEFAULT '{}',
    ADD COLUMN updated_at   timestamptz NOT NULL DEFAULT now();
CREATE UNIQUE INDEX notifications_group ON notifications (user_id, group_key)
    WHERE group_key IS NOT NULL;
