-- Versions of the notification-type file loaded by `ingest load-types` at deploy time.
CREATE TABLE type_catalog_versions (
    version   integer PRIMARY KEY,
    checksum  bytea NOT NULL,
    types     integer NOT NULL,
    loaded_at timestamptz NOT NULL DEFAULT now()
);
