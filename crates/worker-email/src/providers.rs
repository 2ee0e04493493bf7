//! The email providers in order (`NOTIFY_SMTP_URL`, comma-separated) and the choice of one
//! per attempt.
//!
//! Each provider has a [`breaker::Breaker`]. An attempt goes to the first provider whose
//! breaker admits it. A transient failure of that provider (SMTP 4xx or a connection error
//! before the end of the data; HTTP 5xx or 429 with an answer) moves the same attempt on to
//! the next admitting provider, because nothing can have been accepted. It never moves on
//! when the message may have been accepted (a timeout or a dropped connection after the
//! data, an HTTP call without an answer): that is an ordinary ambiguous retry. A permanent
//! answer (550 5.1.1, SES `MessageRejected`) never moves on: it is about the address or the
//! message, and another provider would say the same, or worse, deliver what the first
//! refused.
//!
//! A provider whose breaker is open and whose cooldown has passed is asked first by the
//! next attempt (its half-open probe), even when an earlier provider is healthy: otherwise
//! a backup that recovered would never be probed while the primary takes all the mail,
//! and would stay `open` on the console and in the alert for good. A failed probe opens
//! it again and the same attempt goes on down the list.
//!
//! The attempt's recorded content names the provider that answered (`content.provider`).
//! Each provider call is counted (`notify_email_provider_attempts_total{provider,outcome}`).
//! Breaker state changes are counted (`notify_email_breaker_transitions_total{provider,
//! to}`), shown as `notify_email_breaker_state{provider}` (0 closed, 1 half-open, 2 open)
//! and, when a database pool is given, written to `email_provider_states` for the console.

pub use crate::attempt::{Outgoing, Verdict};
use crate::breaker::{Breaker, BreakerConfig, State, Transition};
use crate::{ses, smtp};
use notify_core::{AttemptOutcome, ErrorClass};
use notify_worker::Lease;
use opentelemetry::KeyValue;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::time::Duration;
// Tokio's clock, which a test that pauses time advances (see the breaker).
use tokio::time::Instant;

/// How one provider sends.
pub enum Transport {
    /// An SMTP relay.
    Smtp(smtp::SmtpClient),
    /// Amazon SES v2 `SendEmail` ([`ses`]).
    Ses(ses::SesClient),
}

/// One provider of the list.
pub struct Provider {
    /// Name in metrics, attempts and the console: `host:port` of an SMTP relay, `ses:host`
    /// of SES.
    pub name: String,
    transport: Transport,
    breaker: Mutex<Breaker>,
}

/// The ordered providers.
pub struct Providers {
    list: Vec<Provider>,
    timeout: Duration,
    states: Option<sqlx::PgPool>,
}

impl Providers {
    /// Parses the comma-separated list: `smtp://`, `smtps://` URLs ([`smtp::SmtpServer`])
    /// and `ses+https://host[:port]?region=…` ([`ses::SesConfig`]; the credentials from
    /// `ses_credentials`). Errors name the position and what is wrong, never a secret.
    pub fn parse(
        urls: &str,
        timeout: Duration,
        breaker: BreakerConfig,
        ses_credentials: Option<(String, String)>,
    ) -> Result<Self, String> {
        let mut list = Vec::new();
        for (i, url) in urls.split(',').map(str::trim).enumerate() {
            if url.is_empty() {
                return Err(format!("provider {} is empty", i + 1));
            }
            let (name, transport) = if url.starts_with("ses+") {
                let (key, secret) = ses_credentials.clone().ok_or_else(|| {
                    "an SES provider needs NOTIFY_SES_ACCESS_KEY_ID and NOTIFY_SES_SECRET_ACCESS_KEY"
                        .to_string()
                })?;
                let cfg = ses::SesConfig::parse(url, key, secret)
                    .map_err(|e| format!("provider {}: {e}", i + 1))?;
                (
                    cfg.name(),
                    Transport::Ses(ses::SesClient::new(cfg, timeout)?),
                )
            } else {
                let server =
                    smtp::SmtpServer::parse(url).map_err(|e| format!("provider {}: {e}", i + 1))?;
                (
                    server.name(),
                    Transport::Smtp(smtp::SmtpClient::new(server, timeout)),
                )
            };
            if list.iter().any(|p: &Provider| p.name == name) {
                return Err(format!("provider {} ({name}) is listed twice", i + 1));
            }
            list.push(Provider {
                name,
                transport,
                breaker: Mutex::new(Breaker::new(breaker)),
            });
        }
        Ok(Self {
            list,
            timeout,
            states: None,
        })
    }

    /// Records breaker state changes in `email_provider_states` through `pool`, starting
    /// with each provider's `closed` (a new process starts with closed breakers, so an
    /// `open` left by a stopped one is not shown as current). Needs a Tokio runtime.
    pub fn with_states(mut self, pool: sqlx::PgPool) -> Self {
        self.states = Some(pool);
        for p in &self.list {
            self.record_state(p, State::Closed);
        }
        self
    }

    /// The providers' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.list.iter().map(|p| p.name.as_str()).collect()
    }

    /// How many providers there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether the list is empty (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The state of each provider's breaker, in order.
    pub fn states(&self) -> Vec<(&str, State)> {
        self.list
            .iter()
            .map(|p| (p.name.as_str(), lock(&p.breaker).state()))
            .collect()
    }

    /// Sends `msg` through the first admitting provider, moving on after a transient
    /// failure that accepted nothing (see the module). When no breaker admits the call
    /// (every provider open, or half-open with its probe out), nothing is called: an
    /// `email_providers_open` failure of class [`ErrorClass::Unavailable`] with
    /// `retry_after` = the time until the first breaker admits again (at least 1 s), so
    /// the runtime gives the claim back (no attempt row, no webhook, `attempts` unchanged)
    /// and pauses the email channel that long.
    pub async fn send(&self, msg: &Outgoing<'_>, lease: &Lease) -> AttemptOutcome {
        let mut last: Option<AttemptOutcome> = None;
        for p in self.order(Instant::now()) {
            let (admitted, t) = lock(&p.breaker).admit(Instant::now());
            self.transition(p, t);
            if !admitted {
                continue;
            }
            let mut content = msg.content.clone();
            content["provider"] = json!(p.name);
            let (outcome, verdict) = match &p.transport {
                Transport::Smtp(client) => {
                    smtp_attempt(client, msg, lease, content, self.timeout).await
                }
                Transport::Ses(client) => client.send(msg, lease, content).await,
            };
            let now = Instant::now();
            let t = {
                let mut b = lock(&p.breaker);
                match verdict {
                    Verdict::Answered => b.success(now),
                    Verdict::FailOver | Verdict::Ambiguous => b.failure(now),
                    Verdict::Neutral => {
                        b.release();
                        None
                    }
                }
            };
            self.transition(p, t);
            notify_telemetry::metrics().email_provider_attempts.add(
                1,
                &[
                    KeyValue::new("provider", p.name.clone()),
                    KeyValue::new("outcome", verdict.as_str()),
                ],
            );
            if verdict != Verdict::FailOver {
                return outcome;
            }
            tracing::warn!(provider = %p.name, "email provider failed transiently; trying the next");
            last = Some(outcome);
        }
        last.unwrap_or_else(|| {
            let now = Instant::now();
            let wait = self
                .list
                .iter()
                .map(|p| lock(&p.breaker).admits_again_in(now))
                .min()
                .unwrap_or_default()
                .max(Duration::from_secs(1));
            AttemptOutcome::failed(
                ErrorClass::Unavailable,
                "email_providers_open",
                msg.content.clone(),
            )
            .with_response(format!(
                "every email provider's circuit breaker is open; the first admits again in {} ms",
                wait.as_millis()
            ))
            .with_retry_after(Some(wait))
        })
    }

    /// The providers in the order this attempt asks them: the list's, except that the
    /// first open provider whose cooldown has passed goes first (its probe).
    fn order(&self, now: Instant) -> Vec<&Provider> {
        let due = self.list.iter().position(|p| {
            let b = lock(&p.breaker);
            b.state() == State::Open && b.admits_again_in(now).is_zero()
        });
        let mut order: Vec<&Provider> = self.list.iter().collect();
        if let Some(i) = due {
            let probe = order.remove(i);
            order.insert(0, probe);
        }
        order
    }

    fn transition(&self, p: &Provider, t: Option<Transition>) {
        let Some(t) = t else { return };
        tracing::warn!(provider = %p.name, from = t.from.as_str(), to = t.to.as_str(), "email provider breaker");
        notify_telemetry::metrics().email_breaker_transitions.add(
            1,
            &[
                KeyValue::new("provider", p.name.clone()),
                KeyValue::new("to", t.to.as_str()),
            ],
        );
        self.record_state(p, t.to);
    }

    /// Sets `notify_email_breaker_state{provider}` and the provider's row.
    fn record_state(&self, p: &Provider, state: State) {
        notify_telemetry::metrics()
            .email_breaker_state
            .record(state as u64, &[KeyValue::new("provider", p.name.clone())]);
        if let Some(pool) = &self.states {
            let (pool, provider, state) = (pool.clone(), p.name.clone(), state.as_str());
            // Written in the background; the newer change wins if two writes reorder.
            let at = chrono::Utc::now();
            tokio::spawn(async move {
                let r = sqlx::query(
                    "INSERT INTO email_provider_states (provider, state, changed_at) VALUES ($1, $2, $3)
                     ON CONFLICT (provider) DO UPDATE SET state = EXCLUDED.state, changed_at = EXCLUDED.changed_at
                     WHERE email_provider_states.changed_at <= EXCLUDED.changed_at",
                )
                .bind(provider)
                .bind(state)
                .bind(at)
                .execute(&pool)
                .await;
                if let Err(e) = r {
                    tracing::warn!(error = %e, "cannot record the email provider state");
                }
            });
        }
    }
}

fn lock(b: &Mutex<Breaker>) -> std::sync::MutexGuard<'_, Breaker> {
    b.lock().unwrap_or_else(|e| e.into_inner())
}

/// One SMTP exchange within `timeout`, classified (RFC 5321 §4.2.1, RFC 3463).
async fn smtp_attempt(
    client: &smtp::SmtpClient,
    msg: &Outgoing<'_>,
    lease: &Lease,
    content: Value,
    timeout: Duration,
) -> (AttemptOutcome, Verdict) {
    let exchange = client.send(msg.from.clone(), msg.to, msg.bytes, lease);
    let answer = match tokio::time::timeout(timeout, exchange).await {
        Ok(answer) => answer,
        Err(_) => {
            let out = AttemptOutcome::failed(ErrorClass::Transient, "smtp_timeout", content)
                .with_response(format!(
                    "the server did not finish the exchange within {} ms",
                    timeout.as_millis()
                ))
                .ambiguous();
            return (out, Verdict::Ambiguous);
        }
    };
    let (e, after_data) = match answer {
        Ok(resp) => {
            let text = resp.message().collect::<Vec<_>>().join(" ");
            let out = AttemptOutcome::sent(Some(msg.message_id.clone()), content)
                .with_status(code_number(&resp.code().to_string()))
                .with_response(format!("{} {text}", resp.code()));
            return (out, Verdict::Answered);
        }
        Err(smtp::SendError::Smtp(e)) => (e, false),
        Err(smtp::SendError::AfterData(e)) => (e, true),
        Err(smtp::SendError::LeaseLost(lost)) => return (lost.outcome(content), Verdict::Neutral),
        Err(smtp::SendError::Unsupported(why)) => {
            let out = AttemptOutcome::failed(ErrorClass::Permanent, "smtp_unsupported", content)
                .with_response(why);
            return (out, Verdict::Answered);
        }
    };
    let text = e.to_string();
    let (class, code, verdict) = if e.is_permanent() && crate::mailbox_does_not_exist(&text) {
        (
            ErrorClass::InvalidEndpoint,
            "address_undeliverable",
            Verdict::Answered,
        )
    } else if e.is_permanent() {
        (ErrorClass::Permanent, "smtp_rejected", Verdict::Answered)
    } else if e.is_transient() {
        // A 4xx reply: the server refused this step, so it holds nothing of the message.
        (ErrorClass::Transient, "smtp_transient", Verdict::FailOver)
    } else if e.is_timeout() {
        (ErrorClass::Transient, "smtp_timeout", Verdict::Ambiguous)
    } else if after_data {
        // The connection failed after DATA without a reply: the server may hold it.
        (ErrorClass::Transient, "smtp_connection", Verdict::Ambiguous)
    } else {
        (ErrorClass::Transient, "smtp_connection", Verdict::FailOver)
    };
    let mut out = AttemptOutcome::failed(class, code, content).with_response(text);
    let mut verdict = verdict;
    if e.is_timeout() && !e.is_permanent() && !e.is_transient() {
        // The server may have taken the message before it stopped answering.
        out = out.ambiguous();
        verdict = Verdict::Ambiguous;
    }
    if let Some(status) = e.status() {
        out = out.with_status(code_number(&status.to_string()));
    }
    (out, verdict)
}

fn code_number(code: &str) -> i32 {
    code.trim().parse().unwrap_or(0)
}
