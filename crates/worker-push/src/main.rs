//! `worker-push`: consumes `deliveries.push` and sends to push endpoints.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(notify_worker::main_with("worker-push", |env, pool| {
        // A missing variable is already recorded in `env`.
        let cfg = worker_push::PushConfig::from_env(env).ok()?;
        match worker_push::PushSender::new(cfg) {
            // The badge's unread count is read from the same database.
            Ok(s) => Some(match pool {
                Some(pool) => s.with_inbox(pool.clone()),
                None => s,
            }),
            Err(e) => {
                env.error(e.to_string());
                None
            }
        }
    })
    .await?)
}
