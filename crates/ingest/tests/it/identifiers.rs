//! One id rule at every door: user ids that only look like another user's are refused
//! wherever they arrive (UpsertRecipient, CreateEvent, an inbox token's `sub`), and a user
//! id is the same user whatever Unicode normalisation form it arrives in.

use crate::support;

use notify_proto::v1 as pb;
use serde_json::json;
use support::{Platform, hs256, uniq};
use tonic::Code;

/// Characters that render as nothing, reorder text or break a line: each makes an id
/// that looks like `alice` and is another user.
const LOOK_ALIKES: [char; 10] = [
    '\u{ad}',
    '\u{61c}',
    '\u{34f}',
    '\u{3164}',
    '\u{fe0f}',
    '\u{e0041}',
    '\u{2028}',
    '\u{180e}',
    '\u{115f}',
    '\u{206a}',
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_alike_user_ids_are_refused_at_every_door() {
    let p = Platform::start_with_type(&[], "alike_news", &["inapp"]).await;
    let alice = uniq("alice");
    p.add_recipient(&alice, "Alice", "", "").await;
    for c in LOOK_ALIKES {
        let fake = format!("{c}{alice}");
        let err = p
            .recipients()
            .upsert_recipient(pb::UpsertRecipientRequest {
                user_id: fake.clone(),
                display_name: "Alice".into(),
                ..Default::default()
            })
            .await
            .expect_err("a look-alike id is refused");
        assert_eq!(err.code(), Code::InvalidArgument, "U+{:04X}", u32::from(c));
        assert!(err.message().contains("user_id"), "{}", err.message());

        let err = p
            .ingest()
            .create_event(p.event(&uniq("alike"), "alike_news", &[&fake]))
            .await
            .expect_err("a look-alike recipient is refused");
        assert_eq!(err.code(), Code::InvalidArgument, "U+{:04X}", u32::from(c));
        assert!(err.message().contains("recipients[0]"), "{}", err.message());

        let token = hs256(
            &json!({"sub": fake, "exp": chrono::Utc::now().timestamp() + 300}),
            support::INBOX_SECRET,
        );
        let r = p
            .http
            .get(format!("{}/v1/inbox/notifications", p.http_url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "U+{:04X}", u32::from(c));
    }
    let stored: i64 = p.query_scalar("SELECT count(*) FROM recipients").await;
    assert_eq!(stored, 1, "only the real alice is stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_id_typed_in_nfd_is_the_same_user_at_every_door() {
    let p = Platform::start_with_type(&[], "nfd_news", &["email"]).await;
    let tail = uniq("");
    let nfd = format!("jose\u{301}{tail}");
    let nfc = format!("jos\u{e9}{tail}");
    // Registered in NFD, stored (and found) as NFC.
    p.add_recipient(&nfd, "José", "jose@example.test", "").await;
    let stored: Vec<String> = p.query_scalars("SELECT user_id FROM recipients").await;
    assert_eq!(stored, std::slice::from_ref(&nfc));
    for (i, spelt) in [&nfc, &nfd].into_iter().enumerate() {
        let ev = p
            .create_event(p.event(&uniq(&format!("nfd{i}")), "nfd_news", &[spelt]))
            .await;
        assert!(ev.skipped.is_empty(), "{:?}", ev.skipped);
        assert_eq!(ev.deliveries.len(), 1, "{ev:?}");
        assert_eq!(ev.deliveries[0].user_id, nfc);
    }
    // The other RecipientService calls find the same user however it is spelt.
    let got = p.try_get_recipient(&nfd).await.expect("found in NFD");
    assert_eq!(got.user_id, nfc);
}
