-- Cheaper writes per delivery (issue 19's cost table: each foreign key below cost an index
-- probe and a KEY SHARE row lock on the parent for every row written, 3.5 statements per
-- delivery end to end, and the lock dirties the parent's page).
--
-- Deliveries are written only in the transaction that inserts their event or moves its
-- fan-out checkpoint (the event row is there, and never deleted); attempt and inbox rows
-- only by the worker holding the delivery's lease (the delivery is there). Retention and
-- erasure delete children before parents. So integrity does not depend on these keys, as it
-- did not for the outbox's (20261201000001). The cancel fence of a fan-out page is its
-- explicit FOR SHARE on the event row, which stays.
ALTER TABLE notification_deliveries DROP CONSTRAINT notification_deliveries_event_id_fkey;
ALTER TABLE delivery_attempts DROP CONSTRAINT delivery_attempts_delivery_id_fkey;
ALTER TABLE notifications DROP CONSTRAINT notifications_delivery_id_fkey;
ALTER TABLE notifications DROP CONSTRAINT notifications_event_id_fkey;

-- The relay is woken only for rows due within 10 seconds. The event writer and the fan-out
-- hand their new rows to their own relay after the commit and write them held for 30 s
-- (see ingest::relay), so announcing them would wake every relay for nothing once per
-- commit. Rows due later are found by the relay's poll (NOTIFY_RELAY_POLL, at most 10 s),
-- which sleeps until the earliest due row, so none is late.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted WHERE available_at <= now() + interval '10 seconds') THEN
        PERFORM pg_notify('notify_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;

-- (user_id, created_at DESC) is the prefix of notifications_user_created_id (user_id,
-- created_at DESC, id DESC), which serves every query it served: one index write fewer per
-- inbox row.
DROP INDEX notifications_user_created;
