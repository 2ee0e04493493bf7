-- The outbox is a transient queue of pointers. Its foreign key to notification_deliveries
-- cost an index probe and a row lock on the delivery for every outbox row written (three
-- per event at ingest, 100,000 in a large fan-out). Outbox rows are only ever written in
-- the transaction that writes or updates their delivery, and a message naming a missing
-- delivery is dead-lettered by the worker, so integrity does not depend on it.
ALTER TABLE outbox DROP CONSTRAINT outbox_delivery_id_fkey;
