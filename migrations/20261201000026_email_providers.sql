-- Email provider failover (issue 18): each provider's circuit breaker state, written by the
-- email workers on every transition so that the console (in http-api) can show it.
CREATE TABLE email_provider_states (
    provider   text PRIMARY KEY,
    -- closed, half_open or open
    state      text NOT NULL CHECK (state IN ('closed', 'half_open', 'open')),
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- Bounces and complaints (issue 18): addresses and users whose email is suppressed. A
-- complaint suppresses marketing email for the user (category 'marketing'); soft bounces
-- over NOTIFY_SOFT_BOUNCE_LIMIT in 30 days suppress every category for the address
-- ('all'). Hard bounces mark recipients.email_undeliverable_at, as the SMTP 550 path does.
CREATE TABLE email_suppressions (
    id         bigserial PRIMARY KEY,
    user_id    text,
    address    text,
    category   text NOT NULL CHECK (category IN ('marketing', 'all')),
    -- complaint, soft_bounces or console
    reason     text NOT NULL,
    -- the provider (ses) or the staff member who added it in the console
    source     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (user_id IS NOT NULL OR address IS NOT NULL)
);
CREATE UNIQUE INDEX email_suppressions_one
    ON email_suppressions (coalesce(user_id, ''), coalesce(lower(address), ''), category);
CREATE INDEX email_suppressions_user ON email_suppressions (user_id) WHERE user_id IS NOT NULL;
CREATE INDEX email_suppressions_address ON email_suppressions (lower(address)) WHERE address IS NOT NULL;

-- Every bounce or complaint notification taken (once per SNS MessageId, so a redelivery
-- changes nothing); soft bounces are counted from here.
CREATE TABLE email_feedback (
    message_id  text PRIMARY KEY,
    provider    text NOT NULL,
    -- bounce_permanent, bounce_transient or complaint
    kind        text NOT NULL,
    address     text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX email_feedback_soft ON email_feedback (lower(address), received_at)
    WHERE kind = 'bounce_transient';

-- Which email provider answered an attempt (`host:port` of a relay, `ses:<host>`), as
-- worker-email records it in the attempt's content. Generated, so no writer changes; it
-- rewrites delivery_attempts once when applied.
ALTER TABLE delivery_attempts
    ADD COLUMN provider_name text GENERATED ALWAYS AS (content_json->>'provider') STORED;
