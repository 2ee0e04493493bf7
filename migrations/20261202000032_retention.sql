-- Retention (issue 20): old terminal deliveries, their attempts, inbox rows and events are
-- deleted in small batches by a task in ingest (notify_store::retention), and the content
-- and provider answers kept in attempts are cleared earlier. See docs/data.md.

-- Per-type overrides, in seconds (NULL = the global NOTIFY_RETENTION_* setting). At most
-- 366 days, as every duration a setting accepts (notify_core::retry::MAX_DURATION).
ALTER TABLE notification_types
    ADD COLUMN content_retention_s integer
        CHECK (content_retention_s BETWEEN 1 AND 31622400),
    ADD COLUMN delivery_retention_s integer
        CHECK (delivery_retention_s BETWEEN 1 AND 31622400),
    ADD COLUMN archived_inbox_retention_s integer
        CHECK (archived_inbox_retention_s BETWEEN 1 AND 31622400);

-- How far the clearing of attempts' content has gone, per retention length in use: the
-- attempts are walked once in id order (bigserial, so about the order they finished in)
-- for each distinct length, instead of scanning the cleared ones again on every pass.
CREATE TABLE retention_cursors (
    duration_s      bigint PRIMARY KEY,
    last_attempt_id bigint NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Archived inbox items by type and last change: the purge's range scan. Partial, so
-- writing an unread or read item (the hot path) adds no index entry.
CREATE INDEX notifications_archived ON notifications (type, updated_at) WHERE status = 'archived';

-- An event joined to a digest delivery is kept while the digest is (digest_items.event_id
-- references it); the primary key (delivery_id, event_id) cannot answer by event.
CREATE INDEX digest_items_event ON digest_items (event_id);

-- Batched deletes leave dead tuples that only VACUUM makes reusable. With the default
-- scale factor (20 % of the table) a 10 M-row table waits for 2 M dead rows before its
-- autovacuum, and grows meanwhile; at 2 % (plus the base threshold) the freed space is
-- reused by new rows and the tables stay flat under a steady purge. No cost limit change:
-- these vacuums are small and frequent.
ALTER TABLE notification_deliveries SET (autovacuum_vacuum_scale_factor = 0.02,
                                         autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE delivery_attempts SET (autovacuum_vacuum_scale_factor = 0.02,
                                   autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE notification_events SET (autovacuum_vacuum_scale_factor = 0.02,
                                     autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE notifications SET (autovacuum_vacuum_scale_factor = 0.02);
