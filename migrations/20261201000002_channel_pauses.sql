-- A channel paused until a moment, e.g. LINE after its monthly message quota ran out:
-- deliveries of the channel wait in Postgres (not in the broker) until then, without
-- spending attempts. An operator may end a pause early by deleting its row.
CREATE TABLE channel_pauses (
    channel      text PRIMARY KEY CHECK (channel IN ('inapp', 'email', 'push', 'line')),
    paused_until timestamptz NOT NULL,
    reason       text NOT NULL,
    paused_at    timestamptz NOT NULL DEFAULT now()
);
