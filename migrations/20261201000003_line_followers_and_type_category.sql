-- LINE follow state from the webhook (follow / unfollow events). A LINE user id with
-- following = false has blocked the official account: LINE deliveries to it are skipped
-- with reason line_unfollowed. changed_at is the webhook event's own timestamp, so a late
-- redelivery of an older event never overrides a newer one.
CREATE TABLE line_followers (
    line_user_id     text PRIMARY KEY,
    following        boolean NOT NULL,
    changed_at       timestamptz NOT NULL,
    webhook_event_id text NOT NULL DEFAULT '',
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- transactional (receipts, security) or marketing (newsletters, promotions). Marketing
-- email carries List-Unsubscribe with a one-click URL (RFC 8058).
ALTER TABLE notification_types
    ADD COLUMN category text NOT NULL DEFAULT 'transactional'
        CHECK (category IN ('transactional', 'marketing'));
