-- One statement fewer per event (issue 19's cost table: the foreign key from an event to
-- its type cost an index probe and a KEY SHARE lock on the type's row for every event, a
-- second statement beside the event's insert, and with many concurrent writers of one
-- type a multixact on that one row).
--
-- The event writer reads the batch's types once per group commit
-- (catalog::get_types) and answers an unknown type NOT_FOUND before it writes; types are
-- never deleted (there is no API for it, retention and erasure leave them). So an event's
-- type always exists without the key, as the deliveries' events did in 20261201000028.
ALTER TABLE notification_events DROP CONSTRAINT notification_events_type_fkey;
