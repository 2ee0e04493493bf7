//! `worker-line`: consumes `deliveries.line` and sends LINE push messages.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(notify_worker::main_with("worker-line", |env, _pool| {
        // A missing variable is already recorded in `env`.
        let cfg = worker_line::LineConfig::from_env(env).ok()?;
        match worker_line::LineSender::new(cfg) {
            Ok(s) => Some(s),
            Err(e) => {
                env.error(format!("cannot build the HTTP client: {e}"));
                None
            }
        }
    })
    .await?)
}
