//! `notifyctl keys`: API keys of calling services, managed in Postgres
//! (`NOTIFY_DATABASE_URL`), and the interceptor that sends `NOTIFY_API_KEY` with every
//! gRPC call this tool makes.
//!
//! ```text
//! notifyctl keys create NAME --types order_*,security_login [--manage] [--rate 50] [--max-recipients 1000]
//! notifyctl keys list
//! notifyctl keys revoke NAME
//! ```
//!
//! `create` prints the key alone on stdout (shown this once; only its SHA-256 is stored)
//! and what it may do on stderr.

use anyhow::{Context, bail};
use notify_store::api_keys::{self, NewApiKey};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;

/// Adds `authorization: Bearer <NOTIFY_API_KEY>` to every call (nothing when unset).
#[derive(Clone, Default)]
pub struct ApiKeyAuth(Option<MetadataValue<Ascii>>);

impl ApiKeyAuth {
    /// From `NOTIFY_API_KEY`.
    pub fn from_env() -> Self {
        Self(
            std::env::var("NOTIFY_API_KEY")
                .ok()
                .filter(|k| !k.trim().is_empty())
                .and_then(|k| format!("Bearer {}", k.trim()).parse().ok()),
        )
    }
}

impl ApiKeyAuth {
    /// Sends `key` as `authorization: Bearer <key>`; an error when `key` is not a valid
    /// header value.
    pub fn bearer(key: &str) -> anyhow::Result<Self> {
        Ok(Self(Some(format!("Bearer {}", key.trim()).parse()?)))
    }
}

impl Interceptor for ApiKeyAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A gRPC channel that authenticates with `NOTIFY_API_KEY`.
pub type Grpc = InterceptedService<tonic::transport::Channel, ApiKeyAuth>;

/// Wraps `channel` with the key from the environment.
pub fn authed(channel: tonic::transport::Channel) -> Grpc {
    InterceptedService::new(channel, ApiKeyAuth::from_env())
}

/// Runs `notifyctl keys ARGS…`; returns the exit code.
pub async fn run(database_url: &str, args: &[String]) -> anyhow::Result<u8> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await
        .context("connecting to NOTIFY_DATABASE_URL")?;
    match args.first().map(String::as_str) {
        Some("create") => {
            let Some(name) = args.get(1).filter(|n| !n.starts_with("--")) else {
                bail!(
                    "usage: notifyctl keys create NAME --types PATTERNS [--manage] [--rate N] [--max-recipients N]"
                );
            };
            let mut new = NewApiKey {
                name: name.clone(),
                send_types: Vec::new(),
                can_manage: false,
                events_per_second: 50,
                max_recipients: 1000,
            };
            let mut it = args[2..].iter();
            while let Some(flag) = it.next() {
                let mut value = |what: &str| {
                    it.next()
                        .cloned()
                        .with_context(|| format!("{flag} needs {what}"))
                };
                match flag.as_str() {
                    "--types" => {
                        new.send_types = value("a comma-separated list")?
                            .split(',')
                            .map(|t| t.trim().to_string())
                            .filter(|t| !t.is_empty())
                            .collect();
                        // Type keys are lowercase [a-z0-9_.-]; a pattern that cannot match
                        // one is a mistake, not a restriction.
                        for t in &new.send_types {
                            let body = t.strip_suffix('*').unwrap_or(t);
                            let ok = t == "*"
                                || (!body.is_empty()
                                    && body.starts_with(|c: char| c.is_ascii_lowercase())
                                    && body.chars().all(|c| {
                                        c.is_ascii_lowercase()
                                            || c.is_ascii_digit()
                                            || matches!(c, '_' | '.' | '-')
                                    }));
                            if !ok {
                                bail!(
                                    "--types {t:?}: a type key ([a-z][a-z0-9_.-]*), a prefix ending in *, or *"
                                );
                            }
                        }
                    }
                    "--manage" => new.can_manage = true,
                    "--rate" => {
                        new.events_per_second = number_in(
                            &value("a number")?,
                            1..=1_000_000,
                            "--rate must be 1 to 1000000 events per second",
                        )?
                    }
                    "--max-recipients" => {
                        new.max_recipients = number_in(
                            &value("a number")?,
                            1..=1000,
                            "--max-recipients must be 1 to 1000",
                        )?
                    }
                    other => bail!("unknown option {other:?}"),
                }
            }
            if new.send_types.is_empty() {
                bail!(
                    "--types is required: the types this caller may send (order_*,security_login), or * for all"
                );
            }
            let (key, row) = match api_keys::create(&pool, &new).await {
                Ok(k) => k,
                Err(e) if e.to_string().contains("api_keys_name_key") => {
                    bail!(
                        "a key named {name:?} exists (active or revoked: names stay taken, so events keep naming their caller); pick another name, e.g. {name}-2"
                    )
                }
                Err(e) if e.to_string().contains("api_keys_name_check") => {
                    bail!(
                        "the name must be 1 to 63 characters of [a-z0-9._-], starting with a letter or digit"
                    )
                }
                Err(e) => return Err(e.into()),
            };
            println!("{key}");
            eprintln!(
                "created key {} for {:?}: types [{}], manage {}, {} events/s, {} recipients per event.\nThe key above is shown only now; store it in the caller's secret store.",
                row.key_prefix,
                row.name,
                row.send_types.join(", "),
                row.can_manage,
                row.events_per_second,
                row.max_recipients
            );
            Ok(0)
        }
        Some("list") => {
            println!(
                "{:<24} {:<12} {:<8} {:>8} {:>6} {:<20} {:<20} types",
                "name", "key", "manage", "events/s", "max", "created", "revoked"
            );
            for k in api_keys::list(&pool).await? {
                println!(
                    "{:<24} {:<12} {:<8} {:>8} {:>6} {:<20} {:<20} {}",
                    k.name,
                    k.key_prefix,
                    k.can_manage,
                    k.events_per_second,
                    k.max_recipients,
                    k.created_at.format("%Y-%m-%d %H:%M:%S"),
                    k.revoked_at
                        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                        .unwrap_or_else(|| "-".into()),
                    k.send_types.join(",")
                );
            }
            Ok(0)
        }
        Some("revoke") => {
            let Some(name) = args.get(1) else {
                bail!("usage: notifyctl keys revoke NAME");
            };
            if api_keys::revoke(&pool, name).await? {
                eprintln!("revoked {name:?}; every ingest replica drops it within a second");
                Ok(0)
            } else {
                eprintln!("no active key named {name:?}");
                Ok(1)
            }
        }
        _ => {
            eprintln!(
                "usage: notifyctl keys create NAME --types PATTERNS [--manage] [--rate N] [--max-recipients N] | keys list | keys revoke NAME"
            );
            Ok(64)
        }
    }
}

/// `text` as a number within `range`, else the error `message`.
fn number_in<T: std::str::FromStr + PartialOrd>(
    text: &str,
    range: std::ops::RangeInclusive<T>,
    message: &'static str,
) -> anyhow::Result<T> {
    text.parse()
        .ok()
        .filter(|n| range.contains(n))
        .context(message)
}
