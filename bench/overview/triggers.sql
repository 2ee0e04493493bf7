-- The count triggers' cost per statement (EXPLAIN ANALYZE prints "Trigger ...: time="),
-- every statement rolled back: 2,000-row delivery INSERTs (one group commit), 100-row
-- attempt INSERTs and 100-row UPDATEs (one record batch) with and without a status
-- change. The first call on a connection also plans the trigger function; read the later
-- ones for the steady state.
BEGIN;
EXPLAIN (ANALYZE) INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider, idempotency_key, status)
SELECT gen_random_uuid(), (SELECT id FROM notification_events LIMIT 1), 'x' || g, (ARRAY['inapp','line','email'])[1 + g % 3], 'p', 'trig/' || g || '/' || random(), 'pending' FROM generate_series(1, 2000) g;
EXPLAIN (ANALYZE) INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider, idempotency_key, status)
SELECT gen_random_uuid(), (SELECT id FROM notification_events LIMIT 1), 'x' || g, (ARRAY['inapp','line','email'])[1 + g % 3], 'p', 'trig/' || g || '/' || random(), 'pending' FROM generate_series(1, 2000) g;
EXPLAIN (ANALYZE) INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider, idempotency_key, status)
SELECT gen_random_uuid(), (SELECT id FROM notification_events LIMIT 1), 'x' || g, (ARRAY['inapp','line','email'])[1 + g % 3], 'p', 'trig/' || g || '/' || random(), 'pending' FROM generate_series(1, 2000) g;
EXPLAIN (ANALYZE) INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome)
SELECT id, 1000 + (random() * 1000000)::int, now(), 'retry' FROM notification_deliveries WHERE status = 'pending' ORDER BY id DESC LIMIT 100;
EXPLAIN (ANALYZE) INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome)
SELECT id, 1000 + (random() * 1000000)::int, now(), 'retry' FROM notification_deliveries WHERE status = 'pending' ORDER BY id DESC OFFSET 100 LIMIT 100;
EXPLAIN (ANALYZE) UPDATE notification_deliveries SET lease_expires_at = now() + interval '1 minute'
WHERE id IN (SELECT id FROM notification_deliveries WHERE status = 'sending' ORDER BY id DESC LIMIT 100);
EXPLAIN (ANALYZE) UPDATE notification_deliveries SET lease_expires_at = now() + interval '2 minute'
WHERE id IN (SELECT id FROM notification_deliveries WHERE status = 'sending' ORDER BY id DESC OFFSET 100 LIMIT 100);
EXPLAIN (ANALYZE) UPDATE notification_deliveries SET status = 'sent'
WHERE id IN (SELECT id FROM notification_deliveries WHERE status = 'pending' ORDER BY id DESC LIMIT 100);
EXPLAIN (ANALYZE) UPDATE notification_deliveries SET status = 'sent'
WHERE id IN (SELECT id FROM notification_deliveries WHERE status = 'pending' ORDER BY id DESC OFFSET 100 LIMIT 100);
ROLLBACK;
