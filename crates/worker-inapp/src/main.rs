//! `worker-inapp`: consumes `deliveries.inapp` and writes inbox rows.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Ok(notify_worker::main_with("worker-inapp", |_env, pool| {
        pool.map(|pool| worker_inapp::InAppSender::new(pool.clone()))
    })
    .await?)
}
