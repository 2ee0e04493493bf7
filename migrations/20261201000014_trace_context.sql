-- W3C traceparent of the request that created an event. The relay reads it (through the
-- delivery) for every outbox row it publishes, so first sends, retries and recoveries of
-- the event's deliveries all continue the caller's trace.
ALTER TABLE notification_events ADD COLUMN trace_context text;
