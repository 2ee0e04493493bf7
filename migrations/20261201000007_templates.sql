-- Templates per type x channel (or '*') x locale, rendered by the workers with minijinja.
-- A type's default_locale ends the locale fallback chain; sample_payload is what its
-- templates are validated against when the type is saved.
ALTER TABLE notification_types
    ADD COLUMN default_locale text NOT NULL DEFAULT 'th',
    ADD COLUMN sample_payload jsonb NOT NULL DEFAULT '{}';

CREATE TABLE notification_templates (
    type          text NOT NULL REFERENCES notification_types (key) ON DELETE CASCADE,
    channel       text NOT NULL CHECK (channel IN ('inapp', 'email', 'push', 'line', '*')),
    locale        text NOT NULL,
    title         text NOT NULL DEFAULT '',
    body          text NOT NULL DEFAULT '',
    email_subject text NOT NULL DEFAULT '',
    email_html    text NOT NULL DEFAULT '',
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (type, channel, locale)
);
