-- The live inbox stream must be exact under concurrent writers. A global sequence taken at
-- insert does not give that: two transactions take seq 5 and 6, the one with 6 commits
-- first, a stream reads it and moves past 5, and 5 is never sent.
--
-- Now each user has one counter row (inbox_user_seq). Every insert or update of a
-- notification takes the user's next seq from that row, and the row stays locked until
-- the writing transaction ends, so a second writer for the same user waits for the first
-- to commit (or roll back) before it gets a higher number: per user, seq order is commit
-- order, and a stream that saw seq N has seen every committed change below N. Writers of
-- different users never wait for each other. The stream is per user, so a per-user order
-- is all it needs.
--
-- Lock order, to avoid deadlocks: a writer locks counter rows before notification rows
-- (an UPDATE locks its rows before its triggers run, so set_status and read_all lock the
-- counter first, explicitly), and a statement writing several users' rows takes them in
-- user_id order.
CREATE TABLE inbox_user_seq (
    user_id text PRIMARY KEY,
    seq     bigint NOT NULL
);

ALTER TABLE notifications ALTER COLUMN seq DROP DEFAULT;
-- Continue each user's feed after the highest seq it has, so a client resuming with a
-- Last-Event-ID from before this migration misses nothing and sees nothing twice.
INSERT INTO inbox_user_seq (user_id, seq)
SELECT user_id, max(seq) FROM notifications GROUP BY user_id;
DROP SEQUENCE inbox_seq;

CREATE OR REPLACE FUNCTION notifications_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE inbox_user_seq SET seq = seq + 1 WHERE user_id = NEW.user_id
        RETURNING seq INTO NEW.seq;
    IF NOT FOUND THEN
        INSERT INTO inbox_user_seq AS s (user_id, seq) VALUES (NEW.user_id, 1)
            ON CONFLICT (user_id) DO UPDATE SET seq = s.seq + 1
            RETURNING s.seq INTO NEW.seq;
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER notifications_touch ON notifications;
CREATE TRIGGER notifications_touch BEFORE INSERT OR UPDATE ON notifications
    FOR EACH ROW EXECUTE FUNCTION notifications_touch();
