//! `provider-sim`: serves the LINE and FCM stand-ins (see the library docs).
//!
//! Environment: `SIM_ADDR` (127.0.0.1:58080), `SIM_LINE_CHANNEL_TOKEN` (required),
//! `SIM_LINE_CHANNEL_SECRET` (signs the webhooks it sends; empty by default),
//! `SIM_SMTP_ADDR` (empty: off; else the rejecting SMTP server of `provider_sim::smtp`),
//! `SIM_FCM_PUBLIC_KEY_FILE` (required, PEM public key of the service account), `SIM_FCM_PROJECT_ID`
//! (notify-local), `SIM_FCM_CLIENT_EMAIL` (required), `SIM_APNS_PUBLIC_KEY_FILE` (PEM public
//! key of the APNs signing key; without it APNs answers 403), `SIM_APNS_KEY_ID`,
//! `SIM_APNS_TEAM_ID`, `SIM_APNS_TOPIC`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    notify_telemetry::exit_if_help(
        "usage: provider-sim\n  a stand-in for LINE, FCM, APNs, Web Push and an SMTP server, for local runs and tests.\nConfiguration: environment variables, see README.",
    );
    notify_telemetry::init("provider-sim");
    let mut env = notify_telemetry::env();
    let addr = env.string("SIM_ADDR", "127.0.0.1:58080");
    let line_channel_token = env.required("SIM_LINE_CHANNEL_TOKEN");
    let fcm_public_key_pem = env.required("SIM_FCM_PUBLIC_KEY_FILE").map(|file| {
        std::fs::read_to_string(&file).unwrap_or_else(|e| {
            env.error(format!(
                "SIM_FCM_PUBLIC_KEY_FILE={file:?} cannot be read: {e}"
            ));
            String::new()
        })
    });
    let apns_key_file = env.string("SIM_APNS_PUBLIC_KEY_FILE", "");
    let apns_public_key_pem = if apns_key_file.is_empty() {
        String::new()
    } else {
        std::fs::read_to_string(&apns_key_file).unwrap_or_else(|e| {
            env.error(format!(
                "SIM_APNS_PUBLIC_KEY_FILE={apns_key_file:?} cannot be read: {e}"
            ));
            String::new()
        })
    };
    let apns_key_id = env.string("SIM_APNS_KEY_ID", "");
    let apns_team_id = env.string("SIM_APNS_TEAM_ID", "");
    let apns_topic = env.string("SIM_APNS_TOPIC", "");
    let line_channel_secret = env.string("SIM_LINE_CHANNEL_SECRET", "");
    let fcm_project_id = env.string("SIM_FCM_PROJECT_ID", "notify-local");
    let fcm_client_email = env.required("SIM_FCM_CLIENT_EMAIL");
    let smtp_addr = env.string("SIM_SMTP_ADDR", "");
    let cfg = (|| {
        Ok(provider_sim::SimConfig {
            apns_public_key_pem,
            apns_key_id,
            apns_team_id,
            apns_topic,
            line_channel_token: line_channel_token?,
            line_channel_secret,
            fcm_public_key_pem: fcm_public_key_pem?,
            fcm_project_id,
            fcm_client_email: fcm_client_email?,
        })
    })();
    let cfg = notify_telemetry::config_or_exit("provider-sim", env, cfg);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let shutdown = notify_telemetry::shutdown_on_signal();
    let smtp_sim = if smtp_addr.is_empty() {
        None
    } else {
        let smtp = tokio::net::TcpListener::bind(&smtp_addr).await?;
        tracing::info!(%smtp_addr, "provider-sim SMTP listening");
        let sim = provider_sim::smtp::SmtpSim::default();
        tokio::spawn(sim.clone().serve(smtp, shutdown.clone()));
        Some(sim)
    };
    tracing::info!(%addr, "provider-sim listening");
    provider_sim::serve_with_smtp(listener, cfg, smtp_sim, shutdown).await?;
    Ok(())
}
