-- The overview's statements after migration 029 (as notify_store::console::overview runs them).
\timing on
EXPLAIN (ANALYZE, BUFFERS) SELECT channel, kind, state,
        coalesce(sum(n) FILTER (WHERE minute >= date_trunc('minute', now() - interval '1 hour', 'UTC')), 0)::bigint AS hour,
        sum(n)::bigint AS day
 FROM (SELECT minute, channel, kind, state, n FROM delivery_counts
       WHERE minute >= date_trunc('minute', now() - interval '1 day', 'UTC')
       UNION ALL
       SELECT minute, channel, kind, state, n FROM delivery_count_deltas
       WHERE minute >= date_trunc('minute', now() - interval '1 day', 'UTC')) c
 GROUP BY channel, kind, state;
EXPLAIN (ANALYZE, BUFFERS) SELECT channel, extract(epoch FROM now() - min(next_attempt_at))::bigint AS age
 FROM notification_deliveries WHERE status = 'pending' AND next_attempt_at <= now() GROUP BY channel;
EXPLAIN (ANALYZE, BUFFERS) SELECT extract(epoch FROM now() - min(available_at))::bigint FROM outbox WHERE available_at <= now();
