-- Erasure of a recipient (issue 20, PDPA section 33): EraseRecipient deletes the user's
-- contact data, endpoints, preferences, subscriptions and inbox, cancels what was not sent
-- yet and replaces the personal data kept in deliveries, attempts, events and webhook
-- messages by '[erased]' (notify_store::erasure; every table's treatment in docs/data.md).

-- The audit of every erasure: who (the caller's key name, or a console staff name), when,
-- and the SHA-256 of the user id, nothing else about the person. It doubles as the marker
-- the planner reads: an event naming a user id whose hash is here, and who has no
-- recipients row (not registered again), gets no delivery at all, in-app included.
CREATE TABLE recipient_erasures (
    id                  bigserial PRIMARY KEY,
    user_sha256         bytea NOT NULL CHECK (length(user_sha256) = 32),
    erased_by           text NOT NULL,
    erased_at           timestamptz NOT NULL DEFAULT now(),
    -- Set when every batch of the redaction committed; NULL = interrupted (erasing the
    -- same user again finishes it).
    completed_at        timestamptz,
    -- What it did, counted.
    deliveries_canceled integer NOT NULL DEFAULT 0,
    deliveries_redacted integer NOT NULL DEFAULT 0,
    attempts_redacted   integer NOT NULL DEFAULT 0,
    inbox_deleted       integer NOT NULL DEFAULT 0,
    endpoints_deleted   integer NOT NULL DEFAULT 0
);
CREATE INDEX recipient_erasures_user ON recipient_erasures (user_sha256);

-- `t` with every needle (at least 3 characters) replaced by '[erased]'. Longest needles
-- first, so a name inside an email address does not leave the rest of the address.
CREATE FUNCTION erase_text(t text, needles text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n text;
BEGIN
    IF t IS NULL THEN
        RETURN NULL;
    END IF;
    FOR n IN SELECT x FROM unnest(needles) x WHERE length(x) >= 3 ORDER BY length(x) DESC LOOP
        t := replace(t, n, '[erased]');
    END LOOP;
    RETURN t;
END;
$$;

-- `j` with every needle replaced by '[erased]' wherever it appears in its text (keys and
-- values), compared in JSON's own escaping, so the result is still valid JSON.
CREATE FUNCTION erase_json(j jsonb, needles text[]) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN j IS NULL THEN NULL ELSE erase_text(j::text, ARRAY(
        SELECT substr(to_jsonb(x)::text, 2, length(to_jsonb(x)::text) - 2)
        FROM unnest(needles) x))::jsonb END
$$;

-- A token as exports and GetRecipient show it: every character but the first 4 and the
-- last 4 replaced by '*' (all of them for a token of 8 characters or fewer).
CREATE FUNCTION mask_token(token text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(token) <= 8 THEN repeat('*', length(token))
                ELSE left(token, 4) || repeat('*', length(token) - 8) || right(token, 4) END
$$;

-- Erasure deletes the user's push endpoints. With this foreign key, each deleted endpoint
-- made Postgres scan every delivery for a reference (endpoint_id has no index) while the
-- erasure holds the planning lock, and an endpoint that moved to the erased user from an
-- earlier owner would be undeletable. A delivery's endpoint is read only by the claim's
-- LEFT JOIN, which also requires the endpoint's current user to be the delivery's: a
-- delivery whose endpoint is gone is skipped at its due time like one whose token moved
-- to another user (no_push_endpoint). Deliveries are written only by planning, which reads
-- the active endpoints in its transaction (as for the keys dropped in migration 028).
ALTER TABLE notification_deliveries DROP CONSTRAINT notification_deliveries_endpoint_id_fkey;
