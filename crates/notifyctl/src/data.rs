//! `notifyctl erase-recipient USER_ID` and `notifyctl export-recipient USER_ID`: the data
//! rights calls of `RecipientService` (`EraseRecipient`, `ExportRecipientData`), made to
//! the ingest at `NOTIFY_GRPC_URL` with `NOTIFY_API_KEY` (a key that may manage).

use anyhow::{Context, bail};
use notify_proto::v1 as pb;
use pb::recipient_service_client::RecipientServiceClient;
use std::io::Write;

/// Usage of both subcommands.
pub const USAGE: &str = "usage: notifyctl erase-recipient USER_ID\n       notifyctl export-recipient USER_ID [--out FILE]\n  erase-recipient deletes the user's contact data, endpoints, preferences and inbox, cancels\n  what is not sent yet and redacts the rest (docs/data.md); it prints what it did.\n  export-recipient writes everything held about the user as one JSON document to FILE\n  (default: stdout). Both call the ingest at NOTIFY_GRPC_URL with NOTIFY_API_KEY (manage scope).";

/// Runs `notifyctl <command> ARGS…` against `grpc_url`; returns the exit code (64 on a
/// usage error).
pub async fn run(grpc_url: &str, command: &str, args: &[String]) -> anyhow::Result<u8> {
    let Some(user_id) = args.first().filter(|a| !a.starts_with("--")) else {
        eprintln!("{USAGE}");
        return Ok(64);
    };
    let channel = tonic::transport::Endpoint::from_shared(grpc_url.to_string())?
        .connect()
        .await
        .with_context(|| format!("connecting to {grpc_url}"))?;
    let mut client = RecipientServiceClient::new(crate::keys::authed(channel));
    match command {
        "erase-recipient" => {
            let r = client
                .erase_recipient(pb::EraseRecipientRequest {
                    user_id: user_id.clone(),
                })
                .await
                .map_err(|s| anyhow::anyhow!("EraseRecipient: {}: {}", s.code(), s.message()))?
                .into_inner();
            println!(
                "erased (audit sha256 {}): recipient found: {}, deliveries canceled: {}, deliveries redacted: {}, attempts redacted: {}, inbox items deleted: {}, endpoints deleted: {}",
                r.user_id_sha256,
                r.recipient_found,
                r.deliveries_canceled,
                r.deliveries_redacted,
                r.attempts_redacted,
                r.inbox_deleted,
                r.endpoints_deleted
            );
            Ok(0)
        }
        "export-recipient" => {
            let out_path = match args.get(1).map(String::as_str) {
                Some("--out") => Some(args.get(2).context("--out needs a file name")?),
                Some(other) => bail!("unknown argument {other:?}\n{USAGE}"),
                None => None,
            };
            let mut out: Box<dyn Write> = match out_path {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p).with_context(|| format!("creating {p}"))?,
                )),
                None => Box::new(std::io::stdout().lock()),
            };
            let mut stream = client
                .export_recipient_data(pb::ExportRecipientDataRequest {
                    user_id: user_id.clone(),
                })
                .await
                .map_err(|s| anyhow::anyhow!("ExportRecipientData: {}: {}", s.code(), s.message()))?
                .into_inner();
            while let Some(chunk) = stream.message().await.map_err(|s| {
                anyhow::anyhow!("ExportRecipientData: {}: {}", s.code(), s.message())
            })? {
                out.write_all(&chunk.data)?;
            }
            out.write_all(b"\n")?;
            out.flush()?;
            Ok(0)
        }
        _ => bail!("unknown command {command:?}"),
    }
}
