//! Test harness: a whole platform per test, in-process, on the real PostgreSQL, RabbitMQ
//! and MailDev of the local stack (`make test` starts them with deploy/local-stack.sh).
//! Each test gets its own database, its own exchange/queue prefix and its own provider
//! simulator, so tests never see each other's work.

mod http;
mod observe;
mod process;
mod seed;
mod wait;
mod workers;

pub(crate) use http::{
    InboxClient, SendExt, console_login, csrf_token, hs256, inbox_token, line_webhook,
    no_redirects, postback, session_cookie,
};
pub(crate) use process::{Proc, free_addr};
pub(crate) use seed::{line_template, type_request};
pub(crate) use wait::{eventually, settle};

use notify_broker::Topology;
use notify_core::Channel;
use notify_proto::v1 as pb;
use serde_json::Value;
use sqlx::PgPool;
use std::collections::HashMap;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The fields an `INVALID_ARGUMENT` refusal names (its `BadRequest` field violations, in
/// order); panics on another code or when it carries none.
pub(crate) fn field_violations(err: &tonic::Status) -> Vec<String> {
    violations(err)
        .into_iter()
        .map(|(field, _)| field)
        .collect()
}

/// The violations of an `INVALID_ARGUMENT` refusal as (field, description), in order;
/// panics on another code or when it carries none.
pub(crate) fn violations(err: &tonic::Status) -> Vec<(String, String)> {
    use tonic_types::StatusExt;
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    err.get_details_bad_request()
        .expect("a BadRequest detail")
        .field_violations
        .into_iter()
        .map(|v| (v.field, v.description))
        .collect()
}

/// The `GetEvent` request of event `event_id` (the first page, of the default size).
pub(crate) fn event_request(event_id: &str) -> pb::GetEventRequest {
    pb::GetEventRequest {
        selector: Some(pb::get_event_request::Selector::EventId(event_id.into())),
        ..Default::default()
    }
}

/// Recorded clicks as (user id, action id, source), in their order.
pub(crate) fn click_triples(clicks: &[notify_store::clicks::Click]) -> Vec<(&str, &str, &str)> {
    clicks
        .iter()
        .map(|c| (c.user_id.as_str(), c.action_id.as_str(), c.source.as_str()))
        .collect()
}

/// The deliveries of `event` on `channel`, in the order `GetEvent` lists them.
pub(crate) fn on_channel<'e>(
    event: &'e pb::GetEventResponse,
    channel: &str,
) -> Vec<&'e pb::Delivery> {
    event
        .deliveries
        .iter()
        .filter(|d| d.channel == channel)
        .collect()
}

/// `user`'s delivery in `event` (the first, where the user has several); panics if there
/// is none.
pub(crate) fn delivery_of(event: &pb::GetEventResponse, user: &str) -> pb::Delivery {
    event
        .deliveries
        .iter()
        .find(|d| d.user_id == user)
        .unwrap_or_else(|| panic!("no delivery for {user}: {event:?}"))
        .clone()
}

/// Asserts that `delivery` was sent, showing it whole otherwise.
pub(crate) fn assert_sent(delivery: &pb::Delivery) {
    assert_eq!(delivery.status, "sent", "{delivery:?}");
}

/// A delivery's status and attempt count, to assert both in one `assert_eq!`.
pub(crate) fn status_attempts(delivery: &pb::Delivery) -> (&str, u32) {
    (delivery.status.as_str(), delivery.attempts)
}

/// Asserts that every delivery of `event` was sent, showing them all otherwise.
pub(crate) fn assert_all_sent(event: &pb::GetEventResponse) {
    assert!(
        event.deliveries.iter().all(|d| d.status == "sent"),
        "{:?}",
        event.deliveries
    );
}

/// Addresses of the local stack.
#[derive(Debug, Clone)]
pub(crate) struct Stack {
    pub admin_db_url: String,
    pub amqp_url: String,
    pub smtp_url: String,
    pub maildev_url: String,
    pub fcm_key_file: String,
    pub fcm_public_key_file: String,
    pub apns_key_file: String,
    pub apns_public_key_file: String,
    pub vapid_key_file: String,
    /// node_modules holding playwright-core, and Chromium (browser tests).
    pub browser_modules: String,
    pub chromium: String,
    /// With `NOTIFY_TEST_VIA_PGBOUNCER=1`: the pooler's `postgres://user@host:port` (from
    /// `NOTIFY_PGBOUNCER_URL`, which `deploy/local-stack.sh pgbouncer up` writes to
    /// `$NOTIFY_STACK_DIR/pgbouncer/env`). The platform's pool (ingest, http-api, workers
    /// and the tests' own queries) then goes through it; migrations, which hold a session
    /// advisory lock, the `LISTEN` connections and the retention pass
    /// (`Platform::session_pool`) and out-of-process binaries (`Platform::db_url`) connect
    /// directly.
    pub pgbouncer_url: Option<String>,
}

/// The environment, completed by the stack's env file (`$NOTIFY_STACK_DIR/env` or
/// `.stack/env`): a variable set in the environment wins.
pub(crate) fn stack_env() -> HashMap<String, String> {
    let mut vars: HashMap<String, String> = std::env::vars().collect();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.stack/env");
    let dir = std::env::var("NOTIFY_STACK_DIR").map(|d| std::path::PathBuf::from(d).join("env"));
    let text = std::fs::read_to_string(dir.unwrap_or(file)).unwrap_or_default();
    for line in text.lines() {
        if let Some((k, v)) = line.trim_start_matches("export ").split_once('=') {
            vars.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
    }
    vars
}

impl Stack {
    /// Reads the stack's addresses from the environment or `.stack/env`. Panics with the
    /// command to run when the stack is not up: these tests never skip.
    pub(crate) fn get() -> Stack {
        let vars = stack_env();
        let get = |k: &str| {
            vars.get(k).cloned().unwrap_or_else(|| {
                panic!("{k} is not set: run `make test` (it starts the local stack) or `deploy/local-stack.sh up`")
            })
        };
        Stack {
            admin_db_url: get("NOTIFY_TEST_DATABASE_URL"),
            amqp_url: get("NOTIFY_AMQP_URL"),
            smtp_url: get("NOTIFY_SMTP_URL"),
            maildev_url: get("NOTIFY_MAILDEV_URL"),
            fcm_key_file: get("NOTIFY_FCM_SERVICE_ACCOUNT_FILE"),
            fcm_public_key_file: get("NOTIFY_FCM_PUBLIC_KEY_FILE"),
            apns_key_file: get("NOTIFY_APNS_KEY_FILE"),
            apns_public_key_file: get("NOTIFY_APNS_PUBLIC_KEY_FILE"),
            vapid_key_file: get("NOTIFY_VAPID_PRIVATE_KEY_FILE"),
            browser_modules: get("NOTIFY_BROWSER_MODULES"),
            chromium: get("NOTIFY_CHROMIUM"),
            pgbouncer_url: match vars.get("NOTIFY_TEST_VIA_PGBOUNCER").map(String::as_str) {
                None | Some("" | "0") => None,
                Some("1") => Some(vars.get("NOTIFY_PGBOUNCER_URL").cloned().unwrap_or_else(|| {
                    panic!("NOTIFY_TEST_VIA_PGBOUNCER=1 needs NOTIFY_PGBOUNCER_URL: run `deploy/local-stack.sh pgbouncer up` and source $NOTIFY_STACK_DIR/pgbouncer/env")
                })),
                Some(other) => panic!("NOTIFY_TEST_VIA_PGBOUNCER={other:?}: use 1 (through pgbouncer) or 0"),
            },
        }
    }
}

pub(crate) const LINE_TOKEN: &str = "test-line-channel-token";
pub(crate) const APNS_KEY_ID: &str = "TESTKEY001";
pub(crate) const APNS_TEAM_ID: &str = "TESTTEAM01";
pub(crate) const APNS_TOPIC: &str = "th.example.shop";
pub(crate) const LINE_SECRET: &str = "test-line-channel-secret";
pub(crate) const CONSOLE_USER: &str = "ops";
pub(crate) const CONSOLE_PASSWORD: &str = "correct horse battery staple";
pub(crate) const INBOX_SECRET: &str = "test-inbox-jwt-secret-at-least-32-bytes";
pub(crate) const UNSUBSCRIBE_SECRET: &str = "test-unsubscribe-signing-secret";
pub(crate) const VAPID_SUBJECT: &str = "mailto:ops@shop.example.test";

/// A unique id with a readable prefix, so tests sharing MailDev never collide.
pub(crate) fn uniq(prefix: &str) -> String {
    format!("{prefix}-{}", &Uuid::new_v4().simple().to_string()[..8])
}

/// A random, well-formed LINE user id.
pub(crate) fn line_id() -> String {
    format!("U{}", Uuid::new_v4().simple())
}

/// What to start.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub workers: Vec<Channel>,
    pub retry_delays: Vec<Duration>,
    pub lease: Duration,
    pub concurrency: u16,
    pub republish_after: Duration,
    /// How often ingest rolls up the console's delivery counts.
    pub counts_rollup_interval: Duration,
    /// Connections of the workers' own pool (5 when unset).
    pub worker_pool_size: Option<u32>,
    /// The email worker sends to the simulator's SMTP server (rejections by recipient
    /// name) instead of MailDev.
    pub smtp_sim: bool,
    /// Further email providers after the first (comma-joined into `NOTIFY_SMTP_URL`).
    pub email_backups: Vec<String>,
    /// The email providers' circuit breakers.
    pub email_breaker: worker_email::breaker::BreakerConfig,
    /// Provider calls per second per worker (none by default).
    pub rate_limits: std::collections::BTreeMap<String, u32>,
    /// Fatigue caps per channel (none by default).
    pub fatigue_caps: std::collections::BTreeMap<Channel, u32>,
    /// Run ingest in-process (default). When false, the test starts an `ingest` process
    /// on [`Platform::grpc_addr`] itself (see [`Platform::spawn`]).
    pub ingest_in_process: bool,
    /// Caller authentication (`Off` by default; the auth tests turn it on).
    pub auth: ingest::auth::AuthMode,
    /// TLS for the in-process ingest.
    pub tls: Option<ingest::TlsFiles>,
    /// The instant the in-process ingest plans at (the database's clock by default).
    pub clock: ingest::clock::Clock,
    /// The link policy of ingest and the workers: https only, and the app scheme
    /// `myshop` for deep links.
    pub links: notify_core::links::LinkPolicy,
    /// The in-process ingest's retention purge (a pass an hour by default: tests that
    /// purge call `notify_store::retention::purge` themselves or set this).
    pub retention: ingest::RetentionConfig,
    /// Deliveries of one channel a relay message names at most (the production default).
    pub deliveries_per_message: usize,
    /// Group-commit writers of the in-process ingest: four, not the default one, so the
    /// tests show the promises that must hold with several group commits in flight (a
    /// replica configured so, or several replicas).
    pub ingest_writers: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            workers: Channel::ALL.to_vec(),
            retry_delays: vec![Duration::from_millis(300)],
            lease: Duration::from_secs(30),
            concurrency: 8,
            republish_after: Duration::from_secs(2),
            counts_rollup_interval: Duration::from_secs(1),
            worker_pool_size: None,
            smtp_sim: false,
            email_backups: Vec::new(),
            email_breaker: Default::default(),
            rate_limits: Default::default(),
            fatigue_caps: Default::default(),
            ingest_in_process: true,
            auth: ingest::auth::AuthMode::Off,
            tls: None,
            clock: ingest::clock::Clock::Database,
            links: test_links(),
            retention: ingest::RetentionConfig {
                interval: Duration::from_secs(3600),
                ..Default::default()
            },
            deliveries_per_message: ingest::relay::DELIVERIES_PER_MESSAGE,
            ingest_writers: 4,
        }
    }
}

impl Options {
    /// The default options with only `workers` running (none: the test runs its own, or
    /// none at all); the setters below change one field each, as a struct update would.
    pub(crate) fn workers(workers: &[Channel]) -> Self {
        Self {
            workers: workers.to_vec(),
            ..Default::default()
        }
    }
}

/// `Options::field(value)` setters for the fields tests set most, so a test's start reads
/// as one line: `Options::workers(&[Channel::Line]).lease(Duration::from_secs(2))`.
macro_rules! option_setters {
    ($($field:ident: $ty:ty),* $(,)?) => {
        impl Options {
            $(
                #[doc = concat!("These options with `", stringify!($field), "` set.")]
                pub(crate) fn $field(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

option_setters! {
    auth: ingest::auth::AuthMode,
    clock: ingest::clock::Clock,
    concurrency: u16,
    counts_rollup_interval: Duration,
    email_backups: Vec<String>,
    fatigue_caps: std::collections::BTreeMap<Channel, u32>,
    ingest_in_process: bool,
    lease: Duration,
    retry_delays: Vec<Duration>,
    smtp_sim: bool,
    worker_pool_size: Option<u32>,
}

/// The in-process ingest's settings for a platform.
fn ingest_config(stack: &Stack, topology: &Topology, opts: &Options) -> ingest::IngestConfig {
    ingest::IngestConfig {
        relay: ingest::relay::RelayConfig {
            amqp_url: stack.amqp_url.clone(),
            topology: topology.clone(),
            batch: 500,
            deliveries_per_message: opts.deliveries_per_message,
            poll: Duration::from_millis(500),
            hold: Duration::from_secs(30),
            confirm_timeout: Duration::from_secs(10),
            retry_in: Duration::from_secs(1),
        },
        max_attempts: 5,
        request_timeout: Duration::from_secs(30),
        sweep_interval: Duration::from_secs(1),
        writers: opts.ingest_writers,
        write_batch: 200,
        sweep_batch: 500,
        republish_after: opts.republish_after,
        counts_rollup_interval: opts.counts_rollup_interval,
        fatigue_caps: opts.fatigue_caps.clone(),
        drain: Duration::ZERO,
        metrics_interval: Duration::from_secs(15),
        auth: opts.auth,
        tls: opts.tls.clone(),
        links: opts.links.clone(),
        max_message_bytes: 1 << 20,
        clock: opts.clock.clone(),
        schedule_horizon: Duration::from_secs(30 * 86_400),
        retention: opts.retention.clone(),
    }
}

/// The tests' link policy: the app scheme `myshop`, and the Web Push subscriptions on
/// push.example.test (served by the simulator through its base override) besides the
/// known push services.
pub(crate) fn test_links() -> notify_core::links::LinkPolicy {
    notify_core::links::LinkPolicy {
        http_hosts: Vec::new(),
        deep_link_schemes: vec!["myshop".into()],
        web_push_hosts: std::iter::once("push.example.test")
            .chain(notify_core::links::KNOWN_PUSH_SERVICES)
            .map(String::from)
            .collect(),
    }
}

/// The in-process http-api's settings for a platform (the console's session cookie
/// without `Secure`: tests and the browser speak plain http to 127.0.0.1).
pub(crate) fn http_config(stack: &Stack, topology: &Topology) -> http_api::HttpConfig {
    http_api::HttpConfig {
        email_events: Default::default(),
        line_channel_secret: LINE_SECRET.into(),
        unsubscribe_secret: UNSUBSCRIBE_SECRET.into(),
        unsubscribe_ttl: http_api::DEFAULT_UNSUBSCRIBE_TTL,
        inbox: http_api::inbox::InboxConfig {
            jwt_secret: Some(INBOX_SECRET.into()),
            jwks_json: None,
            jwks_url: None,
            rate_per_user: 20,
            ..Default::default()
        },
        cors_origins: vec!["https://app.example.test".into()],
        console: http_api::console::ConsoleConfig {
            users: vec![(
                CONSOLE_USER.into(),
                http_api::console::password_hash(CONSOLE_PASSWORD),
            )],
            secret: "test-console-session-secret-32-chars-min".into(),
            auth_header: None,
            amqp: Some((stack.amqp_url.clone(), topology.clone())),
            insecure_cookies: true,
            ..Default::default()
        },
        links: test_links(),
    }
}

/// A running platform.
pub(crate) struct Platform {
    pub stack: Stack,
    pub db_name: String,
    pub db_url: String,
    pub pool: PgPool,
    /// The pool of the `LISTEN` connections and the retention pass: `pool` itself, or the
    /// direct one with `NOTIFY_TEST_VIA_PGBOUNCER=1`.
    pub session_pool: PgPool,
    pub topology: Topology,
    /// The exchange and queue name prefix of this platform (`NOTIFY_AMQP_PREFIX`).
    pub amqp_prefix: String,
    /// Where ingest's gRPC API listens.
    pub grpc_addr: std::net::SocketAddr,
    pub grpc: tonic::transport::Channel,
    pub sim_url: String,
    /// Base URL of the in-process `http-api`.
    pub http_url: String,
    /// The simulator's SMTP server and its URL.
    pub smtp_sim: provider_sim::smtp::SmtpSim,
    pub smtp_sim_url: String,
    pub http: reqwest::Client,
    pub opts: Options,
    shutdown: CancellationToken,
    worker_shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    service_account_file: tempfile_path::TempPath,
}

mod tempfile_path {
    /// A file deleted on drop.
    pub(super) struct TempPath(pub std::path::PathBuf);
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Platform {
    /// Starts a platform with the default [`Options`]: every channel's worker.
    pub(crate) async fn start() -> Platform {
        Self::start_with(Options::default()).await
    }

    /// Starts a platform with the default [`Options`] but only the workers of `workers`
    /// (none for `&[]`: deliveries are planned and queued, never sent).
    pub(crate) async fn start_with_workers(workers: &[Channel]) -> Platform {
        Self::start_with(Options {
            workers: workers.to_vec(),
            ..Default::default()
        })
        .await
    }

    /// [`Platform::start_with_workers`], then registers the type `key` on `channels`.
    pub(crate) async fn start_with_type(
        workers: &[Channel],
        key: &str,
        channels: &[&str],
    ) -> Platform {
        let p = Self::start_with_workers(workers).await;
        p.add_type(key, channels).await;
        p
    }

    /// Starts a platform as `opts` says: a new migrated database, its own broker prefix,
    /// provider simulator and SMTP simulator, ingest in-process (unless
    /// `opts.ingest_in_process` is false) and http-api, then the workers of `opts.workers`.
    pub(crate) async fn start_with(opts: Options) -> Platform {
        notify_telemetry::init_for_tests();
        let stack = Stack::get();
        let id = Uuid::new_v4().simple().to_string()[..12].to_string();

        // Database.
        let admin = PgPool::connect(&stack.admin_db_url)
            .await
            .expect("admin connection");
        let db_name = format!("notify_t_{id}");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db_name}")))
            .execute(&admin)
            .await
            .expect("create database");
        admin.close().await;
        let db_url = format!(
            "{}/{db_name}",
            stack.admin_db_url.rsplit_once('/').unwrap().0
        );
        let mut cfg = notify_store::PoolConfig::new(db_url.clone());
        cfg.max_connections = 20;
        let pool = notify_store::connect(&cfg).expect("pool");
        notify_store::migrate(&pool).await.expect("migrate");
        // Through pgbouncer, the LISTEN connections and the retention pass keep the direct
        // pool (notify_store::Pools::session), as NOTIFY_DATABASE_DIRECT_URL gives them.
        let (pool, session_pool) = match &stack.pgbouncer_url {
            None => (pool.clone(), pool),
            Some(pooler) => {
                let mut cfg = notify_store::PoolConfig::new(format!("{pooler}/{db_name}"));
                cfg.max_connections = 20;
                cfg.pooler = notify_store::Pooler::PgBouncer;
                let pooled = notify_store::connect(&cfg).expect("pool through pgbouncer");
                (pooled, pool)
            }
        };

        let shutdown = CancellationToken::new();
        let worker_shutdown = CancellationToken::new();
        let mut tasks = Vec::new();

        // Provider simulator.
        let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim_url = format!("http://{}", sim_listener.local_addr().unwrap());
        let sim_cfg = provider_sim::SimConfig {
            line_channel_token: LINE_TOKEN.into(),
            line_channel_secret: LINE_SECRET.into(),
            fcm_public_key_pem: std::fs::read_to_string(&stack.fcm_public_key_file)
                .expect("fcm public key"),
            fcm_project_id: "notify-local".into(),
            fcm_client_email: "notify@notify-local.iam.gserviceaccount.com".into(),
            apns_public_key_pem: std::fs::read_to_string(&stack.apns_public_key_file)
                .expect("apns public key"),
            apns_key_id: APNS_KEY_ID.into(),
            apns_team_id: APNS_TEAM_ID.into(),
            apns_topic: APNS_TOPIC.into(),
        };
        let s = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            provider_sim::serve(sim_listener, sim_cfg, s).await.unwrap();
        }));

        // A service-account key whose token_uri is this test's simulator.
        let mut key: Value =
            serde_json::from_str(&std::fs::read_to_string(&stack.fcm_key_file).unwrap()).unwrap();
        key["token_uri"] = Value::String(format!("{sim_url}/token"));
        let key_path = std::env::temp_dir().join(format!("notify-fcm-{id}.json"));
        std::fs::write(&key_path, key.to_string()).unwrap();

        // Ingest.
        let topology = Topology::new(format!("t{id}."));
        let ingest_cfg = ingest_config(&stack, &topology, &opts);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc_addr = listener.local_addr().unwrap();
        let grpc_url = format!("http://{grpc_addr}");
        if opts.ingest_in_process {
            let p = notify_store::Pools {
                main: pool.clone(),
                session: session_pool.clone(),
            };
            let s = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                ingest::run(ingest_cfg, p, listener, s).await.unwrap();
            }));
        } else {
            // Free the port for the test's own ingest process.
            drop(listener);
        }
        let grpc = tonic::transport::Endpoint::from_shared(grpc_url)
            .unwrap()
            .connect_lazy();

        // The simulator's SMTP server.
        let smtp_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let smtp_sim_url = format!("smtp://{}", smtp_listener.local_addr().unwrap());
        let smtp_sim = provider_sim::smtp::SmtpSim::default();
        let (sim2, s) = (smtp_sim.clone(), shutdown.clone());
        tasks.push(tokio::spawn(
            async move { sim2.serve(smtp_listener, s).await },
        ));

        // The HTTP service (LINE webhook, unsubscribe).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http_url = format!("http://{}", listener.local_addr().unwrap());
        let http_cfg = http_config(&stack, &topology);
        let p = notify_store::Pools {
            main: pool.clone(),
            session: session_pool.clone(),
        };
        let s = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            http_api::serve(listener, p, http_cfg, s).await.unwrap();
        }));

        let platform = Platform {
            stack,
            db_name,
            db_url,
            pool,
            session_pool,
            topology,
            amqp_prefix: format!("t{id}."),
            grpc_addr,
            grpc,
            sim_url,
            http_url,
            smtp_sim,
            smtp_sim_url,
            http: reqwest::Client::new(),
            opts: opts.clone(),
            shutdown,
            worker_shutdown,
            tasks,
            workers: Vec::new(),
            service_account_file: tempfile_path::TempPath(key_path),
        };
        let mut platform = platform;
        for ch in opts.workers.clone() {
            platform.start_worker(ch);
        }
        platform
    }

    /// Starts another http-api on this platform's database with `cfg` (a replica, or the
    /// service after a restart: nothing of the first one's memory) and returns its base
    /// URL. It stops with the platform.
    pub(crate) async fn start_http_api(&mut self, cfg: http_api::HttpConfig) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (p, s) = (self.pool.clone(), self.shutdown.clone());
        self.tasks.push(tokio::spawn(async move {
            http_api::serve(listener, p, cfg, s).await.unwrap();
        }));
        url
    }

    /// A client of ingest's `IngestService` on this platform.
    pub(crate) fn ingest(
        &self,
    ) -> pb::ingest_service_client::IngestServiceClient<tonic::transport::Channel> {
        pb::ingest_service_client::IngestServiceClient::new(self.grpc.clone())
    }

    /// A client of ingest's `RecipientService` on this platform.
    pub(crate) fn recipients(
        &self,
    ) -> pb::recipient_service_client::RecipientServiceClient<tonic::transport::Channel> {
        pb::recipient_service_client::RecipientServiceClient::new(self.grpc.clone())
    }

    /// A client of ingest's `TopicService` on this platform.
    pub(crate) fn topics(
        &self,
    ) -> pb::topic_service_client::TopicServiceClient<tonic::transport::Channel> {
        pb::topic_service_client::TopicServiceClient::new(self.grpc.clone())
    }

    /// A client of ingest's `TypeService` on this platform.
    pub(crate) fn types(
        &self,
    ) -> pb::type_service_client::TypeServiceClient<tonic::transport::Channel> {
        pb::type_service_client::TypeServiceClient::new(self.grpc.clone())
    }

    /// `CreateEvent` for `req` (a request or one wrapped with [`with_key`]); panics with
    /// the status on an error.
    pub(crate) async fn create_event(
        &self,
        req: impl tonic::IntoRequest<pb::CreateEventRequest>,
    ) -> pb::CreateEventResponse {
        self.ingest()
            .create_event(req)
            .await
            .expect("CreateEvent")
            .into_inner()
    }

    /// `CreateEvent` for `req`, then waits (30 s at most) until every delivery is final and
    /// asserts each was sent; returns the created event and its final state.
    pub(crate) async fn deliver_all(
        &self,
        req: pb::CreateEventRequest,
    ) -> (pb::CreateEventResponse, pb::GetEventResponse) {
        let created = self.create_event(req).await;
        let done = self.wait_final(&created.event_id, 30).await;
        assert_all_sent(&done);
        (created, done)
    }

    /// `CreateEvent` for the standard request [`Platform::event`]; panics on an error.
    pub(crate) async fn send(
        &self,
        key: &str,
        type_key: &str,
        recipients: &[&str],
    ) -> pb::CreateEventResponse {
        self.create_event(self.event(key, type_key, recipients))
            .await
    }

    /// The standard `CreateEvent` request: key `key`, type `type_key`, `recipients`, actor
    /// `tests`, the order-paid payload and Thai content with an https link; no channels,
    /// topic or aggregate key.
    pub(crate) fn event(
        &self,
        key: &str,
        type_key: &str,
        recipients: &[&str],
    ) -> pb::CreateEventRequest {
        pb::CreateEventRequest {
            event_key: key.into(),
            r#type: type_key.into(),
            actor_id: "tests".into(),
            recipients: recipients.iter().map(|r| r.to_string()).collect(),
            payload: r#"{"order_id":1001}"#.into(),
            content: Some(pb::Content {
                title: "ชำระเงินแล้ว #1001".into(),
                body: "ขอบคุณที่ใช้บริการ".into(),
                url: "https://shop.example.test/orders/1001".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// [`Platform::event`] broadcast to `topic`'s subscribers (no listed recipients).
    pub(crate) fn topic_event(
        &self,
        key: &str,
        type_key: &str,
        topic: &str,
    ) -> pb::CreateEventRequest {
        pb::CreateEventRequest {
            topic: topic.into(),
            ..self.event(key, type_key, &[])
        }
    }

    /// [`Platform::event`] with rich content: an https image and two actions (a "view
    /// order" link and a `myshop://` deep link), as every channel's rich-content test
    /// sends it.
    pub(crate) fn rich_event(
        &self,
        key: &str,
        type_key: &str,
        recipients: &[&str],
    ) -> pb::CreateEventRequest {
        let mut r = self.event(key, type_key, recipients);
        let c = r.content.as_mut().expect("content");
        c.image_url = "https://cdn.shop.example.test/orders/1001.png".into();
        c.actions = vec![
            pb::Action {
                id: "view".into(),
                label: "ดูคำสั่งซื้อ".into(),
                url: "https://shop.example.test/orders/1001".into(),
            },
            pb::Action {
                id: "track".into(),
                label: "ติดตามพัสดุ".into(),
                url: "myshop://orders/1001/track".into(),
            },
        ];
        r
    }

    /// Polls GetEvent until no delivery is pending or sending (at most `secs`).
    pub(crate) async fn wait_final(&self, event_id: &str, secs: u64) -> pb::GetEventResponse {
        let what = format!("every delivery of event {event_id} final");
        eventually(&what, Duration::from_secs(secs), async || {
            let ev = self.get_event(event_id).await;
            if ev
                .deliveries
                .iter()
                .all(|d| d.status != "pending" && d.status != "sending")
            {
                Ok(ev)
            } else {
                Err(ev.deliveries)
            }
        })
        .await
    }

    /// GetEvent by id (first page of deliveries); panics on an error.
    pub(crate) async fn get_event(&self, event_id: &str) -> pb::GetEventResponse {
        self.ingest()
            .get_event(event_request(event_id))
            .await
            .expect("get event")
            .into_inner()
    }

    /// Stops the workers gracefully (as on SIGTERM) and waits until they returned; new
    /// workers can be started afterwards.
    pub(crate) async fn stop_workers(&mut self) {
        self.worker_shutdown.cancel();
        for w in self.workers.drain(..) {
            tokio::time::timeout(Duration::from_secs(20), w)
                .await
                .expect("worker stopped within its grace period")
                .expect("worker task ended without panicking");
        }
        self.worker_shutdown = CancellationToken::new();
    }

    /// Stops everything gracefully (each task gets its grace period) and removes the
    /// database and broker objects. Dropping the platform does the same without the
    /// grace period, so a test that ends (or fails) leaves nothing behind either way.
    pub(crate) async fn stop(mut self) {
        self.worker_shutdown.cancel();
        self.shutdown.cancel();
        for t in self.workers.drain(..).chain(self.tasks.drain(..)) {
            let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
        }
        self.pool.close().await;
        self.session_pool.close().await;
    }
}

impl Drop for Platform {
    /// Cancels and aborts what is still running, then deletes this platform's broker
    /// objects and drops its database, on a thread of its own (a drop cannot await, and a
    /// single-threaded test runtime would not run the cleanup while it is blocked here).
    fn drop(&mut self) {
        self.worker_shutdown.cancel();
        self.shutdown.cancel();
        for t in self.workers.drain(..).chain(self.tasks.drain(..)) {
            t.abort();
        }
        let (amqp_url, admin_db_url) =
            (self.stack.amqp_url.clone(), self.stack.admin_db_url.clone());
        let (topology, db_name) = (self.topology.clone(), self.db_name.clone());
        let cleanup = async move {
            if let Ok(conn) = notify_broker::connect(&amqp_url, "tests-cleanup").await
                && let Ok(ch) = conn.create_channel().await
            {
                let _ = topology.delete(&ch, &ingest::relay::QUEUE_CHANNELS).await;
            }
            if let Ok(admin) = PgPool::connect(&admin_db_url).await {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"
                )))
                .execute(&admin)
                .await;
            }
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the cleanup")
                    .block_on(cleanup)
            });
        });
    }
}

impl Platform {
    /// Starts another in-process ingest replica on the same database and broker; returns
    /// a channel to it. It stops with the platform.
    pub(crate) async fn start_ingest_replica(&mut self) -> tonic::transport::Channel {
        let cfg = ingest_config(&self.stack, &self.topology, &self.opts);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let p = notify_store::Pools {
            main: self.pool.clone(),
            session: self.session_pool.clone(),
        };
        let s = self.shutdown.clone();
        self.tasks.push(tokio::spawn(async move {
            ingest::run(cfg, p, listener, s).await.unwrap();
        }));
        tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect_lazy()
    }
}

/// `msg` with `authorization: Bearer <key>` metadata, as a caller holding that API key
/// sends it.
pub(crate) fn with_key<T>(msg: T, key: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    req
}

/// Creates an API key `name` allowed every type (manage scope when `manage`), 1,000
/// events/s and 1,000 recipients per event; returns the key text.
pub(crate) async fn api_key(p: &Platform, name: &str, manage: bool) -> String {
    notify_store::api_keys::create(
        &p.pool,
        &notify_store::api_keys::NewApiKey {
            name: name.into(),
            send_types: vec!["*".into()],
            can_manage: manage,
            events_per_second: 1000,
            max_recipients: 1000,
        },
    )
    .await
    .unwrap()
    .0
}

/// Waits until ingest accepts every one of `keys`: each key's creation reloads ingest's key
/// cache on a notification of its own, so one key working says nothing of the keys made
/// after it. A cancel of an unknown event answers NOT_FOUND to a known key.
pub(crate) async fn wait_keys_work(p: &Platform, keys: &[&str]) {
    for key in keys {
        eventually("the key works", Duration::from_secs(5), async || {
            let target = pb::cancel_event_request::Target::EventId(Uuid::new_v4().to_string());
            match p
                .ingest()
                .cancel_event(with_key(cancel_req(target, &[]), key))
                .await
            {
                Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
                other => Err(other.map(|_| ()).map_err(|s| s.code())),
            }
        })
        .await;
    }
}

/// A platform with API keys required and no workers, and three keys that work: `ops-admin`
/// (may manage), `shop-orders` and `forum-replies` (two callers kept apart); the in-app
/// types `types` are registered with the admin key. Returns (platform, admin, shop,
/// forum).
pub(crate) async fn two_callers(types: &[&str]) -> (Platform, String, String, String) {
    let p = Platform::start_with(Options::workers(&[]).auth(ingest::auth::AuthMode::ApiKey)).await;
    let admin = api_key(&p, "ops-admin", true).await;
    let shop = api_key(&p, "shop-orders", false).await;
    let forum = api_key(&p, "forum-replies", false).await;
    let mut client = p.types();
    for t in types {
        eventually("the admin key works", Duration::from_secs(5), async || {
            client
                .upsert_notification_type(with_key(seed::type_request(t, &["inapp"]), &admin))
                .await
                .map(|_| ())
        })
        .await;
    }
    wait_keys_work(&p, &[&shop, &forum]).await;
    (p, admin, shop, forum)
}

/// A `CancelEvent` request for `target`, for `recipients` only when not empty.
pub(crate) fn cancel_req(
    target: notify_proto::v1::cancel_event_request::Target,
    recipients: &[&str],
) -> pb::CancelEventRequest {
    pb::CancelEventRequest {
        target: Some(target),
        recipients: recipients.iter().map(|r| r.to_string()).collect(),
    }
}

/// `CancelEvent` as the test caller; panics on an error.
pub(crate) async fn cancel(
    p: &Platform,
    target: notify_proto::v1::cancel_event_request::Target,
    recipients: &[&str],
) -> pb::CancelEventResponse {
    p.ingest()
        .cancel_event(cancel_req(target, recipients))
        .await
        .expect("CancelEvent")
        .into_inner()
}

/// `CancelEvent` of `target` (every recipient) sent with API key `key`; panics on an
/// error.
pub(crate) async fn cancel_as(
    p: &Platform,
    target: notify_proto::v1::cancel_event_request::Target,
    key: &str,
) -> pb::CancelEventResponse {
    p.ingest()
        .cancel_event(with_key(cancel_req(target, &[]), key))
        .await
        .expect("CancelEvent")
        .into_inner()
}

/// The database's clock now (`clock_timestamp()`, not the transaction's `now()`).
pub(crate) async fn db_now(p: &Platform) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&p.pool)
        .await
        .unwrap()
}
