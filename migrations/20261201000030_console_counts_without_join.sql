-- The update trigger of 20261201000029 joined the statement's old and new rows by id.
-- A plan chosen for the small statements of the hot path (a nested loop over the two
-- transition tables) made it quadratic in the rows one statement updates: a cancel of
-- 10,000 pending deliveries spent its whole 30 s deadline in the trigger. Each updated
-- row is once in old_rows and once in new_rows, so counting the new rows +1 and the old
-- ones -1 per (minute, channel, status) and keeping the non-zero sums gives the same
-- deltas without a join, in time linear in the rows.
CREATE OR REPLACE FUNCTION delivery_counts_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO delivery_count_deltas (minute, channel, kind, state, n)
    SELECT minute, channel, 'status', state, sum(n)
    FROM (SELECT date_bin('1 minute', created_at, timestamptz '2000-01-01 00:00:00+00') AS minute,
                 channel, status AS state, count(*) AS n
          FROM new_rows GROUP BY 1, 2, 3
          UNION ALL
          SELECT date_bin('1 minute', created_at, timestamptz '2000-01-01 00:00:00+00'),
                 channel, status, -count(*)
          FROM old_rows GROUP BY 1, 2, 3) AS c
    GROUP BY 1, 2, 4
    HAVING sum(n) <> 0;
    RETURN NULL;
END $$;
