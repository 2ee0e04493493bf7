-- Rich content (issue 16): templates keep their rich fields (url, image_url, thread,
-- actions, badge, overrides with the LINE messages) as one JSON object; inbox rows keep
-- the image and the actions they show and which action was clicked; every click or tap
-- on a delivery (inbox action, LINE postback, push or email link) is recorded once.
ALTER TABLE notification_templates ADD COLUMN rich jsonb NOT NULL DEFAULT '{}';

ALTER TABLE notifications
    ADD COLUMN image_url text,
    ADD COLUMN actions jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN clicked_action text,
    ADD COLUMN clicked_at timestamptz;

CREATE TABLE delivery_clicks (
    id          bigserial PRIMARY KEY,
    delivery_id uuid NOT NULL REFERENCES notification_deliveries (id),
    -- Who clicked: a LINE multicast delivery covers up to 500 users.
    user_id     text NOT NULL,
    -- The action's id; '' for a tap on the notification itself.
    action_id   text NOT NULL,
    source      text NOT NULL CHECK (source IN ('inapp', 'line', 'push', 'email')),
    -- Makes a redelivered callback harmless (LINE webhookEventId, the inbox notification
    -- id and action); NULL = not deduplicated.
    dedup_key   text UNIQUE,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX delivery_clicks_delivery ON delivery_clicks (delivery_id);
