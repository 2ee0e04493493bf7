//! The one column rewrite of the erasure ([`rewrite`]): values read as text, the needles
//! replaced in Rust by [`Spellings`], only the changed rows written back.

use crate::Result;
use notify_core::spellings::Spellings;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

/// How a column is read (as text) and written back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Plain text: [`Spellings::redact_text`].
    Text,
    /// `jsonb`: [`Spellings::redact_json`], written back with `::jsonb`.
    Json,
}

/// [`rewrite`] of the attempts of the deliveries `ids`: the content sent and the
/// provider's answer.
pub(super) async fn rewrite_attempts(
    tx: &mut PgConnection,
    spelt: &Spellings,
    ids: &[Uuid],
) -> Result<u64> {
    rewrite(
        tx,
        spelt,
        ("delivery_attempts", "id", "bigint"),
        &[
            ("content_json", Kind::Json),
            ("provider_response", Kind::Text),
        ],
        "delivery_id = ANY($1)",
        ids,
    )
    .await
}

/// Rewrites the columns `cols` of the rows of `table` that `filter` (SQL over `$1`, the
/// `ids`) selects: each value read as text, the needles replaced in Rust, and only the
/// rows with a change written back, in one statement keyed by `key` (a column of SQL type
/// `key_type`). Returns how many rows changed. `table`, `key`, `key_type`, the columns
/// and `filter` are this module's constants, never input.
pub(super) async fn rewrite(
    tx: &mut PgConnection,
    spelt: &Spellings,
    (table, key, key_type): (&str, &str, &str),
    cols: &[(&str, Kind)],
    filter: &str,
    ids: &[Uuid],
) -> Result<u64> {
    if spelt.is_empty() || ids.is_empty() {
        return Ok(0);
    }
    let read = format!(
        "SELECT {key}::text, {} FROM {table} WHERE {filter}",
        cols.iter()
            .map(|(c, _)| format!("{c}::text"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(read))
        .bind(ids)
        .fetch_all(&mut *tx)
        .await?;
    let mut keys: Vec<String> = Vec::new();
    let mut values: Vec<Vec<Option<String>>> = vec![Vec::new(); cols.len()];
    for row in &rows {
        let new: Vec<Option<String>> = cols
            .iter()
            .enumerate()
            .map(|(i, (_, kind))| {
                let old: Option<String> = row.get(i + 1);
                old.and_then(|old| match kind {
                    Kind::Text => spelt.redact_text(&old),
                    Kind::Json => spelt.redact_json(&old),
                })
            })
            .collect();
        if new.iter().any(Option::is_some) {
            keys.push(row.get(0));
            for (i, v) in new.into_iter().enumerate() {
                values[i].push(v);
            }
        }
    }
    if keys.is_empty() {
        return Ok(0);
    }
    let set = cols
        .iter()
        .enumerate()
        .map(|(i, (c, kind))| {
            let cast = if *kind == Kind::Json { "::jsonb" } else { "" };
            format!("{c} = coalesce(t.c{i}{cast}, {table}.{c})")
        })
        .collect::<Vec<_>>()
        .join(", ");
    let unnest = (0..cols.len())
        .map(|i| format!("${}::text[]", i + 2))
        .collect::<Vec<_>>()
        .join(", ");
    let names = (0..cols.len())
        .map(|i| format!("c{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let write = format!(
        "UPDATE {table} SET {set}
         FROM UNNEST($1::text[], {unnest}) AS t(k, {names})
         WHERE {table}.{key} = t.k::{key_type}"
    );
    let mut q = sqlx::query(sqlx::AssertSqlSafe(write)).bind(&keys);
    for v in &values {
        q = q.bind(v);
    }
    Ok(q.execute(&mut *tx).await?.rows_affected())
}
