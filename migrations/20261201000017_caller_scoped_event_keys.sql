-- Event keys are scoped to the caller that sent them: two callers may use the same key for
-- two events, and neither learns anything about the other's (issue 14, item 7).
--
-- Events from before callers were recorded (caller NULL) were sent when every call was
-- unauthenticated; they belong to the shared caller `anonymous`, the name every call has
-- with NOTIFY_GRPC_AUTH=off. Every other event keeps its recorded caller, so a replay by
-- its original caller is still a duplicate.
-- Rows written without a caller (seeding tools such as `notifyctl bench`) get it too.
UPDATE notification_events SET caller = 'anonymous' WHERE caller IS NULL;
ALTER TABLE notification_events
    ALTER COLUMN caller SET DEFAULT 'anonymous',
    ALTER COLUMN caller SET NOT NULL;

-- One event per (NFC-normalised key, caller). The key leads, so the same index serves a
-- caller's own lookup by key and a manager's lookup across callers.
ALTER TABLE notification_events DROP CONSTRAINT notification_events_event_key_key;
CREATE UNIQUE INDEX notification_events_key_caller ON notification_events (event_key, caller);

-- No key may take the shared caller's name, or it would share that caller's keys (and
-- read its events). NOT VALID: a key already so named keeps working until it is replaced.
ALTER TABLE api_keys ADD CONSTRAINT api_keys_name_is_not_the_shared_caller
    CHECK (name <> 'anonymous') NOT VALID;
