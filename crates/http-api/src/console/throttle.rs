//! The console's sign-in throttle: the counts (buckets) an attempt is taken from, before
//! the password is checked, atomically in Postgres
//! ([`notify_store::console::take_sign_in_attempt`]), so no burst, on any number of
//! replicas, gets more password checks than a bucket allows, and a refused attempt
//! checks nothing.
//!
//! - **This name from this address**: [`ConsoleConfig::sign_in_limit`] (5) per
//!   [`ConsoleConfig::sign_in_window`] (15 minutes). A guesser at one address gets that
//!   many tries at a name, and locks out only that name at that address: the same staff
//!   member signs in from anywhere else.
//! - **This address, any name**: [`ConsoleConfig::sign_in_address_limit`] (20) per
//!   window, so one address cannot spread guesses (and argon2 work) over many names.
//! - **This name, any address**: [`ConsoleConfig::sign_in_name_limit`] (50) per
//!   [`ConsoleConfig::sign_in_name_window`] (24 hours), the slower bound on guessing one
//!   name from many addresses. An address this name signed in from within
//!   [`KNOWN_ADDRESS_FOR`] (30 days) does not take from it, so guessing from many
//!   addresses does not lock the staff member out of the places they sign in from.
//!
//! An IPv6 address counts as its /64 (one host gets a whole /64), an IPv4-mapped one as
//! the IPv4 address. A successful sign-in gives back what it took, so a window counts the
//! wrong passwords (and the checks under way): at most the limit of each bucket, however
//! many right ones come between. Typed names are keyed by their SHA-256 only (the typed
//! name is never stored or logged).

use super::ConsoleConfig;
use notify_store::StoreError;
use notify_store::console::{self as store, SignInBucket};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use std::net::IpAddr;
use std::time::Duration;

/// How long after a staff name's last sign-in from an address that address is spared the
/// name's bound from every address.
pub(super) const KNOWN_ADDRESS_FOR: Duration = Duration::from_secs(30 * 86400);

/// The buckets of one sign-in attempt (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Attempt {
    /// This name from this address.
    pair: SignInBucket,
    /// This address, any name; and, unless the address is known for the name, this name
    /// from any address.
    others: Vec<SignInBucket>,
}

/// The throttle key of a client address: the IPv4 address, an IPv6 address's /64, or
/// `unknown` when the connection's peer is not known.
fn address_key(addr: Option<IpAddr>) -> String {
    match addr.map(|a| a.to_canonical()) {
        Some(IpAddr::V4(a)) => a.to_string(),
        Some(IpAddr::V6(a)) => {
            let s = a.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        None => "unknown".into(),
    }
}

impl Attempt {
    /// The buckets of a sign-in as `typed_user` from `addr`; `known`: the address is one
    /// the name signed in from within [`KNOWN_ADDRESS_FOR`], so the name's bound from
    /// every address is not taken from.
    fn new(cfg: &ConsoleConfig, typed_user: &str, addr: Option<IpAddr>, known: bool) -> Self {
        let name = hex::encode(Sha256::digest(typed_user.as_bytes()));
        let addr = address_key(addr);
        let mut others = vec![SignInBucket {
            key: format!("addr:{addr}"),
            limit: cfg.sign_in_address_limit,
            window: cfg.sign_in_window,
        }];
        if !known {
            others.push(SignInBucket {
                key: format!("name:{name}"),
                limit: cfg.sign_in_name_limit,
                window: cfg.sign_in_name_window,
            });
        }
        Self {
            pair: SignInBucket {
                key: format!("pair:{name}:{addr}"),
                limit: cfg.sign_in_limit,
                window: cfg.sign_in_window,
            },
            others,
        }
    }

    /// Takes one attempt from every bucket of a sign-in as `typed_user` from `addr`:
    /// `Ok(attempt)` when the password may be checked, `Err(seconds)` to wait (a 429).
    pub(super) async fn take(
        db: &PgPool,
        cfg: &ConsoleConfig,
        typed_user: &str,
        addr: Option<IpAddr>,
    ) -> Result<Result<Self, u64>, StoreError> {
        let pair = Self::new(cfg, typed_user, addr, false).pair.key;
        let known = store::sign_in_address_known(db, &pair, KNOWN_ADDRESS_FOR).await?;
        let attempt = Self::new(cfg, typed_user, addr, known);
        let mut buckets = attempt.others.clone();
        buckets.push(attempt.pair.clone());
        Ok(match store::take_sign_in_attempt(db, &buckets).await? {
            None => Ok(attempt),
            Some(wait) => Err(wait),
        })
    }

    /// The password was wrong: the attempt stays counted; ended windows are deleted.
    pub(super) async fn failed(self, db: &PgPool) -> Result<(), StoreError> {
        store::forget_ended_sign_in_windows(db).await
    }

    /// The password was right: see [`store::sign_in_succeeded`].
    pub(super) async fn succeeded(self, db: &PgPool) -> Result<(), StoreError> {
        let buckets: Vec<String> = std::iter::once(&self.pair)
            .chain(&self.others)
            .map(|b| b.key.clone())
            .collect();
        store::sign_in_succeeded(db, &self.pair.key, &buckets, KNOWN_ADDRESS_FOR).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_address_counts_as_its_slash_64_and_a_mapped_ipv4_as_the_ipv4() {
        let a = |s: &str| address_key(Some(s.parse().unwrap()));
        assert_eq!(a("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(a("2001:db8:1:2:ffff:ffff:ffff:ffff"), "2001:db8:1:2::/64");
        assert_ne!(a("2001:db8:1:3::1"), a("2001:db8:1:2::1"));
        assert_eq!(a("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(a("192.0.2.7"), "192.0.2.7");
        assert_eq!(address_key(None), "unknown");
    }

    #[test]
    fn the_buckets_are_the_pair_the_address_and_the_name_unless_the_address_is_known() {
        let cfg = ConsoleConfig::default();
        let addr = Some("192.0.2.7".parse().unwrap());
        let a = Attempt::new(&cfg, "on-call", addr, false);
        let name = hex::encode(Sha256::digest(b"on-call"));
        assert_eq!(a.pair.key, format!("pair:{name}:192.0.2.7"));
        assert_eq!((a.pair.limit, a.pair.window), (5, Duration::from_secs(900)));
        let others: Vec<_> = a
            .others
            .iter()
            .map(|b| (b.key.clone(), b.limit, b.window))
            .collect();
        assert_eq!(
            others,
            [
                ("addr:192.0.2.7".into(), 20, Duration::from_secs(900)),
                (format!("name:{name}"), 50, Duration::from_secs(86400)),
            ]
        );
        assert!(
            [&a.pair]
                .into_iter()
                .chain(&a.others)
                .all(|b| !b.key.contains("on-call"))
        );
        let known = Attempt::new(&cfg, "on-call", addr, true);
        assert_eq!(known.pair, a.pair);
        assert_eq!(known.others, a.others[..1]);
    }
}
