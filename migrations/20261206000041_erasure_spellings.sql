-- Erasure (issue 44, item 5): the needles are now matched in Rust in every spelling
-- (NFC or NFD, any case, JSON-escaped; notify_core::spellings), which these SQL functions
-- could not do (replace() is exact, lower() follows the database's locale). Nothing calls
-- them any more.
DROP FUNCTION IF EXISTS erase_json(jsonb, text[]);
DROP FUNCTION IF EXISTS erase_text(text, text[]);

-- The erasure deletes the user's skip rows twice under its exclusive lock (with the
-- recipient, and again for the events planned while it ran); without this index each was
-- a scan of every skip while no event could be planned. One entry per skip row written.
-- On a large production table build it first with CREATE INDEX CONCURRENTLY (outside a
-- transaction) under this name; IF NOT EXISTS then makes this a no-op for it.
CREATE INDEX IF NOT EXISTS delivery_skips_user ON delivery_skips (user_id);
