-- The overview's statements as they were before migration 029 (uuid_v7_floor in SQL).
\timing on
EXPLAIN (ANALYZE, BUFFERS) SELECT channel, status, count(*) FILTER (WHERE id >= (lpad(to_hex((extract(epoch FROM now() - interval '1 hour') * 1000)::bigint), 12, '0') || '70008000000000000000')::uuid) AS hour, count(*) AS day
 FROM notification_deliveries WHERE id >= (lpad(to_hex((extract(epoch FROM now() - interval '1 day') * 1000)::bigint), 12, '0') || '70008000000000000000')::uuid
 GROUP BY channel, status;
EXPLAIN (ANALYZE, BUFFERS) SELECT channel, extract(epoch FROM now() - min(next_attempt_at))::bigint AS age
 FROM notification_deliveries WHERE status = 'pending' AND next_attempt_at <= now() GROUP BY channel;
EXPLAIN (ANALYZE, BUFFERS) SELECT d.channel, avg((a.outcome = 'retry')::int)::float8 AS rate
 FROM notification_deliveries d JOIN delivery_attempts a ON a.delivery_id = d.id
 WHERE d.id >= (lpad(to_hex((extract(epoch FROM now() - interval '1 hour') * 1000)::bigint), 12, '0') || '70008000000000000000')::uuid GROUP BY d.channel;
EXPLAIN (ANALYZE, BUFFERS) SELECT extract(epoch FROM now() - min(available_at))::bigint FROM outbox WHERE available_at <= now();
