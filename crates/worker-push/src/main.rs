//! `worker-push`: consumes `deliveries.push` and sends to push endpoints.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    notify_worker::main_with(
        "worker-push",
        |env, _pool| match worker_push::PushSender::new(worker_push::PushConfig::from_env(env)) {
            Ok(s) => Some(s),
            Err(e) => {
                env.error(e.to_string());
                None
            }
        },
    )
    .await
}
