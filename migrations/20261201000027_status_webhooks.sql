-- Status webhooks to callers (issue 18), following the Standard Webhooks specification
-- (https://www.standardwebhooks.com, spec/standard-webhooks.md): a caller registers
-- endpoints; every state change of one of its deliveries writes one message per matching
-- endpoint in the same transaction as the change, and worker-webhook POSTs it, signed.

-- Counts the state changes of a delivery: bumped by every update that changes its status
-- (and by a retry's or a deferral's reschedule), carried in each webhook payload so a
-- receiver can drop a stale message (ordering is not promised).
ALTER TABLE notification_deliveries ADD COLUMN state_version integer NOT NULL DEFAULT 0;

CREATE TABLE webhook_endpoints (
    id                  uuid PRIMARY KEY,
    -- The caller (api_keys.name, or `anonymous`) whose deliveries it receives.
    caller              text NOT NULL,
    -- https://host/path; plain http only for NOTIFY_DEV_HTTP_HOSTS (notify_core::links).
    url                 text NOT NULL,
    -- Event types it receives; empty = all.
    event_types         text[] NOT NULL DEFAULT '{}',
    -- `whsec_` + base64 of the key. Shown once, at creation or rotation.
    secret              text NOT NULL,
    -- During a rotation the old secret keeps signing too (two signatures) until then.
    previous_secret     text,
    previous_expires_at timestamptz,
    enabled             boolean NOT NULL DEFAULT true,
    -- Why it was disabled: by its caller, or `failing since ...` by worker-webhook.
    disabled_reason     text,
    -- Start of the current run of failed attempts (NULL after a success).
    failing_since       timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
-- The hot-path probe of enqueue: an empty index when no caller has an enabled endpoint.
CREATE INDEX webhook_endpoints_caller ON webhook_endpoints (caller) WHERE enabled;

CREATE TABLE webhook_messages (
    -- Sent as `webhook-id` (msg_<uuid without dashes>); the same id on every retry.
    id               uuid PRIMARY KEY,
    endpoint_id      uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    event_type       text NOT NULL CHECK (event_type IN (
                         'delivery.sent', 'delivery.failed', 'delivery.deferred',
                         'delivery.cancelled', 'delivery.skipped',
                         'notification.read', 'notification.clicked')),
    -- The body, built when the change committed.
    payload          jsonb NOT NULL,
    delivery_id      uuid NOT NULL,
    state_version    integer NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'sending', 'sent', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    lease_token      uuid,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CHECK (status <> 'sending' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL))
);
CREATE INDEX webhook_messages_endpoint ON webhook_messages (endpoint_id, created_at);
CREATE INDEX webhook_messages_delivery ON webhook_messages (delivery_id);
CREATE INDEX webhook_messages_lease ON webhook_messages (lease_expires_at) WHERE status = 'sending';
-- The republisher of pending messages whose queue message was lost after the confirm.
CREATE INDEX webhook_messages_due ON webhook_messages (next_attempt_at) WHERE status = 'pending';

-- One row per POST.
CREATE TABLE webhook_attempts (
    id               bigserial PRIMARY KEY,
    message_id       uuid NOT NULL REFERENCES webhook_messages (id) ON DELETE CASCADE,
    attempt          integer NOT NULL,
    -- HTTP status of the answer; NULL when none came (timeout, refused, policy).
    status_code      integer,
    latency_ms       integer NOT NULL,
    error            text,
    -- The start of the answer's body, at most 1 KiB.
    response_excerpt text,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (message_id, attempt)
);

-- A webhook message travels through the existing outbox (channel `webhook`, delivery_id =
-- the message id), so the relay publishes it to deliveries.webhook unchanged. The outbox
-- trigger now wakes the relay only when a statement inserted rows: enqueue's INSERT runs
-- in every recording transaction and usually inserts none.
DROP TRIGGER outbox_notify ON outbox;
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted) THEN
        PERFORM pg_notify('notify_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
