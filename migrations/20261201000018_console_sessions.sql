-- Staff console sessions, kept server-side so that signing out revokes them on every
-- replica and across restarts. Only the SHA-256 of the cookie's random id is stored, so
-- a copy of this table does not sign anyone in.
CREATE TABLE console_sessions (
    id_hash    bytea PRIMARY KEY,
    staff      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_expires_at ON console_sessions (expires_at);

-- Failed console sign-ins, for throttling per staff name and per client address. The
-- name is stored as the SHA-256 hex of what was typed (`user:<hex>`), the address as
-- `addr:<ip>`; rows older than the window are deleted as new failures come in.
CREATE TABLE console_sign_in_failures (
    key text NOT NULL,
    at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX console_sign_in_failures_key_at ON console_sign_in_failures (key, at);
