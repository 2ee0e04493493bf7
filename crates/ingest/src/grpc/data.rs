//! The data rights of `RecipientService` (PDPA): `GetRecipient`, `EraseRecipient`
//! (`notify_store::erasure`) and `ExportRecipientData`, one JSON document streamed from
//! paged reads (`notify_store::export`). All need a key that may manage.

use super::Services;
use crate::auth::Caller;
use crate::convert::count32;
use crate::convert::ts;
use crate::error::ApiError;
use notify_core::validate::Violations;
use notify_proto::v1 as pb;
use notify_store::{erasure, export};
use std::pin::Pin;
use tonic::Status;
use uuid::Uuid;

/// Rows per page of the export's inbox and delivery reads: what the server holds of one
/// export at a time (with [`EXPORT_CHUNKS_AHEAD`] chunks queued for the client).
pub(super) const EXPORT_PAGE: i64 = 200;
/// Chunks written ahead of a slow client before the export waits for it.
pub(super) const EXPORT_CHUNKS_AHEAD: usize = 4;

/// The stream `ExportRecipientData` answers.
pub(super) type ExportStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<pb::ExportRecipientDataChunk, Status>> + Send>>;

/// The request's user id by the one id rule, NFC-normalised
/// ([`Violations::id`]).
fn user_id_of(user_id: &str) -> Result<String, ApiError> {
    let mut v = Violations::default();
    let id = v.id("user_id", user_id, 255);
    v.into_result(id.unwrap_or_default())
        .map_err(ApiError::Invalid)
}

impl Services {
    pub(super) async fn get_recipient(
        &self,
        mut r: pb::GetRecipientRequest,
    ) -> Result<pb::GetRecipientResponse, ApiError> {
        r.user_id = user_id_of(&r.user_id)?;
        let v = notify_store::catalog::get_recipient(&self.pool, &r.user_id)
            .await?
            .ok_or(ApiError::NotFound {
                kind: "recipient",
                name: r.user_id,
            })?;
        Ok(pb::GetRecipientResponse {
            user_id: v.recipient.user_id,
            display_name: v.recipient.display_name,
            email: v.recipient.email.unwrap_or_default(),
            line_user_id: v.recipient.line_user_id.unwrap_or_default(),
            locale: v.recipient.locale,
            timezone: v.recipient.timezone,
            email_undeliverable_at: v.email_undeliverable_at.map(ts),
            created_at: Some(ts(v.created_at)),
            updated_at: Some(ts(v.updated_at)),
            endpoints: v
                .endpoints
                .into_iter()
                .map(|e| pb::RecipientEndpoint {
                    endpoint_id: e.id.to_string(),
                    platform: e.platform,
                    token_masked: e.token_masked,
                    status: e.status,
                    revoked_reason: e.revoked_reason.unwrap_or_default(),
                    registered_at: Some(ts(e.registered_at)),
                })
                .collect(),
        })
    }

    pub(super) async fn erase_recipient(
        &self,
        caller: Caller,
        mut r: pb::EraseRecipientRequest,
    ) -> Result<pb::EraseRecipientResponse, ApiError> {
        r.user_id = user_id_of(&r.user_id)?;
        let out = erasure::erase_recipient(&self.pool, &r.user_id, &caller.name).await?;
        tracing::info!(
            erased_by = %caller.name,
            deliveries_canceled = out.deliveries_canceled,
            // Canceled while their provider call was still in progress after the wait:
            // they may have reached the user (their `last_error` says so).
            canceled_in_flight = out.canceled_in_flight,
            deliveries_redacted = out.deliveries_redacted,
            "recipient erased"
        );
        Ok(pb::EraseRecipientResponse {
            recipient_found: out.recipient_found,
            deliveries_canceled: count32(out.deliveries_canceled),
            deliveries_redacted: count32(out.deliveries_redacted),
            attempts_redacted: count32(out.attempts_redacted),
            inbox_deleted: count32(out.inbox_deleted),
            endpoints_deleted: count32(out.endpoints_deleted),
            user_id_sha256: out.user_sha256.iter().map(|b| format!("{b:02x}")).collect(),
        })
    }

    /// Validates, then starts a task that writes the document page by page into a channel
    /// of [`EXPORT_CHUNKS_AHEAD`] chunks: at most one page of rows and that many chunks
    /// are held, whatever the user's number of rows. A database error mid-way ends the
    /// stream with `UNAVAILABLE` or `INTERNAL` (the document is then incomplete).
    pub(super) async fn export_recipient_data(
        &self,
        mut r: pb::ExportRecipientDataRequest,
    ) -> Result<ExportStream, ApiError> {
        r.user_id = user_id_of(&r.user_id)?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<pb::ExportRecipientDataChunk, Status>>(
            EXPORT_CHUNKS_AHEAD,
        );
        let pool = self.pool.clone();
        tokio::spawn(async move {
            if let Err(ExportError::Store(e)) = write_export(&pool, &r.user_id, &tx).await {
                let _ = tx.send(Err(Status::from(ApiError::from(e)))).await;
            }
        });
        Ok(Box::pin(futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
        })))
    }
}

/// Why the export stopped early.
enum ExportError {
    Store(notify_store::StoreError),
    /// The client went away.
    Gone,
}

impl From<notify_store::StoreError> for ExportError {
    fn from(e: notify_store::StoreError) -> Self {
        ExportError::Store(e)
    }
}

type ChunkSender = tokio::sync::mpsc::Sender<Result<pb::ExportRecipientDataChunk, Status>>;

async fn send(tx: &ChunkSender, data: String) -> Result<(), ExportError> {
    tx.send(Ok(pb::ExportRecipientDataChunk {
        data: data.into_bytes(),
    }))
    .await
    .map_err(|_| ExportError::Gone)
}

/// The document: `{"user_id", "exported_at", "recipient", "endpoints", "preferences",
/// "topic_subscriptions", "inbox": [...], "deliveries": [...]}`, one chunk for the head
/// and one per page.
async fn write_export(
    pool: &notify_store::PgPool,
    user_id: &str,
    tx: &ChunkSender,
) -> Result<(), ExportError> {
    let mut head = serde_json::Map::new();
    head.insert("user_id".into(), user_id.into());
    head.insert("exported_at".into(), chrono::Utc::now().to_rfc3339().into());
    for (k, v) in export::head(pool, user_id).await? {
        head.insert(k.into(), v);
    }
    let mut text = serde_json::Value::Object(head).to_string();
    text.pop(); // the closing brace: the lists follow
    text.push_str(",\"inbox\":[");
    send(tx, text).await?;

    let mut after_seq = 0;
    let mut first = true;
    loop {
        let page = export::inbox_page(pool, user_id, after_seq, EXPORT_PAGE).await?;
        let Some((last, _)) = page.last() else { break };
        after_seq = *last;
        let more = page.len() as i64 == EXPORT_PAGE;
        send(tx, join(page.into_iter().map(|(_, j)| j), &mut first)).await?;
        if !more {
            break;
        }
    }
    send(tx, "],\"deliveries\":[".into()).await?;
    let mut after: Option<Uuid> = None;
    let mut first = true;
    loop {
        let page = export::deliveries_page(pool, user_id, after, EXPORT_PAGE).await?;
        let Some((last, _)) = page.last() else { break };
        after = Some(*last);
        let more = page.len() as i64 == EXPORT_PAGE;
        send(tx, join(page.into_iter().map(|(_, j)| j), &mut first)).await?;
        if !more {
            break;
        }
    }
    send(tx, "]}".into()).await
}

/// JSON texts joined by commas, with a leading comma unless this is the list's first page.
fn join(items: impl Iterator<Item = String>, first: &mut bool) -> String {
    let mut out = String::new();
    for j in items {
        if !*first {
            out.push(',');
        }
        *first = false;
        out.push_str(&j);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::join;

    #[test]
    fn pages_join_into_one_json_list() {
        let mut first = true;
        let a = join(["1".to_string(), "2".to_string()].into_iter(), &mut first);
        let b = join(["3".to_string()].into_iter(), &mut first);
        let v: Vec<u8> = serde_json::from_str(&format!("[{a}{b}]")).unwrap();
        assert_eq!(v, vec![1, 2, 3]);
    }
}
