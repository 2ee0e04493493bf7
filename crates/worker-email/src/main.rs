//! `worker-email`: consumes `deliveries.email` and sends mail over SMTP.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(notify_worker::main_with("worker-email", |env, pool| {
        // A missing or bad variable is already recorded in `env`.
        let cfg = worker_email::EmailConfig::from_env(env)?;
        match worker_email::EmailSender::new(cfg) {
            Ok(s) => Some(match pool {
                Some(p) => s.with_states(p.clone()),
                None => s,
            }),
            Err(e) => {
                env.error(format!("NOTIFY_SMTP_URL is invalid: {e}"));
                None
            }
        }
    })
    .await?)
}
