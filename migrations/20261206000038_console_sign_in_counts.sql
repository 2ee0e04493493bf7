-- The console's sign-in throttle as counters taken from before the password is checked
-- (issue 44): one row per bucket, locked by the sign-in that takes an attempt from it, so
-- concurrent sign-ins on every replica take attempts one at a time and no burst gets
-- more password checks than the bucket's limit. Keys (never a typed name): a typed name
-- and client address `pair:<sha256 hex of the name>:<address>`, an address
-- `addr:<address>`, a name from every address `name:<sha256 hex>`; an IPv6 address is
-- counted as its /64. A window starts at the first attempt after the previous window
-- ended (`ends_at` = that time + the bucket's window); `count` is the attempts taken in it.
CREATE TABLE console_sign_in_counts (
    key     text PRIMARY KEY,
    ends_at timestamptz NOT NULL,
    count   integer NOT NULL DEFAULT 0 CHECK (count >= 0)
);
CREATE INDEX console_sign_in_counts_ends_at ON console_sign_in_counts (ends_at);

-- The addresses a staff name signed in from (the `pair:` key) and when it last did: a
-- sign-in from one of them within 30 days is not held back by the name's bound from every
-- address, so guessing from many addresses does not lock the staff member out of the
-- places they sign in from. Rows older than 30 days are deleted at the next sign-in.
CREATE TABLE console_sign_in_addresses (
    key          text PRIMARY KEY,
    signed_in_at timestamptz NOT NULL
);

-- `console_sign_in_failures` (20261201000018) is no longer read or written by this
-- release; it stays for the previous one during a rolling upgrade (expand/contract) and
-- is dropped by a later release. Its rows are at most a throttle window old.
