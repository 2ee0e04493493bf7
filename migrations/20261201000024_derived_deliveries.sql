-- Derived deliveries (issue 17): a delivery created because another could not reach the
-- user (fallback) or was not read or clicked in time (escalation). `cause` says which,
-- `caused_by` names the delivery it derives from (NULL for a fallback decided at planning,
-- where the unreachable channel has a skip row, not a delivery). A derived delivery has
-- the key a planned delivery on its channel would have (`<event>/<user>/<channel>`), so a
-- user never gets one event twice on one channel by two paths.
ALTER TABLE notification_deliveries
    ADD COLUMN cause text NOT NULL DEFAULT 'planned'
        CHECK (cause IN ('planned', 'fallback', 'escalation')),
    ADD COLUMN caused_by uuid NULL;

-- Per type: the ordered fallback list (e.g. {line,email}) and the escalations
-- ([{"from":"inapp","to":"email","after_seconds":3600}]).
ALTER TABLE notification_types
    ADD COLUMN fallback_channels text[] NOT NULL DEFAULT '{}',
    ADD COLUMN escalations jsonb NOT NULL DEFAULT '[]';
