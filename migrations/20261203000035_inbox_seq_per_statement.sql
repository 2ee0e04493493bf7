-- An inbox batch costs one counter statement and one notification instead of two trigger
-- statements per row (issue 19's cost table: `UPDATE inbox_user_seq` and `pg_notify` once
-- for every in-app row, half a statement each per delivery end to end).
--
-- The feed order of 20261201000019 is unchanged: each row's seq still comes from its
-- user's counter row, locked until the writing transaction ends and taken before the
-- notification rows, in user_id order. What moves is who takes it: the in-app worker's
-- batch insert (notify_store::deliveries::insert_inbox_notifications) bumps each user's
-- counter once by the number of its rows and numbers the rows itself; the row trigger
-- keeps a seq an INSERT brings and gives one to every other insert and to every update,
-- as before. A batch row skipped as already written leaves an unused seq: a gap, which a
-- stream reading `seq > last` passes over.
CREATE OR REPLACE FUNCTION notifications_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' AND NEW.seq IS NOT NULL THEN
        RETURN NEW;
    END IF;
    UPDATE inbox_user_seq SET seq = seq + 1 WHERE user_id = NEW.user_id
        RETURNING seq INTO NEW.seq;
    IF NOT FOUND THEN
        INSERT INTO inbox_user_seq AS s (user_id, seq) VALUES (NEW.user_id, 1)
            ON CONFLICT (user_id) DO UPDATE SET seq = s.seq + 1
            RETURNING s.seq INTO NEW.seq;
    END IF;
    RETURN NEW;
END $$;

-- One `inbox` notification per statement (more when it would pass PostgreSQL's 8,000-byte
-- payload limit): a line "<user_id> <highest seq>" per user the statement changed. The
-- HTTP service's listener wakes each named user's streams; user ids hold no control
-- characters, so a newline separates them.
DROP TRIGGER notifications_announce ON notifications;
CREATE OR REPLACE FUNCTION notifications_announce() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    line text;
    payload text := '';
BEGIN
    FOR line IN
        SELECT user_id || ' ' || max(seq) FROM changed GROUP BY user_id ORDER BY user_id
    LOOP
        IF payload <> '' AND octet_length(payload) + octet_length(line) >= 7999 THEN
            PERFORM pg_notify('inbox', payload);
            payload := '';
        END IF;
        payload := CASE WHEN payload = '' THEN line ELSE payload || E'\n' || line END;
    END LOOP;
    IF payload <> '' THEN
        PERFORM pg_notify('inbox', payload);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER notifications_announce_insert AFTER INSERT ON notifications
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION notifications_announce();
CREATE TRIGGER notifications_announce_update AFTER UPDATE ON notifications
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION notifications_announce();
