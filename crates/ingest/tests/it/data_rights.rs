//! The data rights of issue 20 (PDPA): `EraseRecipient` leaves none of the user's email,
//! LINE id, push token or name in any table, cancels what was not sent, keeps an audit row
//! and plans nothing for the user afterwards until they are registered again; an event
//! racing the erasure is planned wholly before it or finds nothing after it;
//! `ExportRecipientData` streams exactly the user's rows, in pages; `GetRecipient` masks
//! tokens; `ListEvents` filters, pages and shows a caller only its own events.

use crate::support;

use notify_core::Channel;
use notify_proto::v1 as pb;
use serde_json::{Value, json};
use sha2::Digest;
use std::collections::BTreeSet;
use std::time::Duration;
use support::{Options, Platform, eventually, field_violations, line_id, settle, uniq, with_key};
use tonic::Code;

/// Every (table, column) of the public schema whose values can hold text: text, varchar,
/// json, jsonb, arrays and bytea.
async fn text_columns(p: &Platform) -> Vec<(String, String, String)> {
    p.query_rows(
        "SELECT c.table_name::text, c.column_name::text, c.data_type::text
         FROM information_schema.columns c
         JOIN information_schema.tables t
           ON t.table_schema = c.table_schema AND t.table_name = c.table_name
         WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
           AND c.data_type IN ('text', 'character varying', 'character', 'json', 'jsonb',
                               'ARRAY', 'bytea', 'USER-DEFINED')
         ORDER BY 1, 2",
    )
    .await
}

/// Every `table.column` holding `needle` anywhere in its text (bytea compared as bytes).
async fn tables_holding(p: &Platform, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (table, column, ty) in text_columns(p).await {
        let cond = if ty == "bytea" {
            format!("position(convert_to($1, 'UTF8') IN \"{column}\") > 0")
        } else {
            format!("strpos(\"{column}\"::text, $1) > 0")
        };
        let sql = format!("SELECT count(*) FROM \"{table}\" WHERE {cond}");
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(needle)
            .fetch_one(&p.pool)
            .await
            .unwrap();
        if n > 0 {
            found.push(format!("{table}.{column} ({n})"));
        }
    }
    found
}

/// `s` inside a JSON string as an `ensure_ascii` serialiser writes it: every non-ASCII
/// character as `\uXXXX` (UTF-16), hexadecimal digits in `upper` case or not.
fn json_escaped(s: &str, upper: bool) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&if upper {
                    format!("\\u{u:04X}")
                } else {
                    format!("\\u{u:04x}")
                });
            }
        }
    }
    out
}

/// The NFD form of the names these tests use (their only decomposable letter is `é`).
fn nfd(s: &str) -> String {
    s.replace('\u{e9}', "e\u{301}")
        .replace('\u{c9}', "E\u{301}")
}

/// Every spelling of `s` an erasure must leave nowhere: NFC and NFD, as written, upper and
/// lower case, and JSON-escaped (`\u0e2a`, `\u0E2A`, of the NFC and of the NFD form).
fn spellings(s: &str) -> Vec<String> {
    let mut v = vec![
        s.to_string(),
        nfd(s),
        s.to_uppercase(),
        s.to_lowercase(),
        nfd(s).to_uppercase(),
        json_escaped(s, false),
        json_escaped(s, true),
        json_escaped(&nfd(s), false),
        json_escaped(&s.to_uppercase(), false),
    ];
    // Inside a JSON string (a `jsonb` printed as text) each backslash is doubled.
    let in_json: Vec<String> = v
        .iter()
        .filter(|f| f.contains('\\'))
        .map(|f| f.replace('\\', "\\\\"))
        .collect();
    v.extend(in_json);
    v.sort();
    v.dedup();
    v
}

/// Every `table.column` holding any spelling of `needle` ([`spellings`]), each listed
/// with the spelling found; also compared case-insensitively by Postgres' `lower()`.
async fn tables_holding_any_spelling(p: &Platform, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for form in spellings(needle) {
        for t in tables_holding(p, &form).await {
            found.push(format!("{t} as {form:?}"));
        }
    }
    for (table, column, ty) in text_columns(p).await {
        if ty == "bytea" {
            continue;
        }
        let sql = format!(
            "SELECT count(*) FROM \"{table}\" WHERE strpos(lower(\"{column}\"::text), lower($1)) > 0"
        );
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(needle)
            .fetch_one(&p.pool)
            .await
            .unwrap();
        if n > 0 {
            found.push(format!("{table}.{column} ({n}) in some case"));
        }
    }
    found
}

/// A recipient with a name, email, LINE id and an FCM token; returns (user id, name,
/// email, LINE id, token).
async fn full_recipient(p: &Platform, prefix: &str) -> (String, String, String, String, String) {
    let user = uniq(prefix);
    // NFC, with a letter that decomposes (`é`) for the NFD spelling.
    let name = format!("สมหญิง Jos\u{e9} Erasewoman {user}");
    let email = format!("{user}@erase.example.test");
    let line = line_id();
    let token = format!("fcm-token-{}", uuid::Uuid::new_v4().simple());
    p.add_recipient(&user, &name, &email, &line).await;
    p.add_device(&user, &token).await;
    p.set_preference(&user, "*", "email", true).await;
    p.set_quiet_window(&user, "03:00", "03:01").await.unwrap();
    (user, name, email, line, token)
}

/// An event to `user` whose payload and content name them.
fn naming_event(
    p: &Platform,
    key: &str,
    user: &str,
    name: &str,
    email: &str,
) -> pb::CreateEventRequest {
    let mut r = p.event(key, "account_notice", &[user]);
    r.payload = json!({"name": name, "email": email, "order_id": 1001}).to_string();
    let c = r.content.as_mut().unwrap();
    c.title = format!("สวัสดี {name}");
    c.body = format!("ส่งใบเสร็จไปที่ {email} แล้ว");
    r
}

/// Sends `n` `line_notice` events (keys `<prefix>-<i>-<user>`) to `user` and waits (20 s
/// at most) until all `n` LINE calls are in progress; returns the event ids.
async fn calls_in_progress(p: &Platform, user: &str, prefix: &str, n: i64) -> Vec<String> {
    let mut events = Vec::new();
    for i in 0..n {
        let key = format!("{prefix}-{i}-{user}");
        events.push(
            p.create_event(p.event(&key, "line_notice", &[user]))
                .await
                .event_id,
        );
    }
    eventually("the calls are in progress", Duration::from_secs(20), async || {
        let sending: i64 = p
            .scalar(
                "SELECT count(*) FROM notification_deliveries WHERE user_id = $1 AND status = 'sending'",
                user,
            )
            .await;
        if sending == n { Ok(()) } else { Err(sending) }
    })
    .await;
    events
}

async fn erase(p: &Platform, user: &str) -> pb::EraseRecipientResponse {
    p.recipients()
        .erase_recipient(pb::EraseRecipientRequest {
            user_id: user.into(),
        })
        .await
        .expect("EraseRecipient")
        .into_inner()
}

async fn deliveries_of_event(
    p: &Platform,
    event_id: &str,
) -> Vec<(String, String, Option<String>)> {
    p.rows(
        "SELECT user_id, status, address FROM notification_deliveries WHERE event_id = $1::uuid",
        event_id,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_recipient_leaves_no_email_line_id_token_or_name_in_any_table() {
    let p = Platform::start().await;
    p.add_type("account_notice", &["inapp", "email", "push", "line"])
        .await;
    let (user, name, email, line, token) = full_recipient(&p, "erase").await;
    let (other, other_name, other_email, _, other_token) = full_recipient(&p, "keep").await;

    // Sent on every channel, and one to both users (their shared event keeps the other's).
    let sent = p
        .create_event(naming_event(&p, &uniq("sent"), &user, &name, &email))
        .await;
    // The shared event names the user in other spellings: NFD, upper case, JSON-escaped
    // inside a string, and so does the title the other recipient's inbox row shows.
    let mut both = p.event(&uniq("both"), "account_notice", &[&user, &other]);
    both.payload = json!({
        "greeting": format!("{} and {other_name}", nfd(&name)),
        "contact": email.to_uppercase(),
        "device": token.to_uppercase(),
        "line": line.to_lowercase(),
        "raw": format!("{{\"name\": \"{}\"}}", json_escaped(&name, false)),
    })
    .to_string();
    let c = both.content.as_mut().unwrap();
    c.title = format!("{} และ {other_name}", nfd(&name).to_uppercase());
    c.body = format!("ส่งถึง {} และ {other_email}", email.to_uppercase());
    let both = p.create_event(both).await;
    let done = p.wait_final(&sent.event_id, 60).await;
    let channels: BTreeSet<&str> = done
        .deliveries
        .iter()
        .filter(|d| d.status == "sent")
        .map(|d| d.channel.as_str())
        .collect();
    assert_eq!(
        channels,
        BTreeSet::from(["email", "inapp", "line", "push"]),
        "{:?}",
        done.deliveries
    );
    p.wait_final(&both.event_id, 60).await;
    // Not sent yet: due in an hour.
    let mut later = naming_event(&p, &uniq("later"), &user, &name, &email);
    later.delay = "1h".into();
    let later = p.create_event(later).await;
    for needle in [&email, &line, &token, &name] {
        assert!(
            !tables_holding(&p, needle).await.is_empty(),
            "{needle} is stored before the erasure"
        );
    }
    for spelt in [
        nfd(&name),
        email.to_uppercase(),
        token.to_uppercase(),
        json_escaped(&name, false).replace('\\', "\\\\"),
    ] {
        assert!(
            !tables_holding(&p, &spelt).await.is_empty(),
            "{spelt} is stored before the erasure"
        );
    }

    let out = erase(&p, &user).await;
    assert!(out.recipient_found);
    assert_eq!(
        out.deliveries_canceled, 4,
        "the scheduled event's four: {out:?}"
    );
    assert!(out.deliveries_redacted >= 12, "{out:?}");
    assert!(out.attempts_redacted >= 8, "{out:?}");
    assert_eq!(out.inbox_deleted, 2, "{out:?}");
    assert_eq!(out.endpoints_deleted, 1, "{out:?}");
    let hash = sha2::Sha256::digest(user.as_bytes());
    assert_eq!(out.user_id_sha256, hex::encode(hash));

    // The spellings were stored: the other recipient's inbox row shows the shared title.
    let shown: String = sqlx::query_scalar(
        "SELECT title FROM notifications WHERE event_id = $1::uuid AND user_id = $2",
    )
    .bind(&both.event_id)
    .bind(&other)
    .fetch_one(&p.pool)
    .await
    .unwrap();
    assert!(
        shown.contains(&other_name) && shown.contains("[erased]"),
        "the other recipient's inbox row keeps their own name only: {shown:?}"
    );
    for needle in [&email, &line, &token, &name] {
        assert_eq!(
            tables_holding_any_spelling(&p, needle).await,
            Vec::<String>::new(),
            "no spelling of {needle} is left in any table"
        );
    }
    for table in [
        "recipients",
        "notification_deliveries",
        "notifications",
        "notification_preferences",
    ] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE user_id = $1"
        )))
        .bind(&user)
        .fetch_one(&p.pool)
        .await
        .unwrap();
        assert_eq!(n, 0, "{table} names the user id no more");
    }
    // The counts stay: every delivery is still there, with its status and attempts.
    let kept: Vec<(String, i32)> = p.rows("SELECT status, attempts FROM notification_deliveries WHERE event_id = $1::uuid ORDER BY channel", &sent.event_id).await;
    assert_eq!(kept.len(), 4);
    assert!(kept.iter().all(|(s, a)| s == "sent" && *a == 1), "{kept:?}");
    let later_rows = deliveries_of_event(&p, &later.event_id).await;
    assert_eq!(later_rows.len(), 4);
    assert!(
        later_rows
            .iter()
            .all(|(u, s, a)| u == "[erased]" && s == "canceled" && a.is_none()),
        "{later_rows:?}"
    );
    let queued: i64 = p
        .scalar(
            "SELECT count(*) FROM outbox o JOIN notification_deliveries d ON d.id = o.delivery_id
         WHERE d.event_id = $1::uuid",
            &later.event_id,
        )
        .await;
    assert_eq!(queued, 0, "the canceled deliveries' outbox rows are gone");

    // The console's counts moved with the cancel: they equal the rows' own.
    crate::overview::assert_exact(&p.pool, "after the erasure").await;

    // The audit row: who, when, the hash; nothing else.
    let audit: Vec<(Vec<u8>, String, bool)> = p
        .query_rows(
            "SELECT user_sha256, erased_by, completed_at IS NOT NULL FROM recipient_erasures",
        )
        .await;
    assert_eq!(audit, [(hash.to_vec(), "anonymous".to_string(), true)]);

    // The other user keeps everything.
    for needle in [&other_email, &other_token, &other_name] {
        assert!(
            !tables_holding(&p, needle).await.is_empty(),
            "{needle} kept"
        );
    }
    let both_event: Vec<String> = p
        .scalars(
            "SELECT unnest(recipients) FROM notification_events WHERE id = $1::uuid ORDER BY 1",
            &both.event_id,
        )
        .await;
    let mut expected = vec!["[erased]".to_string(), other.clone()];
    expected.sort();
    assert_eq!(both_event, expected);

    // A later event naming the user plans nothing, in-app included.
    let again = p
        .create_event(naming_event(&p, &uniq("again"), &user, "x", "x"))
        .await;
    assert!(
        deliveries_of_event(&p, &again.event_id).await.is_empty(),
        "nothing planned for an erased user"
    );
    assert_eq!(again.skipped.len(), 4, "{:?}", again.skipped);
    // Registered again: planned as anyone.
    p.add_recipient(&user, "", "", "").await;
    let back = p
        .create_event(naming_event(&p, &uniq("back"), &user, "x", "x"))
        .await;
    let rows = deliveries_of_event(&p, &back.event_id).await;
    assert_eq!(rows.len(), 1, "in-app only (no addresses now): {rows:?}");

    // Erasing again is harmless and audited again.
    let twice = erase(&p, &uniq("never-registered")).await;
    assert!(!twice.recipient_found);
    assert_eq!(p.count("recipient_erasures").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_racing_an_erasure_is_planned_wholly_before_it_or_finds_nothing_after_it() {
    let p = Platform::start_with(Options::workers(&[])).await;
    p.add_type("account_notice", &["inapp", "email", "push", "line"])
        .await;
    let (mut before, mut during, mut after) = (0, 0, 0);
    for round in 0..15 {
        let (user, name, email, line, token) = full_recipient(&p, "race").await;
        // Events that name the user in other spellings, in payload and title.
        let events = (0..4).map(|i| {
            let mut req = p.event(
                &format!("race-{round}-{i}-{user}"),
                "account_notice",
                &[&user],
            );
            req.payload = json!({"name": nfd(&name), "email": email.to_uppercase()}).to_string();
            req.content.as_mut().unwrap().title = format!("สวัสดี {}", json_escaped(&name, true));
            let mut c = p.ingest();
            async move { c.create_event(req).await.unwrap().into_inner() }
        });
        let erasure = async {
            // Let a few events start first, some of the time (a jitter of 0-9 ms that
            // varies the interleaving; nothing waits for an outcome here).
            tokio::time::sleep(Duration::from_millis((round % 4) * 3)).await;
            erase(&p, &user).await
        };
        let (created, _) = tokio::join!(futures_util::future::join_all(events), erasure);
        let mut sent_after = Vec::new();
        for ev in created {
            let rows = deliveries_of_event(&p, &ev.event_id).await;
            let skips: Vec<String> = p
                .scalars(
                    "SELECT user_id FROM delivery_skips WHERE event_id = $1::uuid",
                    &ev.event_id,
                )
                .await;
            if !rows.is_empty() {
                before += 1;
                assert_eq!(rows.len(), 4, "planned before: wholly: {rows:?}");
                assert!(
                    rows.iter()
                        .all(|(u, s, a)| u == "[erased]" && s == "canceled" && a.is_none()),
                    "planned before: canceled and redacted: {rows:?}"
                );
                assert!(skips.is_empty(), "{skips:?}");
            } else {
                assert_eq!(ev.skipped.len(), 4, "planned after: every pair skipped");
                if skips.is_empty() {
                    // Planned while the erasure ran: rewritten by its last step.
                    during += 1;
                } else {
                    // Planned after the erasure's last step: what its caller sent then.
                    after += 1;
                    assert_eq!(skips, vec![user.clone(); 4]);
                    sent_after.push(ev.event_id.clone());
                }
            }
        }
        for needle in [&email, &line, &token, &name] {
            let left = tables_holding_any_spelling(&p, needle).await;
            if sent_after.is_empty() {
                assert_eq!(left, Vec::<String>::new(), "round {round}: {needle} gone");
            }
            assert!(
                left.iter().all(|t| t.starts_with("notification_events.")),
                "round {round}: {needle} is only in events sent after the erasure: {left:?}"
            );
        }
        // Those events, and no other, hold what their caller sent.
        let holding: BTreeSet<String> = p
            .scalars(
                "SELECT id::text FROM notification_events
             WHERE strpos(lower(payload_json::text || content_json::text), lower($1)) > 0",
                &email,
            )
            .await
            .into_iter()
            .collect();
        assert_eq!(holding, sent_after.into_iter().collect(), "round {round}");
    }
    eprintln!(
        "events planned before the erasure: {before}, while it ran: {during}, after it: {after}"
    );
    assert_eq!(before + during + after, 60);
}

/// LINE requests the simulator answered for `line`, by their retry key.
async fn line_calls_to(p: &Platform, line: &str) -> BTreeSet<String> {
    p.sim_requests("line")
        .await
        .into_iter()
        .filter(|r| r["body"]["to"] == line)
        .map(|r| {
            r["headers"]["x-line-retry-key"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_progress_at_the_erasure_is_recorded_as_it_ended_and_an_event_planned_meanwhile_is_erased()
 {
    let p = Platform::start_with(Options::workers(&[Channel::Line])).await;
    p.add_type("line_notice", &["line"]).await;
    let (user, name, email, line, _) = full_recipient(&p, "in-flight").await;
    // Every LINE call takes 2 s: the erasure finds them in progress.
    p.http
        .post(format!("{}/_sim/latency", p.sim_url))
        .json(&json!({"provider": "line", "min_ms": 2000, "max_ms": 2000}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let events = calls_in_progress(&p, &user, "call", 6).await;
    let erasure = {
        let (p, user) = (&p, user.clone());
        async move { erase(p, &user).await }
    };
    // An event naming the user, planned once the erasure's cancel committed and before
    // it answered.
    let meanwhile = async {
        p.wait_count(
            "recipient_erasures",
            1,
            "the erasure's cancel committed",
            Duration::from_secs(10),
        )
        .await;
        let mut req = naming_event(
            &p,
            &uniq("meanwhile"),
            &user,
            &nfd(&name),
            &email.to_uppercase(),
        );
        req.r#type = "line_notice".into();
        p.create_event(req).await
    };
    let (out, late) = tokio::join!(erasure, meanwhile);
    assert!(
        deliveries_of_event(&p, &late.event_id).await.is_empty(),
        "nothing planned for the user once the cancel committed"
    );

    // The six calls were in progress: the provider gets all six (a call the erasure
    // canceled would arrive after its answer). Each is recorded sent; none canceled.
    let called = eventually(
        "the provider answered the six calls",
        Duration::from_secs(10),
        async || match line_calls_to(&p, &line).await {
            c if c.len() == 6 => Ok(c),
            c => Err(c.len()),
        },
    )
    .await;
    let states: Vec<(String, String, Option<String>)> = p
        .rows(
            "SELECT coalesce(retry_key, id)::text, status, last_error FROM notification_deliveries
         WHERE event_id = ANY($1::uuid[]) ORDER BY id",
            &events,
        )
        .await;
    assert_eq!(states.len(), 6);
    for (key, status, error) in &states {
        assert_eq!(
            status == "sent",
            called.contains(key),
            "a delivery is sent exactly when the provider got it: {key} {status} {error:?}"
        );
    }
    assert_eq!(
        (out.deliveries_canceled, out.deliveries_redacted >= 6),
        (0, true),
        "{out:?}"
    );
    // And nothing of the user is left, the event planned meanwhile included.
    for needle in [&email, &line, &name] {
        assert_eq!(
            tables_holding_any_spelling(&p, needle).await,
            Vec::<String>::new(),
            "no spelling of {needle} is left"
        );
    }
    let skips: i64 = p
        .scalar(
            "SELECT count(*) FROM delivery_skips WHERE user_id = $1",
            &user,
        )
        .await;
    assert_eq!(
        skips, 0,
        "the event planned meanwhile names the user no more"
    );
    let recipients: Vec<String> = p
        .scalar(
            "SELECT recipients FROM notification_events WHERE id = $1::uuid",
            &late.event_id,
        )
        .await;
    assert_eq!(recipients, ["[erased]"]);
}

/// `ExportRecipientData` for `user`: the chunks' sizes and the parsed document.
async fn export(p: &Platform, user: &str) -> (Vec<usize>, String) {
    let mut stream = p
        .recipients()
        .export_recipient_data(pb::ExportRecipientDataRequest {
            user_id: user.into(),
        })
        .await
        .expect("ExportRecipientData")
        .into_inner();
    let (mut sizes, mut bytes) = (Vec::new(), Vec::new());
    while let Some(c) = stream.message().await.expect("a chunk") {
        sizes.push(c.data.len());
        bytes.extend_from_slice(&c.data);
    }
    (sizes, String::from_utf8(bytes).expect("UTF-8"))
}

fn ids(v: &Value, list: &str, field: &str) -> BTreeSet<String> {
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("{list} is a list"))
        .iter()
        .map(|x| x[field].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_holds_exactly_the_users_rows_streamed_in_pages() {
    let p =
        Platform::start_with_type(&[Channel::InApp], "account_notice", &["inapp", "email"]).await;
    let (a, a_name, a_email, _, a_token) = full_recipient(&p, "export-a").await;
    let (b, b_name, b_email, b_line, b_token) = full_recipient(&p, "export-b").await;
    let own = p
        .create_event(naming_event(&p, &uniq("a"), &a, &a_name, &a_email))
        .await;
    p.ingest()
        .create_event(naming_event(&p, &uniq("b"), &b, &b_name, &b_email))
        .await
        .unwrap();
    let shared = p
        .create_event(p.event(&uniq("ab"), "account_notice", &[&a, &b]))
        .await;
    p.wait_count(
        "notifications",
        4,
        "both inboxes written",
        Duration::from_secs(30),
    )
    .await;
    // A few thousand more deliveries of A's, each with an attempt holding its content.
    sqlx::query(
        "WITH d AS (
             INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider, address,
                                                  status, attempts, idempotency_key, sent_at)
             SELECT gen_random_uuid(), $1::uuid, $2, 'email', 'smtp', $3, 'sent', 1,
                    'seed/' || i, now()
             FROM generate_series(1, 3000) i
             RETURNING id)
         INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome, content_json)
         SELECT id, 1, now(), 'sent', jsonb_build_object('subject', 'ใบเสร็จของคุณ', 'to', $3::text)
         FROM d",
    )
    .bind(&own.event_id)
    .bind(&a)
    .bind(&a_email)
    .execute(&p.pool)
    .await
    .unwrap();

    let (sizes, text) = export(&p, &a).await;
    let doc: Value = serde_json::from_str(&text).expect("one JSON document");
    assert_eq!(doc["user_id"], a.as_str());
    assert_eq!(doc["recipient"]["email"], a_email.as_str());
    assert_eq!(doc["recipient"]["display_name"], a_name.as_str());
    assert_eq!(doc["recipient"]["quiet_hours"][0]["start"], "03:00");
    assert_eq!(doc["preferences"][0]["channel"], "email");
    let masked = doc["endpoints"][0]["token_masked"].as_str().unwrap();
    assert_eq!(masked.len(), a_token.len());
    assert!(
        masked.starts_with("fcm-") && masked.contains("****"),
        "{masked}"
    );
    assert!(!text.contains(&a_token), "the token is masked");

    let db_deliveries: BTreeSet<String> = p
        .scalars(
            "SELECT id::text FROM notification_deliveries WHERE user_id = $1",
            &a,
        )
        .await
        .into_iter()
        .collect();
    assert_eq!(db_deliveries.len(), 3004);
    assert_eq!(ids(&doc, "deliveries", "delivery_id"), db_deliveries);
    let db_inbox: BTreeSet<String> = p
        .scalars("SELECT id::text FROM notifications WHERE user_id = $1", &a)
        .await
        .into_iter()
        .collect();
    assert_eq!(db_inbox.len(), 2);
    assert_eq!(ids(&doc, "inbox", "id"), db_inbox);
    let with_content = doc["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["attempts"][0]["content"]["subject"] == "ใบเสร็จของคุณ")
        .count();
    assert_eq!(with_content, 3000, "attempts come with the content sent");
    assert!(
        doc["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["event_id"] == shared.event_id.as_str()),
        "the shared event's delivery of A's is in"
    );
    for other in [&b, &b_name, &b_email, &b_line, &b_token] {
        assert!(!text.contains(other.as_str()), "nothing of B's: {other}");
    }
    // Read in pages: one chunk per 200 rows, none holding more than a page.
    assert!(sizes.len() >= 3004 / 200, "{} chunks", sizes.len());
    let largest = sizes.iter().max().copied().unwrap_or(0);
    assert!(
        largest < text.len() / 10,
        "no chunk holds the document: {largest} of {} bytes",
        text.len()
    );

    // An unknown user's export is an empty document; bad input names the field.
    let (_, empty) = export(&p, "nobody-at-all").await;
    let empty: Value = serde_json::from_str(&empty).unwrap();
    assert_eq!(empty["recipient"], Value::Null);
    assert_eq!(empty["deliveries"], json!([]));
    let Err(err) = p
        .recipients()
        .export_recipient_data(pb::ExportRecipientDataRequest {
            user_id: " ".into(),
        })
        .await
    else {
        panic!("a blank user id is refused");
    };
    assert_eq!(field_violations(&err), ["user_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_recipient_shows_contact_data_with_masked_tokens() {
    let p = Platform::start_with(Options::workers(&[])).await;
    let (user, name, email, line, token) = full_recipient(&p, "get").await;
    let r = p.try_get_recipient(&user).await.unwrap();
    assert_eq!(
        (
            r.user_id.as_str(),
            r.display_name.as_str(),
            r.email.as_str(),
            r.line_user_id.as_str()
        ),
        (user.as_str(), name.as_str(), email.as_str(), line.as_str())
    );
    assert_eq!(
        (r.locale.as_str(), r.timezone.as_str()),
        ("th-TH", "Asia/Bangkok")
    );
    assert_eq!(r.endpoints.len(), 1);
    let e = &r.endpoints[0];
    assert_eq!((e.platform.as_str(), e.status.as_str()), ("fcm", "active"));
    assert_eq!(
        e.token_masked,
        format!(
            "{}{}{}",
            &token[..4],
            "*".repeat(token.len() - 8),
            &token[token.len() - 4..]
        )
    );
    let missing = p.try_get_recipient("nobody-here").await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let bad = p.try_get_recipient(&"x".repeat(256)).await.unwrap_err();
    assert_eq!(field_violations(&bad), ["user_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_events_filters_pages_and_shows_a_caller_only_its_own_events() {
    let (p, admin, shop, forum) = support::two_callers(&["order_paid", "order_shipped"]).await;
    let send = |key: String, t: &'static str, users: Vec<String>, as_key: String| {
        let mut c = p.ingest();
        let users: Vec<&str> = users.iter().map(String::as_str).collect();
        let req = p.event(&key, t, &users);
        async move {
            c.create_event(with_key(req, &as_key))
                .await
                .unwrap()
                .into_inner()
                .event_id
        }
    };
    let mut shop_ids = Vec::new();
    for i in 0..5 {
        let user = if i % 2 == 0 { "u-even" } else { "u-odd" };
        shop_ids.push(
            send(
                format!("paid-{i}"),
                "order_paid",
                vec![user.into()],
                shop.clone(),
            )
            .await,
        );
    }
    for i in 0..2 {
        shop_ids.push(
            send(
                format!("shipped-{i}"),
                "order_shipped",
                vec!["u-odd".into()],
                shop.clone(),
            )
            .await,
        );
    }
    let forum_ids = [
        send(
            "reply-1".into(),
            "order_paid",
            vec!["u-even".into()],
            forum.clone(),
        )
        .await,
        send(
            "reply-2".into(),
            "order_paid",
            vec!["u-even".into()],
            forum.clone(),
        )
        .await,
    ];
    let list = |req: pb::ListEventsRequest, key: String| {
        let mut c = p.ingest();
        async move { c.list_events(with_key(req, &key)).await }
    };
    // Every page of a listing, following the page tokens.
    let all_pages = |req: pb::ListEventsRequest, key: String| async move {
        let (mut seen, mut pages, mut req) = (Vec::new(), 0, req);
        loop {
            let page = list(req.clone(), key.clone()).await.unwrap().into_inner();
            pages += 1;
            seen.extend(page.events.into_iter().map(|e| e.event_id));
            if page.next_page_token.is_empty() {
                return (seen, pages);
            }
            req.page_token = page.next_page_token;
        }
    };

    // The shop sees its 7, newest first, 3 per page; never the forum's.
    let (seen, pages) = all_pages(
        pb::ListEventsRequest {
            page_size: 3,
            ..Default::default()
        },
        shop.clone(),
    )
    .await;
    let mut newest_first = shop_ids.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first);
    assert_eq!(pages, 3);
    // Filters: type, recipient, both.
    let (paid, _) = all_pages(
        pb::ListEventsRequest {
            r#type: "order_paid".into(),
            ..Default::default()
        },
        shop.clone(),
    )
    .await;
    assert_eq!(paid.len(), 5);
    let (odd_paid, _) = all_pages(
        pb::ListEventsRequest {
            r#type: "order_paid".into(),
            recipient: "u-odd".into(),
            ..Default::default()
        },
        shop.clone(),
    )
    .await;
    assert_eq!(odd_paid, [shop_ids[3].clone(), shop_ids[1].clone()]);
    // Time range: created at or after the third event, before the sixth.
    let created: Vec<chrono::DateTime<chrono::Utc>> = p
        .scalars(
            "SELECT created_at FROM notification_events WHERE id = ANY($1::uuid[]) ORDER BY id",
            &shop_ids,
        )
        .await;
    let ts = |t: chrono::DateTime<chrono::Utc>| prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    };
    let (range, _) = all_pages(
        pb::ListEventsRequest {
            created_after: Some(ts(created[2])),
            created_before: Some(ts(created[5])),
            ..Default::default()
        },
        shop.clone(),
    )
    .await;
    assert_eq!(
        range,
        [
            shop_ids[4].clone(),
            shop_ids[3].clone(),
            shop_ids[2].clone()
        ]
    );
    // A key that may manage sees every caller's; the forum only its own.
    let (everything, _) = all_pages(pb::ListEventsRequest::default(), admin.clone()).await;
    assert_eq!(everything.len(), 9);
    let (theirs, _) = all_pages(pb::ListEventsRequest::default(), forum.clone()).await;
    assert_eq!(theirs, [forum_ids[1].clone(), forum_ids[0].clone()]);
    let summary = list(pb::ListEventsRequest::default(), forum.clone())
        .await
        .unwrap()
        .into_inner()
        .events
        .remove(0);
    assert_eq!(
        (
            summary.event_key.as_str(),
            summary.r#type.as_str(),
            summary.caller.as_str()
        ),
        ("reply-2", "order_paid", "forum-replies")
    );
    assert_eq!(summary.recipients, ["u-even"]);

    // Bad input: every bad field named at once.
    let err = list(
        pb::ListEventsRequest {
            page_size: 5_000,
            page_token: "not-a-token".into(),
            created_after: Some(ts(created[5])),
            created_before: Some(ts(created[2])),
            recipient: "\u{200b}".into(),
            ..Default::default()
        },
        shop.clone(),
    )
    .await
    .unwrap_err();
    assert_eq!(
        field_violations(&err),
        ["recipient", "created_before", "page_size", "page_token"]
    );
    // The data rights need the manage scope.
    let denied = p
        .recipients()
        .erase_recipient(with_key(
            pb::EraseRecipientRequest {
                user_id: "u-odd".into(),
            },
            &shop,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    let erased = p
        .recipients()
        .erase_recipient(with_key(
            pb::EraseRecipientRequest {
                user_id: "u-odd".into(),
            },
            &admin,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!erased.recipient_found);
    let who: String = p
        .query_scalar("SELECT erased_by FROM recipient_erasures")
        .await;
    assert_eq!(who, "ops-admin", "the audit names the caller's key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_fails_while_the_erasure_waits_for_it_ends_canceled_and_is_not_retried() {
    let p = Platform::start_with(Options::workers(&[Channel::Line])).await;
    p.add_type("line_notice", &["line"]).await;
    let (user, _, _, line, _) = full_recipient(&p, "in-flight-retry").await;
    // Every LINE call to the user takes 2 s and fails in a way worth a retry.
    p.sim_fault(
        json!({"provider": "line", "target_contains": line, "status": 500,
                       "body": {"message": "try later"}, "delay_ms": 2000}),
    )
    .await;
    let events = calls_in_progress(&p, &user, "retry", 3).await;
    let out = erase(&p, &user).await;
    // Each call failed; its retry ended canceled; no fallback, no second call.
    let states: Vec<(String, Option<String>, i32)> = p
        .rows(
            "SELECT status, last_error, attempts FROM notification_deliveries
         WHERE event_id = ANY($1::uuid[])",
            &events,
        )
        .await;
    assert_eq!(
        states,
        vec![
            (
                "canceled".to_string(),
                Some("canceled by erasure".to_string()),
                1
            );
            3
        ],
        "{out:?}"
    );
    assert_eq!(out.deliveries_canceled, 3, "{out:?}");
    let outcomes: Vec<String> = p.scalars("SELECT a.outcome FROM delivery_attempts a JOIN notification_deliveries d ON d.id = a.delivery_id
         WHERE d.event_id = ANY($1::uuid[])", &events).await;
    assert_eq!(
        outcomes,
        ["retry", "retry", "retry"],
        "each call recorded as it ended"
    );
    settle(
        "no call after the erasure",
        Duration::from_secs(2),
        async || match line_calls_to(&p, &line).await.len() {
            3 => Ok(()),
            n => Err(n),
        },
    )
    .await;
}
