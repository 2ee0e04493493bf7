-- The console overview counts deliveries per channel and status for the last hour and
-- day, and attempts per outcome for the last hour (the retry rate). Counting the rows
-- themselves scanned every delivery of the day (2.7 s at 1.4 M); these tables keep the
-- counts as the rows change, so the overview sums at most a day of minutes.
--
-- Minutes, not hours: "the last hour" stays the last 60 minutes (to the minute) instead
-- of up to two clock hours. A day is at most 1,441 minutes x 4 channels x 9 states.
--
-- `kind` 'status': deliveries by their creation minute, channel and current status.
-- `kind` 'attempt': attempts by the minute they finished, the channel of their delivery
-- and their outcome. A minute is `date_bin('1 minute', t, '2000-01-01 00:00:00+00')`: the
-- same in every session time zone, and half the cost of a date_trunc with a zone.
CREATE TABLE delivery_counts (
    minute  timestamptz NOT NULL,
    channel text NOT NULL,
    kind    text NOT NULL CHECK (kind IN ('status', 'attempt')),
    state   text NOT NULL,
    n       bigint NOT NULL,
    PRIMARY KEY (minute, channel, kind, state)
);

-- What changed since the last rollup, appended by the statement triggers below in the
-- transaction that made the change, so the counts commit (or roll back) with it. Append
-- only: a shared counter row updated by every writer would hold its row lock across each
-- commit's WAL flush and serialise every ingest writer and worker; appended rows lock
-- nothing another writer needs. No index, so an append touches one heap page. The
-- rollup (notify_store::console::roll_up_counts, a task in every ingest replica) deletes
-- them and adds them into delivery_counts; the overview reads both, so it is exact
-- between rollups too.
CREATE TABLE delivery_count_deltas (
    minute  timestamptz NOT NULL,
    channel text NOT NULL,
    kind    text NOT NULL,
    state   text NOT NULL,
    n       bigint NOT NULL
);

-- One delta row per (minute, channel, status) of the statement's inserted deliveries,
-- not one per delivery: a group commit of 2,000 deliveries appends a handful. Inserts
-- that ON CONFLICT DO NOTHING skipped are not in the transition table.
CREATE FUNCTION delivery_counts_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO delivery_count_deltas (minute, channel, kind, state, n)
    SELECT date_bin('1 minute', created_at, timestamptz '2000-01-01 00:00:00+00'), channel, 'status', status, count(*)
    FROM inserted GROUP BY 1, 2, 4;
    RETURN NULL;
END $$;

-- +1 for the new (minute, channel, status) and -1 for the old one, for the rows whose
-- status changed (or, never done today, whose channel or creation time did). A
-- transition table cannot go with an `UPDATE OF status` column list, so this runs after
-- every UPDATE statement; one that changes no status (a lease extension) joins its rows
-- and appends nothing.
CREATE FUNCTION delivery_counts_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO delivery_count_deltas (minute, channel, kind, state, n)
    SELECT c.minute, c.channel, 'status', c.state, sum(c.n)
    FROM old_rows o JOIN new_rows d ON d.id = o.id
    CROSS JOIN LATERAL (VALUES
        (date_bin('1 minute', d.created_at, timestamptz '2000-01-01 00:00:00+00'), d.channel, d.status, 1),
        (date_bin('1 minute', o.created_at, timestamptz '2000-01-01 00:00:00+00'), o.channel, o.status, -1)
    ) AS c (minute, channel, state, n)
    WHERE d.status <> o.status OR d.channel <> o.channel OR d.created_at <> o.created_at
    GROUP BY 1, 2, 4
    HAVING sum(c.n) <> 0;
    RETURN NULL;
END $$;

-- Deliveries are never deleted today; if retention ever does, the counts stay true.
CREATE FUNCTION delivery_counts_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO delivery_count_deltas (minute, channel, kind, state, n)
    SELECT date_bin('1 minute', created_at, timestamptz '2000-01-01 00:00:00+00'), channel, 'status', status, -count(*)
    FROM deleted GROUP BY 1, 2, 4;
    RETURN NULL;
END $$;

-- Attempts are only ever inserted (a record batch of up to 100 appends a few rows); the
-- channel comes from the delivery, found by its primary key.
CREATE FUNCTION attempt_counts_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO delivery_count_deltas (minute, channel, kind, state, n)
    SELECT date_bin('1 minute', a.finished_at, timestamptz '2000-01-01 00:00:00+00'), d.channel, 'attempt', a.outcome, count(*)
    FROM inserted a JOIN notification_deliveries d ON d.id = a.delivery_id
    GROUP BY 1, 2, 4;
    RETURN NULL;
END $$;

-- The triggers take their table's SHARE ROW EXCLUSIVE lock until this migration commits,
-- so a write committed before it is in the backfill below and one after it fires them:
-- nothing is counted twice or missed.
CREATE TRIGGER delivery_counts_insert AFTER INSERT ON notification_deliveries
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION delivery_counts_on_insert();
CREATE TRIGGER delivery_counts_update AFTER UPDATE ON notification_deliveries
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION delivery_counts_on_update();
CREATE TRIGGER delivery_counts_delete AFTER DELETE ON notification_deliveries
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION delivery_counts_on_delete();
CREATE TRIGGER attempt_counts_insert AFTER INSERT ON delivery_attempts
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION attempt_counts_on_insert();

-- Backfill the two days the rollup keeps. Deliveries by their UUIDv7 id range (the
-- primary key; created_at has no index), the smallest id of the millisecond two days ago.
INSERT INTO delivery_counts (minute, channel, kind, state, n)
SELECT date_bin('1 minute', created_at, timestamptz '2000-01-01 00:00:00+00'), channel, 'status', status, count(*)
FROM notification_deliveries
WHERE id >= (lpad(to_hex((extract(epoch FROM now() - interval '2 days') * 1000)::bigint), 12, '0')
             || '70008000000000000000')::uuid
  AND created_at >= now() - interval '2 days'
GROUP BY 1, 2, 4;

INSERT INTO delivery_counts (minute, channel, kind, state, n)
SELECT date_bin('1 minute', a.finished_at, timestamptz '2000-01-01 00:00:00+00'), d.channel, 'attempt', a.outcome, count(*)
FROM delivery_attempts a JOIN notification_deliveries d ON d.id = a.delivery_id
WHERE a.finished_at >= now() - interval '2 days'
GROUP BY 1, 2, 4;
