-- Callers of the gRPC API: one row per calling service. The key itself is shown once at
-- creation and stored only as its SHA-256 (keys are 256-bit random, so a plain hash is
-- enough). A client certificate whose subject CN equals `name` is the same caller.
CREATE TABLE api_keys (
    id                uuid PRIMARY KEY,
    name              text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    key_hash          bytea NOT NULL UNIQUE,
    key_prefix        text NOT NULL,
    -- Notification types the caller may send: exact keys or prefixes ending in `*`.
    send_types        text[] NOT NULL DEFAULT '{}',
    -- May manage recipients, endpoints, preferences, topics and types.
    can_manage        boolean NOT NULL DEFAULT false,
    events_per_second integer NOT NULL CHECK (events_per_second BETWEEN 1 AND 1000000),
    max_recipients    integer NOT NULL CHECK (max_recipients BETWEEN 1 AND 1000),
    created_at        timestamptz NOT NULL DEFAULT now(),
    revoked_at        timestamptz
);

-- Every ingest replica LISTENs and reloads its key cache, so a revocation takes effect
-- everywhere within milliseconds.
CREATE FUNCTION api_keys_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('api_keys', '');
    RETURN NULL;
END $$;
CREATE TRIGGER api_keys_changed AFTER INSERT OR UPDATE OR DELETE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION api_keys_notify();

-- Who sent each event (the API key's or client certificate's name).
ALTER TABLE notification_events ADD COLUMN caller text;

-- Per type: what to do with a payload or text that carries a national id, a card number
-- or a secret: refuse the event, or store a masked copy.
ALTER TABLE notification_types
    ADD COLUMN sensitive_data text NOT NULL DEFAULT 'reject'
        CHECK (sensitive_data IN ('reject', 'mask'));
