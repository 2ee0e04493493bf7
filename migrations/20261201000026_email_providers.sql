-- Email provider failover (issue 18): each provider's circuit breaker state, written by the
-- email workers on every transition so that the console (in http-api) can show it.
CREATE TABLE email_provider_states (
    provider   text PRIMARY KEY,
    -- closed, half_open or open
    state      text NOT NULL CHECK (state IN ('closed', 'half_open', 'open')),
    changed_at timestamptz NOT NULL DEFAULT now()
);
