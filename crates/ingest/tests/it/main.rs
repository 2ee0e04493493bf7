//! The integration tests: one binary, so the platform's crates are linked once and the
//! shared harness (`support`) is compiled once. Each module is one area of promises; each
//! test starts a whole platform in-process on the local stack's real PostgreSQL, RabbitMQ
//! and MailDev (`make test` starts them), with its own database and queue prefix.

mod support;

mod browser;
mod callbacks;
mod cancel;
mod client_examples;
mod console;
mod data_rights;
mod decisions;
mod docs;
mod due_time;
mod email_failover;
mod email_format;
mod fallback;
mod fanout;
mod identifiers;
mod inbox;
mod inbox_rich;
mod intent_edges;
mod line_rich;
mod overview;
mod pipeline;
mod promises;
mod push;
mod push_rich;
mod recovery;
mod reference_receivers;
mod retention;
mod rich;
mod rich_edges;
mod scheduled;
mod security;
mod telemetry;
mod templates;
mod webhook_ops;
mod webhooks;
