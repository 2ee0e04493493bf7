//! Unit tests of the sensitive-data guard.

use super::*;
use serde_json::json;

fn digits(s: &str) -> Vec<u8> {
    s.chars().filter_map(digit).collect()
}

#[test]
fn thai_ids_are_recognised_by_their_check_digit() {
    // 1-1037-00123-45-?: Σ = 1·13+1·12+0·11+3·10+7·9+0·8+0·7+1·6+2·5+3·4+4·3+5·2 = 168,
    // 168 mod 11 = 3, check = (11 − 3) mod 10 = 8.
    assert!(thai_id_valid(&digits("1103700123458")));
    assert!(!thai_id_valid(&digits("1103700123459")));
    assert!(!thai_id_valid(&digits("110370012345")));
    for text in [
        "1103700123458",
        "1-1037-00123-45-8",
        "1 1037 00123 45 8",
        "เลขประจำตัวประชาชน ๑๑๐๓๗๐๐๑๒๓๔๕๘ ค่ะ",
        "บัตร:1-1037-00123-45-8.",
        // Found by testing: dots, slashes, underscores, doubled or unusual spaces,
        // dashes, invisible characters, fullwidth and Arabic-Indic digits.
        "1.1037.00123.45.8",
        "1/1037/00123/45/8",
        "1_1037_00123_45_8",
        "1  1037  00123  45  8",
        "1\u{a0}1037\u{a0}00123\u{a0}45\u{a0}8",
        "1\u{2013}1037\u{2013}00123\u{2013}45\u{2013}8",
        "11037\u{ad}00123458",
        "110370\u{200b}0123458",
        "１１０３７００１２３４５８",
        "\u{661}\u{661}\u{660}\u{663}\u{667}\u{660}\u{660}\u{661}\u{662}\u{663}\u{664}\u{665}\u{668}",
    ] {
        assert_eq!(scan_text(text), vec![Kind::ThaiNationalId], "{text}");
    }
    for text in [
        "1103700123459",         // wrong check digit
        "order 1-1037-00123-45", // 12 digits
        "11037001234581",        // 14 digits (and not Luhn-valid)
        "1---1037-00123-45-8",   // three separators split it
        "tel 081-234-5678",
    ] {
        assert!(!scan_text(text).contains(&Kind::ThaiNationalId), "{text}");
    }
}

#[test]
fn card_numbers_are_recognised_by_luhn() {
    for text in [
        "4111111111111111",
        "card 4111 1111 1111 1111 exp 12/29",
        "5500-0000-0000-0004",
        "บัตรเครดิต 378282246310005",
        "4111.1111.1111.1111",
    ] {
        assert_eq!(scan_text(text), vec![Kind::PaymentCard], "{text}");
    }
    assert!(scan_text("4111111111111112").is_empty());
    assert!(scan_text("411111111111").is_empty()); // 12 digits
    assert!(scan_text("order 1001 paid 1,250.00").is_empty());
    // Two numbers one space apart are each found.
    assert_eq!(
        scan_text("1103700123458 4111111111111111"),
        vec![Kind::ThaiNationalId, Kind::PaymentCard]
    );
    assert_eq!(
        mask_text("ref 12 4111 1111 1111 1111"),
        "ref 12 XXXX XXXX XXXX 1111"
    );
}

#[test]
fn secrets_are_found() {
    let pem =
        "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\n-----END PRIVATE KEY-----";
    assert_eq!(scan_text(pem), vec![Kind::PrivateKey]);
    assert_eq!(
        scan_text("-----BEGIN EC PRIVATE KEY-----\nabc"),
        vec![Kind::PrivateKey]
    );
    assert!(scan_text("-----BEGIN CERTIFICATE-----\nabc").is_empty());
    assert_eq!(
        scan_text("Authorization: Bearer abcdefghijklmnop1234"),
        vec![Kind::BearerToken]
    );
    assert!(scan_text("a bearer of good news").is_empty());
    for t in [
        "Authorization: Bearer  abcdefghijklmnop1234",
        "Bearer\tabcdefghijklmnop1234",
        "bearer:abcdefghijklmnop1234",
        "key nk_0a1b2c3d_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcdefg",
    ] {
        assert_eq!(scan_text(t), vec![Kind::BearerToken], "{t}");
    }
    assert_eq!(
        scan_text("-----begin private key-----\nabc"),
        vec![Kind::PrivateKey]
    );
    // Found by `make fuzz`: "bearer " followed by a multi-byte letter.
    let odd = "Bearer .......eareyJga....,..,.HxBearer к";
    assert_eq!(scan_text(odd), vec![Kind::BearerToken]);
    assert!(
        mask_text(odd).ends_with(",..,.HxBearer к"),
        "{}",
        mask_text(odd)
    );
    assert_eq!(
        scan_text("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"),
        vec![Kind::BearerToken]
    );
    assert!(is_secret_field("Password") && is_secret_field("client_secret"));
    assert!(is_secret_field("API-Key") && !is_secret_field("order_id"));
    for name in [
        "user_password",
        "userPassword",
        "new_password",
        "password_confirmation",
        "db_pass",
        "token",
        "auth",
        "credentials",
        "cvv2",
        "pass\u{200b}word",
        "ｐａｓｓｗｏｒｄ",
        "password:",
    ] {
        assert!(is_secret_field(name), "{name}");
    }
    // Login codes are what the platform sends; the others are ordinary words.
    for name in ["otp", "author", "passenger", "url", "tracking_number"] {
        assert!(!is_secret_field(name), "{name}");
    }
    // HTML and URL encodings are looked through.
    assert_eq!(
        html_text("<b>1103700</b>&#49;23458 &amp; x"),
        "1103700123458 & x"
    );
    assert_eq!(
        percent_decoded("a=%31103700123458&b=%E0%B8%81"),
        "a=1103700123458&b=ก"
    );
    assert_eq!(percent_decoded("100%"), "100%");
}

#[test]
fn nested_payload_fields_are_named_by_path() {
    let payload = json!({
        "order_id": 1001,
        "customer": {"name": "สมชาย", "id_card": "1-1037-00123-45-8", "password": "hunter2"},
        "cards": [{"last": "1111"}, {"number": 4111111111111111u64}],
        "note": "โอนแล้ว ขอบคุณ",
        "extras": {"token": null},
        "login2": {"password": ["hunter2"]},
        "1103700123458": "x",
    });
    let found = scan_json("payload", &payload);
    assert_eq!(
        found,
        vec![
            Finding {
                path: "payload.XXXXXXXXX3458".into(),
                kind: Kind::ThaiNationalId
            },
            Finding {
                path: "payload.cards[1].number".into(),
                kind: Kind::PaymentCard
            },
            Finding {
                path: "payload.customer.id_card".into(),
                kind: Kind::ThaiNationalId
            },
            Finding {
                path: "payload.customer.password".into(),
                kind: Kind::SecretField
            },
            Finding {
                path: "payload.login2.password".into(),
                kind: Kind::SecretField
            },
        ]
    );
}

#[test]
fn masking_keeps_the_last_four_digits_and_the_layout() {
    assert_eq!(
        mask_text("บัตร 1-1037-00123-45-8 ค่ะ"),
        "บัตร X-XXXX-XXXX3-45-8 ค่ะ"
    );
    assert_eq!(mask_text("4111 1111 1111 1111"), "XXXX XXXX XXXX 1111");
    assert_eq!(
        mask_text("Bearer abcdefghijklmnop1234 ok"),
        "Bearer [REDACTED] ok"
    );
    // Found by `make fuzz`: the four digits kept, with the digits after them, made a
    // new card-like number; it is masked too.
    let tricky = "บัตร 1-1037-00123-45-8 11 1111 1111 1111";
    let masked = mask_text(tricky);
    assert!(scan_text(&masked).is_empty(), "{masked}");
    let masked = mask_json(&json!({"a": {"pin": "1234", "card": 4111111111111111u64, "n": 7}}));
    assert_eq!(
        masked,
        json!({"a": {"pin": "[REDACTED]", "card": "XXXXXXXXXXXX1111", "n": 7}})
    );
    assert!(
        scan_json("payload", &masked)
            .iter()
            .all(|f| f.kind == Kind::SecretField)
    );
}
