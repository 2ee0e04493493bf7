//! The SMTP exchange, step by step on lettre's `AsyncSmtpConnection`, so that the lease can
//! be confirmed between `RCPT TO` and `DATA` (the point of no return: once the message
//! data is sent, the server may deliver it) and the whole exchange has one deadline.
//!
//! Connections are kept for reuse (at most [`MAX_IDLE`], each for at most [`IDLE_FOR`] and
//! checked with `NOOP` before reuse, as lettre's own pool does); a connection that saw any
//! error is dropped.

use lettre::Address;
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Tls, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt, Rset};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::Response;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most idle connections kept.
pub const MAX_IDLE: usize = 10;

/// How long an idle connection is kept (lettre's pool default).
pub const IDLE_FOR: Duration = Duration::from_secs(60);

/// Where and how to connect, from lettre's URL format: `smtp://host:port` (plain, port 25),
/// `smtp://host:port?tls=required` or `?tls=opportunistic` (STARTTLS, port 587),
/// `smtps://host:port` (implicit TLS, port 465), optionally `user:password@` (percent-
/// encoded) and a path naming the EHLO domain.
#[derive(Clone)]
pub struct SmtpServer {
    host: String,
    port: u16,
    tls: Tls,
    hello: ClientId,
    credentials: Option<Credentials>,
}

impl std::fmt::Debug for SmtpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpServer")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("credentials", &self.credentials.is_some())
            .finish()
    }
}

impl SmtpServer {
    /// The provider's name in metrics and attempts: `host:port`.
    pub fn name(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Parses an SMTP URL (see the type). Errors name what is wrong, never the password.
    pub fn parse(url: &str) -> Result<Self, String> {
        let u = url::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
        let host = u
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or("no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let tls_param = u
            .query_pairs()
            .find(|(k, _)| k == "tls")
            .map(|(_, v)| v.to_string());
        let params = || TlsParameters::new(host.clone()).map_err(|e| format!("TLS: {e}"));
        let (tls, port) = match (u.scheme(), tls_param.as_deref()) {
            ("smtp", None) => (Tls::None, 25),
            ("smtp", Some("required")) => (Tls::Required(params()?), 587),
            ("smtp", Some("opportunistic")) => (Tls::Opportunistic(params()?), 587),
            ("smtps", _) => (Tls::Wrapper(params()?), 465),
            (scheme, tls) => {
                return Err(format!(
                    "unknown scheme {scheme:?} or tls parameter {tls:?} (smtp, smtp?tls=required, smtp?tls=opportunistic, smtps)"
                ));
            }
        };
        let hello = match u.path().trim_matches('/') {
            "" => ClientId::default(),
            name => ClientId::Domain(name.to_string()),
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| "the user name or password is not UTF-8 once decoded".to_string())
        };
        let credentials = match u.password() {
            Some(password) => Some(Credentials::new(decode(u.username())?, decode(password)?)),
            None => None,
        };
        Ok(Self {
            port: u.port().unwrap_or(port),
            host,
            tls,
            hello,
            credentials,
        })
    }
}

/// Why an exchange ended without the server's final answer to the data.
#[derive(Debug)]
pub enum SendError {
    /// The server (or the network) failed a step before `DATA` was sent.
    Smtp(lettre::transport::smtp::Error),
    /// The server (or the network) failed after `DATA` was sent: without a reply, the
    /// server may hold the message.
    AfterData(lettre::transport::smtp::Error),
    /// The lease was found lost before `DATA`: nothing was sent.
    LeaseLost(notify_worker::LeaseLost),
    /// The server lacks an extension this message needs (SMTPUTF8, 8BITMIME): nothing was
    /// sent.
    Unsupported(&'static str),
}

/// An SMTP client with reusable connections.
pub struct SmtpClient {
    server: SmtpServer,
    connect_timeout: Duration,
    idle: Mutex<Vec<(AsyncSmtpConnection, Instant)>>,
}

impl SmtpClient {
    /// A client for `server`; `connect_timeout` bounds the TCP (and TLS) connect.
    pub fn new(server: SmtpServer, connect_timeout: Duration) -> Self {
        Self {
            server,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    async fn connect(&self) -> Result<AsyncSmtpConnection, lettre::transport::smtp::Error> {
        let s = &self.server;
        let wrapper = match &s.tls {
            Tls::Wrapper(p) => Some(p.clone()),
            _ => None,
        };
        let mut conn = AsyncSmtpConnection::connect_tokio1(
            (s.host.as_str(), s.port),
            Some(self.connect_timeout),
            &s.hello,
            wrapper,
            None,
        )
        .await?;
        match &s.tls {
            Tls::Opportunistic(p) if conn.can_starttls() => {
                conn.starttls(p.clone(), &s.hello).await?
            }
            Tls::Required(p) => conn.starttls(p.clone(), &s.hello).await?,
            _ => {}
        }
        if let Some(credentials) = &s.credentials {
            conn.auth(DEFAULT_MECHANISMS, credentials).await?;
        }
        Ok(conn)
    }

    /// An idle connection that still answers `NOOP`, or a new one.
    async fn checkout(&self) -> Result<AsyncSmtpConnection, lettre::transport::smtp::Error> {
        loop {
            let next = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match next {
                Some((mut conn, since)) => {
                    if since.elapsed() < IDLE_FOR
                        && !conn.has_broken()
                        && conn.test_connected().await
                    {
                        return Ok(conn);
                    }
                    conn.abort().await;
                }
                None => return self.connect().await,
            }
        }
    }

    fn checkin(&self, conn: AsyncSmtpConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((conn, Instant::now()));
        }
    }

    /// One message: `MAIL FROM`, `RCPT TO` each recipient, then `lease.confirm()`, then
    /// `DATA` and the message. Returns the server's answer to the data. No deadline of its
    /// own beyond the connect timeout: the caller bounds the whole exchange.
    pub async fn send(
        &self,
        from: Option<Address>,
        to: &[Address],
        message: &[u8],
        lease: &notify_worker::Lease,
    ) -> Result<Response, SendError> {
        let mut conn = self.checkout().await.map_err(SendError::Smtp)?;
        match self.exchange(&mut conn, from, to, message, lease).await {
            Ok(resp) => {
                self.checkin(conn);
                Ok(resp)
            }
            Err(SendError::LeaseLost(lost)) => {
                // Nothing was sent: the connection stays usable after RSET.
                if conn.command(Rset).await.is_ok() {
                    self.checkin(conn);
                } else {
                    conn.abort().await;
                }
                Err(SendError::LeaseLost(lost))
            }
            Err(e) => {
                conn.abort().await;
                Err(e)
            }
        }
    }

    async fn exchange(
        &self,
        conn: &mut AsyncSmtpConnection,
        from: Option<Address>,
        to: &[Address],
        message: &[u8],
        lease: &notify_worker::Lease,
    ) -> Result<Response, SendError> {
        let mut options = Vec::new();
        let non_ascii_address = from
            .iter()
            .chain(to)
            .any(|a: &Address| !AsRef::<str>::as_ref(a).is_ascii());
        if non_ascii_address {
            if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
                return Err(SendError::Unsupported(
                    "an address is not ASCII but the server does not offer SMTPUTF8",
                ));
            }
            options.push(MailParameter::SmtpUtfEight);
        }
        if !message.is_ascii() {
            if !conn.server_info().supports_feature(Extension::EightBitMime) {
                return Err(SendError::Unsupported(
                    "the message is not ASCII but the server does not offer 8BITMIME",
                ));
            }
            options.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        conn.command(Mail::new(from, options))
            .await
            .map_err(SendError::Smtp)?;
        for rcpt in to {
            conn.command(Rcpt::new(rcpt.clone(), vec![]))
                .await
                .map_err(SendError::Smtp)?;
        }
        lease.confirm().await.map_err(SendError::LeaseLost)?;
        conn.command(Data).await.map_err(SendError::AfterData)?;
        conn.message(message).await.map_err(SendError::AfterData)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smtp_urls_are_read_as_lettre_reads_them() {
        let s = SmtpServer::parse("smtp://127.0.0.1:1025").unwrap();
        assert_eq!((s.host.as_str(), s.port), ("127.0.0.1", 1025));
        assert!(matches!(s.tls, Tls::None) && s.credentials.is_none());
        let s = SmtpServer::parse("smtp://mail.example.test?tls=required").unwrap();
        assert_eq!(s.port, 587);
        assert!(matches!(s.tls, Tls::Required(_)));
        let s = SmtpServer::parse("smtps://us%40er:p%3Ass@mail.example.test/relay.example.test")
            .unwrap();
        assert_eq!(s.port, 465);
        assert!(matches!(s.tls, Tls::Wrapper(_)));
        assert_eq!(
            s.credentials,
            Some(Credentials::new("us@er".into(), "p:ss".into()))
        );
        assert_eq!(s.hello, ClientId::Domain("relay.example.test".into()));
        let err = SmtpServer::parse("http://user:secret@mail.example.test").unwrap_err();
        assert!(!err.contains("secret"), "{err}");
        assert!(
            format!("{s:?}").find("p:ss").is_none(),
            "Debug hides the password"
        );
    }
}
