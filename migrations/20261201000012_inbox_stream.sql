-- Live inbox updates: every insert or update of a notification takes the next value of
-- one sequence (seq) and announces "<user_id> <seq>" on the channel inbox, so the HTTP
-- service's Server-Sent Events resume exactly after the last seq a client saw
-- (Last-Event-ID), on any replica.
CREATE SEQUENCE inbox_seq;
ALTER TABLE notifications ADD COLUMN seq bigint NOT NULL DEFAULT nextval('inbox_seq');
CREATE INDEX notifications_user_seq ON notifications (user_id, seq);
CREATE INDEX notifications_user_created_id ON notifications (user_id, created_at DESC, id DESC);

CREATE FUNCTION notifications_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        NEW.seq := nextval('inbox_seq');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER notifications_touch BEFORE UPDATE ON notifications
    FOR EACH ROW EXECUTE FUNCTION notifications_touch();

CREATE FUNCTION notifications_announce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('inbox', NEW.user_id || ' ' || NEW.seq);
    RETURN NULL;
END $$;
CREATE TRIGGER notifications_announce AFTER INSERT OR UPDATE ON notifications
    FOR EACH ROW EXECUTE FUNCTION notifications_announce();
