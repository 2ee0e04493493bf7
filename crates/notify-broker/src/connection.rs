//! Connecting to a broker: the address list of a cluster (round robin, on to the next
//! node on failure) and the frame size and heartbeat asked for.

use crate::BrokerError;
use lapin::{Connection, ConnectionProperties};

/// The addresses of a broker setting: `urls` split at commas, trimmed, empty entries
/// dropped (`NOTIFY_AMQP_URL` may name every node of a cluster).
pub fn addresses(urls: &str) -> Vec<&str> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// Where the next [`connect`] of this process starts in its address list, so that
/// successive connects and reconnects spread over a cluster's nodes and one dead node is
/// not always tried first.
static NEXT_ADDRESS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The largest AMQP frame this client accepts, in bytes, when the URL names none
/// (`?frame_max=`): 16 KiB. The connection uses the smaller of this and the broker's
/// `frame_max` (AMQP 0-9-1, `connection.tune-ok`; RabbitMQ's default is 131,072). lapin
/// keeps a receive and a send buffer of 32 frames for each connection, written through
/// when they are made: at RabbitMQ's default that is 8 MiB of memory a connection, at
/// 16 KiB 1 MiB. A message names deliveries: at the relay's default of 50 a message
/// about 6 KB, at its maximum of 500 up to about 58 KB with trace headers, carried in
/// several body frames (its header frame stays small).
pub const FRAME_MAX: u32 = 16 * 1024;

/// The AMQP heartbeat this client asks for, in seconds, when the URL names none
/// (`?heartbeat=`): 10. The connection uses the smaller of this and the broker's
/// (`connection.tune-ok`; RabbitMQ's default is 60). RabbitMQ closes a connection whose
/// peer sent nothing for two heartbeat intervals and returns every message that
/// connection held unacknowledged, its prefetched ones included, to the queue for other
/// consumers. lapin sends the heartbeats from a task on the process's own Tokio runtime,
/// so a process that is stopped (SIGSTOP, a VM paused) sends none: within three intervals
/// (30 s, as measured on RabbitMQ 3.10) the broker takes back what it holds, instead of
/// the 60 s default's three minutes, and a
/// delivery the sweeper recovers from a frozen worker goes to a live one (issue 44,
/// item 9). Short enough for that, long enough that a busy but live process, whose
/// runtime is never blocked for seconds, keeps its connection.
pub const HEARTBEAT_S: u16 = 10;

/// `address` parsed, with [`FRAME_MAX`] and [`HEARTBEAT_S`] unless it names its own
/// `frame_max` or `heartbeat`.
fn tuned(address: &str) -> Result<lapin::uri::AMQPUri, BrokerError> {
    let mut uri: lapin::uri::AMQPUri = address
        .parse()
        .map_err(|e: String| lapin::Error::from(std::io::Error::other(e)))?;
    uri.query.frame_max.get_or_insert(FRAME_MAX);
    uri.query.heartbeat.get_or_insert(HEARTBEAT_S);
    Ok(uri)
}

/// Connects to the first reachable of `urls`: one `amqp://user:pass@host:port/vhost` or
/// several separated by commas (the nodes of a cluster). Each call starts at the next
/// address of the list (round robin) and goes on through the others; every reconnect
/// loop calls it again, so a process reaches any live node. Frames are at most
/// [`FRAME_MAX`] bytes, and the heartbeat [`HEARTBEAT_S`], unless the URL says otherwise.
///
/// # Errors
/// The last address's error when none of them accepts the connection (a malformed
/// address is such an error).
pub async fn connect(urls: &str, name: &str) -> Result<Connection, BrokerError> {
    let mut list = addresses(urls);
    if list.is_empty() {
        list.push(urls);
    }
    let n = list.len();
    let start = NEXT_ADDRESS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n;
    let mut tried = 0;
    loop {
        let at = (start + tried) % n;
        let props = ConnectionProperties::default().with_connection_name(name.into());
        let connected: Result<Connection, BrokerError> = match tuned(list[at]) {
            Ok(uri) => Connection::connect_uri(uri, props)
                .await
                .map_err(Into::into),
            Err(e) => Err(e),
        };
        match connected {
            Ok(conn) => return Ok(conn),
            Err(e) if tried + 1 >= n => return Err(e),
            Err(e) => {
                tracing::warn!(address = at + 1, of = n, error = %e, "broker address refused the connection; trying the next");
                tried += 1;
            }
        }
    }
}

#[cfg(test)]
mod address_tests {
    use super::*;
    use lapin::BasicProperties;
    use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    use std::time::Duration;

    #[test]
    fn a_list_of_addresses_is_split_at_commas_and_trimmed() {
        assert_eq!(
            addresses(" amqp://a:5672/%2f ,amqp://b:5673/%2f,"),
            vec!["amqp://a:5672/%2f", "amqp://b:5673/%2f"]
        );
        assert_eq!(addresses("amqp://a"), vec!["amqp://a"]);
    }

    /// Against the local stack's broker (`NOTIFY_AMQP_URL`, as `make test` sets it): a
    /// list whose other address is a closed port still connects, whichever address the
    /// round robin starts at; a list of closed ports fails.
    #[tokio::test]
    async fn connect_goes_on_to_the_next_address_when_one_node_is_down() {
        let live = std::env::var("NOTIFY_AMQP_URL").expect("NOTIFY_AMQP_URL (source .stack/env)");
        let live = addresses(&live)[0].to_string();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            drop(l);
            format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
        };
        let both = format!("{closed},{live}");
        for _ in 0..3 {
            let conn = connect(&both, "test-addresses")
                .await
                .expect("the live node");
            assert!(conn.status().connected());
            conn.close(200, "done".into()).await.unwrap();
        }
        let none = format!("{closed}, {closed}");
        assert!(connect(&none, "test-addresses").await.is_err());
        assert!(connect("not a url", "test-addresses").await.is_err());
    }

    /// Frames of at most [`FRAME_MAX`] bytes are agreed with the broker unless the URL asks
    /// for its own size; a message larger than a frame still arrives whole.
    #[tokio::test]
    async fn the_connection_agrees_on_small_frames_unless_the_url_names_its_own() {
        let live = std::env::var("NOTIFY_AMQP_URL").expect("NOTIFY_AMQP_URL (source .stack/env)");
        let live = addresses(&live)[0].to_string();
        let conn = connect(&live, "test-frames").await.expect("broker");
        assert_eq!(conn.configuration().frame_max(), FRAME_MAX);
        let ch = conn.create_channel().await.unwrap();
        let q = ch
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let body: Vec<u8> = (0..3 * FRAME_MAX).map(|i| (i % 251) as u8).collect();
        ch.basic_publish(
            "".into(),
            q.name().as_str().into(),
            BasicPublishOptions::default(),
            &body,
            BasicProperties::default(),
        )
        .await
        .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(m) = ch
                    .basic_get(
                        q.name().as_str().into(),
                        lapin::options::BasicGetOptions { no_ack: true },
                    )
                    .await
                    .unwrap()
                {
                    break m;
                }
                // Polling basic.get (no consumer here), bounded by the 10 s timeout.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the message back within 10 s");
        assert_eq!(got.delivery.data, body);
        conn.close(200, "done".into()).await.unwrap();

        let sep = if live.contains('?') { '&' } else { '?' };
        let own = connect(&format!("{live}{sep}frame_max=65536"), "test-frames")
            .await
            .expect("broker");
        assert_eq!(own.configuration().frame_max(), 65536);
        own.close(200, "done".into()).await.unwrap();
    }

    /// The connection agrees on a [`HEARTBEAT_S`] heartbeat (the broker's 60 s default
    /// would let a stopped process hold its unacknowledged messages for two minutes),
    /// unless the URL names its own.
    #[tokio::test]
    async fn the_connection_agrees_on_a_short_heartbeat_unless_the_url_names_its_own() {
        let live = std::env::var("NOTIFY_AMQP_URL").expect("NOTIFY_AMQP_URL (source .stack/env)");
        let live = addresses(&live)[0].to_string();
        let conn = connect(&live, "test-heartbeat").await.expect("broker");
        assert_eq!(conn.configuration().heartbeat(), HEARTBEAT_S);
        conn.close(200, "done".into()).await.unwrap();
        let sep = if live.contains('?') { '&' } else { '?' };
        let own = connect(&format!("{live}{sep}heartbeat=5"), "test-heartbeat")
            .await
            .expect("broker");
        assert_eq!(own.configuration().heartbeat(), 5);
        own.close(200, "done".into()).await.unwrap();
    }
}
