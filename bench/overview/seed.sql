-- 150,000 events and 1.5 M deliveries created over the last 24 hours (UUIDv7 ids that
-- match created_at), 4 channels, mostly sent; one attempt per delivery that was called.
\timing on
INSERT INTO notification_types (key, default_channels) VALUES ('bench_ov', '{inapp,line,email,push}') ON CONFLICT DO NOTHING;
CREATE TEMP TABLE ts AS SELECT g, now() - (g * interval '576 milliseconds') AS ts FROM generate_series(1, 150000) g;
INSERT INTO notification_events (id, event_key, type, recipients, payload_json, content_json, channels, fingerprint, created_at)
SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3)
        || '8' || substr(md5(random()::text), 1, 15))::uuid,
       'ov:' || g, 'bench_ov', ARRAY['u' || g], '{}', '{"title": "t"}', ARRAY['inapp','line'], '\x00', ts
FROM ts;
INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider, idempotency_key, status, attempts,
                                     lease_token, lease_expires_at, next_attempt_at, created_at)
SELECT (lpad(to_hex((extract(epoch FROM e.created_at) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3)
        || '8' || substr(md5(random()::text), 1, 15))::uuid,
       e.id, 'u' || k, (ARRAY['inapp','line','email','push'])[1 + k % 4], 'p', e.id || '/' || k,
       CASE WHEN n % 97 = 0 AND k = 0 THEN 'pending' WHEN n % 50 = 0 AND k = 1 THEN 'failed'
            WHEN n % 211 = 0 AND k = 2 THEN 'sending' WHEN n % 71 = 0 AND k = 3 THEN 'canceled'
            WHEN n % 89 = 0 AND k = 4 THEN 'skipped' ELSE 'sent' END,
       1, gen_random_uuid(), now() + interval '1 hour', e.created_at + interval '1 second', e.created_at
FROM (SELECT id, created_at, row_number() OVER () AS n FROM notification_events WHERE type = 'bench_ov') e,
     generate_series(0, 9) k;
INSERT INTO delivery_attempts (delivery_id, attempt, started_at, finished_at, outcome)
SELECT id, 1, created_at, created_at + interval '1 second',
       CASE status WHEN 'failed' THEN 'failed' WHEN 'pending' THEN 'retry' ELSE 'sent' END
FROM notification_deliveries WHERE status IN ('sent', 'failed', 'pending');
VACUUM ANALYZE notification_events;
VACUUM ANALYZE notification_deliveries;
VACUUM ANALYZE delivery_attempts;
SELECT count(*) FROM notification_deliveries;
SELECT count(*) FROM delivery_attempts;
