//! Derived deliveries (fallback and escalation).
// lead: replaced by feat/derived

use crate::Result;
use sqlx::PgConnection;
use uuid::Uuid;

/// Creates the fallback delivery after `delivery_id` (the next channel of its type's
/// `fallback_channels`), caused by `cause` (a skip reason code or `failed`), in the
/// caller's transaction. Returns the new delivery's id, if one was created.
///
/// Stub in `feat/due`: creates nothing; `feat/derived` provides the real function.
pub async fn fallback_after(
    conn: &mut PgConnection,
    delivery_id: Uuid,
    cause: &str,
) -> Result<Option<Uuid>> {
    let _ = (conn, delivery_id, cause);
    Ok(None)
}
