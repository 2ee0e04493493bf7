-- Core schema of the notification platform. See docs/ARCHITECTURE.md for the
-- delivery state machine these tables implement.

CREATE TABLE notification_types (
    key              text PRIMARY KEY,
    priority         text NOT NULL DEFAULT 'normal' CHECK (priority IN ('low', 'normal', 'high')),
    default_channels text[] NOT NULL CHECK (cardinality(default_channels) > 0),
    critical         boolean NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE recipients (
    user_id          text PRIMARY KEY,
    display_name     text NOT NULL DEFAULT '',
    email            text,
    line_user_id     text,
    locale           text NOT NULL DEFAULT 'th-TH',
    timezone         text NOT NULL DEFAULT 'Asia/Bangkok',
    quiet_hours_json jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Push targets. A token is unique per platform; re-registering moves it to the new
-- user and re-activates it (registered_at changes, which fences late "token gone" answers).
CREATE TABLE notification_endpoints (
    id                uuid PRIMARY KEY,
    user_id           text NOT NULL REFERENCES recipients (user_id),
    platform          text NOT NULL CHECK (platform IN ('fcm', 'apns', 'webpush')),
    token             text NOT NULL,
    subscription_json jsonb,
    status            text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    revoked_reason    text,
    registered_at     timestamptz NOT NULL DEFAULT now(),
    last_seen_at      timestamptz NOT NULL DEFAULT now(),
    revoked_at        timestamptz,
    UNIQUE (platform, token)
);
CREATE INDEX notification_endpoints_user ON notification_endpoints (user_id) WHERE status = 'active';

-- type = '*' is the user's channel-wide switch.
CREATE TABLE notification_preferences (
    user_id          text NOT NULL,
    type             text NOT NULL,
    channel          text NOT NULL CHECK (channel IN ('inapp', 'email', 'push', 'line')),
    enabled          boolean NOT NULL,
    quiet_hours_json jsonb,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, type, channel)
);

CREATE TABLE notification_events (
    id           uuid PRIMARY KEY,
    -- NFC-normalised before it is stored or compared.
    event_key    text NOT NULL UNIQUE,
    type         text NOT NULL REFERENCES notification_types (key),
    actor_id     text NOT NULL DEFAULT '',
    recipients   text[] NOT NULL,
    payload_json jsonb NOT NULL,
    content_json jsonb NOT NULL,
    channels     text[] NOT NULL,
    -- SHA-256 of the canonical request: a replay with other content is reported.
    fingerprint  bytea NOT NULL,
    -- Broadcast to a topic's subscribers instead of listed recipients.
    topic        text,
    -- Fan-out of a topic event: 'none' (listed recipients), 'pending', 'done'.
    fanout_status text NOT NULL DEFAULT 'none' CHECK (fanout_status IN ('none', 'pending', 'done')),
    -- Last subscriber user_id planned (subscribers are fanned out in user_id order).
    fanout_cursor text NOT NULL DEFAULT '',
    -- Recipients planned so far.
    fanout_recipients integer NOT NULL DEFAULT 0,
    -- The replica fanning it out holds it until then.
    fanout_locked_until timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notification_events_fanout ON notification_events (created_at) WHERE fanout_status = 'pending';

-- Recipient x channel pairs that got no delivery, with the reason.
CREATE TABLE delivery_skips (
    event_id uuid NOT NULL REFERENCES notification_events (id),
    user_id  text NOT NULL,
    channel  text NOT NULL,
    reason   text NOT NULL,
    PRIMARY KEY (event_id, user_id, channel)
);

-- Broadcast audiences.
CREATE TABLE topics (
    key        text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE topic_subscriptions (
    topic      text NOT NULL REFERENCES topics (key),
    user_id    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, user_id)
);

CREATE TABLE notification_deliveries (
    id                  uuid PRIMARY KEY,
    event_id            uuid NOT NULL REFERENCES notification_events (id),
    user_id             text NOT NULL,
    channel             text NOT NULL CHECK (channel IN ('inapp', 'email', 'push', 'line')),
    provider            text NOT NULL,
    endpoint_id         uuid REFERENCES notification_endpoints (id),
    -- Contact data at planning time: email address or LINE user id.
    address             text,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'sending', 'sent', 'failed', 'canceled')),
    attempts            integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL DEFAULT 5,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    last_error          text,
    idempotency_key     text NOT NULL,
    -- LINE X-Line-Retry-Key, fixed before the first call and sent on every attempt.
    retry_key           uuid,
    lease_token         uuid,
    lease_expires_at    timestamptz,
    provider_message_id text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    sent_at             timestamptz,
    UNIQUE (channel, idempotency_key),
    CHECK (status <> 'sending' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL))
);
CREATE INDEX notification_deliveries_event ON notification_deliveries (event_id);
CREATE INDEX notification_deliveries_lease ON notification_deliveries (lease_expires_at)
    WHERE status = 'sending';
CREATE INDEX notification_deliveries_due ON notification_deliveries (next_attempt_at)
    WHERE status = 'pending';

-- One row per provider call.
CREATE TABLE delivery_attempts (
    id               bigserial PRIMARY KEY,
    delivery_id      uuid NOT NULL REFERENCES notification_deliveries (id),
    attempt          integer NOT NULL,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL DEFAULT now(),
    outcome          text NOT NULL CHECK (outcome IN ('sent', 'retry', 'failed')),
    provider_status  integer,
    error_code       text,
    -- The provider's raw answer, truncated to 20 KB.
    provider_response text,
    -- What was actually sent (rendered content, as JSON).
    content_json     jsonb,
    -- Which worker instance made the call (NOTIFY_WORKER_ID, default host-pid).
    worker_id        text NOT NULL DEFAULT '',
    UNIQUE (delivery_id, attempt)
);

-- The in-app inbox.
CREATE TABLE notifications (
    id          uuid PRIMARY KEY,
    delivery_id uuid NOT NULL UNIQUE REFERENCES notification_deliveries (id),
    event_id    uuid NOT NULL REFERENCES notification_events (id),
    user_id     text NOT NULL,
    type        text NOT NULL,
    title       text NOT NULL,
    body        text NOT NULL,
    url         text,
    data_json   jsonb NOT NULL DEFAULT '{}',
    status      text NOT NULL DEFAULT 'unread' CHECK (status IN ('unread', 'read', 'archived')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    read_at     timestamptz
);
CREATE INDEX notifications_user_created ON notifications (user_id, created_at DESC);
CREATE INDEX notifications_user_status ON notifications (user_id, status);

-- Work that must reach RabbitMQ. A row is deleted only after the broker confirmed the
-- message; available_at doubles as the relay's claim (pushed forward while publishing).
CREATE TABLE outbox (
    id               bigserial PRIMARY KEY,
    delivery_id      uuid NOT NULL REFERENCES notification_deliveries (id),
    channel          text NOT NULL,
    available_at     timestamptz NOT NULL DEFAULT now(),
    publish_failures integer NOT NULL DEFAULT 0,
    last_error       text
);
CREATE INDEX outbox_available ON outbox (available_at, id);

-- Wake the relay when work is written (it also polls as a fallback).
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('notify_outbox', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Wake the fan-out when a topic event is recorded.
CREATE FUNCTION fanout_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.fanout_status = 'pending' THEN
        PERFORM pg_notify('notify_fanout', '');
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER fanout_notify AFTER INSERT ON notification_events
    FOR EACH ROW EXECUTE FUNCTION fanout_notify();
