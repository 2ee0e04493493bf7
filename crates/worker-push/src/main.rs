//! `worker-push`: consumes `deliveries.push` and sends to push endpoints.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    notify_worker::main_with("worker-push", |env, _pool| {
        // A missing variable is already recorded in `env`.
        let cfg = worker_push::PushConfig::from_env(env).ok()?;
        match worker_push::PushSender::new(cfg) {
            Ok(s) => Some(s),
            Err(e) => {
                env.error(e.to_string());
                None
            }
        }
    })
    .await
}
