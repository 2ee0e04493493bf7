//! A minimal SMTP server (RFC 5321) for the failure cases a real local server such as
//! MailDev never produces. The recipient's local part chooses the answer to `RCPT TO`:
//!
//! - `nouser…` → `550 5.1.1 mailbox does not exist`;
//! - `full…` → `452 4.2.2 mailbox full` (transient);
//! - `blocked…` → `554 5.7.1 message refused` (permanent, policy);
//! - `slow…` → `250 2.1.5 OK` after [`SLOW_RCPT`] (a server slow before the data);
//! - `stall…` → `250 2.1.5 OK`, `354` to DATA, and then no answer ever to the end of the
//!   data (a server that hangs after taking the message);
//! - anything else → `250 2.1.5 OK`, and the message is accepted after DATA.
//!
//! [`SmtpSim::set_fault`] makes every `MAIL FROM` get one reply instead (e.g. `421 4.3.2
//! service not available`, a relay that is down for every call) until cleared.
//!
//! Accepted messages are kept in memory ([`SmtpSim::messages`]), and every DATA command
//! answered with 354 is counted ([`SmtpSim::data_started`]). No TLS, no AUTH.

use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A message the server accepted.
#[derive(Debug, Clone)]
pub struct Accepted {
    /// `MAIL FROM` address.
    pub from: String,
    /// Accepted `RCPT TO` addresses.
    pub to: Vec<String>,
    /// The DATA, dot-unstuffed, lines joined with CRLF.
    pub data: String,
}

/// How long a `slow…` recipient's `RCPT TO` waits for its answer.
pub const SLOW_RCPT: std::time::Duration = std::time::Duration::from_secs(3);

/// The server's shared state.
#[derive(Clone, Default)]
pub struct SmtpSim {
    accepted: Arc<Mutex<Vec<Accepted>>>,
    data_started: Arc<std::sync::atomic::AtomicUsize>,
    fault: Arc<Mutex<Option<String>>>,
    mail_commands: Arc<std::sync::atomic::AtomicUsize>,
}

impl SmtpSim {
    /// Messages accepted so far, oldest first.
    pub fn messages(&self) -> Vec<Accepted> {
        self.accepted.lock().expect("smtp lock").clone()
    }

    /// How many DATA commands were answered with 354 (the client went past its point of
    /// no return), including those whose message was never answered.
    pub fn data_started(&self) -> usize {
        self.data_started.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every later `MAIL FROM` gets `reply` (a full reply line such as `421 4.3.2 service
    /// not available`); `None` clears it.
    pub fn set_fault(&self, reply: Option<&str>) {
        *self.fault.lock().expect("smtp lock") = reply.map(str::to_string);
    }

    /// How many `MAIL FROM` commands arrived (faulted ones included).
    pub fn mail_commands(&self) -> usize {
        self.mail_commands.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Serves SMTP on `listener` until `shutdown` is cancelled.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        loop {
            let conn = tokio::select! {
                _ = shutdown.cancelled() => return,
                c = listener.accept() => c,
            };
            let Ok((stream, _)) = conn else { continue };
            let sim = self.clone();
            tokio::spawn(async move {
                let _ = sim.session(stream).await;
            });
        }
    }

    async fn session(&self, stream: tokio::net::TcpStream) -> std::io::Result<()> {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        write.write_all(b"220 smtp-sim ESMTP ready\r\n").await?;
        let (mut from, mut to) = (String::new(), Vec::<String>::new());
        let mut stall = false;
        while let Some(line) = lines.next_line().await? {
            let upper = line.to_ascii_uppercase();
            let reply: String = if upper.starts_with("EHLO") {
                "250-smtp-sim\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 PIPELINING".into()
            } else if upper.starts_with("HELO") {
                "250 smtp-sim".into()
            } else if upper.starts_with("MAIL FROM:") {
                self.mail_commands
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let fault = self.fault.lock().expect("smtp lock").clone();
                if let Some(reply) = fault {
                    write.write_all(reply.as_bytes()).await?;
                    write.write_all(b"\r\n").await?;
                    continue;
                }
                from = address(&line[10..]);
                to.clear();
                stall = false;
                "250 2.1.0 OK".into()
            } else if upper.starts_with("RCPT TO:") {
                let rcpt = address(&line[8..]);
                let local = rcpt.split('@').next().unwrap_or("").to_ascii_lowercase();
                if local.starts_with("nouser") {
                    format!("550 5.1.1 <{rcpt}>: mailbox does not exist")
                } else if local.starts_with("full") {
                    format!("452 4.2.2 <{rcpt}>: mailbox full, try again later")
                } else if local.starts_with("blocked") {
                    "554 5.7.1 message refused by policy".into()
                } else if local.starts_with("slow") {
                    tokio::time::sleep(SLOW_RCPT).await;
                    to.push(rcpt);
                    "250 2.1.5 OK".into()
                } else {
                    stall |= local.starts_with("stall");
                    to.push(rcpt);
                    "250 2.1.5 OK".into()
                }
            } else if upper == "DATA" {
                if to.is_empty() {
                    "554 5.5.1 no valid recipients".into()
                } else {
                    write
                        .write_all(b"354 end data with <CR><LF>.<CR><LF>\r\n")
                        .await?;
                    self.data_started
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let mut data = Vec::new();
                    while let Some(l) = lines.next_line().await? {
                        if l == "." {
                            break;
                        }
                        data.push(l.strip_prefix('.').map(str::to_string).unwrap_or(l));
                    }
                    if stall {
                        // Never answer; hold the connection until the client drops it.
                        while lines.next_line().await?.is_some() {}
                        return Ok(());
                    }
                    self.accepted.lock().expect("smtp lock").push(Accepted {
                        from: from.clone(),
                        to: std::mem::take(&mut to),
                        data: data.join("\r\n"),
                    });
                    "250 2.0.0 OK queued".into()
                }
            } else if upper == "RSET" {
                to.clear();
                stall = false;
                "250 2.0.0 OK".into()
            } else if upper == "NOOP" {
                "250 2.0.0 OK".into()
            } else if upper == "QUIT" {
                write.write_all(b"221 2.0.0 bye\r\n").await?;
                return Ok(());
            } else {
                "502 5.5.2 command not implemented".into()
            };
            write.write_all(reply.as_bytes()).await?;
            write.write_all(b"\r\n").await?;
        }
        Ok(())
    }
}

/// The address inside `<…>` (parameters after it ignored).
fn address(arg: &str) -> String {
    let arg = arg.trim();
    match (arg.find('<'), arg.find('>')) {
        (Some(a), Some(b)) if b > a => arg[a + 1..b].to_string(),
        _ => arg.split_whitespace().next().unwrap_or("").to_string(),
    }
}
