use super::*;
use serde_json::json;

fn problems(messages: &[Value]) -> Vec<(String, String)> {
    let mut v = Violations::default();
    check_messages("m", messages, &mut v);
    v.0.into_iter().map(|f| (f.field, f.description)).collect()
}

fn fields(messages: &[Value]) -> Vec<String> {
    problems(messages).into_iter().map(|(f, _)| f).collect()
}

fn button(label: &str, action: Value) -> Value {
    let mut a = action;
    a["label"] = json!(label);
    json!({"type": "button", "action": a})
}

fn card(alt: &str, buttons: Vec<Value>) -> Value {
    json!({"type": "flex", "altText": alt, "contents": {"type": "bubble",
        "hero": {"type": "image", "url": "https://cdn.shop.example/o/1001.png", "size": "full"},
        "body": {"type": "box", "layout": "vertical", "contents": [
            {"type": "text", "text": "ชำระเงินสำเร็จ", "wrap": true}]},
        "footer": {"type": "box", "layout": "vertical", "contents": buttons}}})
}

fn uri(u: &str) -> Value {
    json!({"type": "uri", "uri": u})
}

#[test]
fn a_card_with_a_link_button_and_a_postback_button_passes() {
    let ok = card(
        "ชำระเงินสำเร็จ",
        vec![
            button("ดูคำสั่งซื้อ", uri("https://shop.example/o/1001")),
            button(
                "ติดตามพัสดุ",
                json!({"type": "postback", "data": postback_data(Uuid::nil(), "track")}),
            ),
            button("โทรหาร้าน", uri("tel:021234567")),
        ],
    );
    let text = json!({"type": "text", "text": "สวัสดี", "quickReply": {"items": [
        {"type": "action", "action": {"type": "uri", "label": "เปิด", "uri": "line://nv/chat"}}]}});
    assert_eq!(problems(&[ok, text]), []);
}

#[test]
fn the_message_count_and_each_type_are_checked() {
    let t = json!({"type": "text", "text": "a"});
    assert_eq!(fields(&[]), ["m"]);
    assert_eq!(fields(&vec![t.clone(); 6]), ["m"]);
    assert_eq!(fields(&vec![t; 5]), Vec::<String>::new());
    assert_eq!(
        fields(&[
            json!({"text": "no type"}),
            json!({"type": "text", "text": ""}),
            json!({"type": "text", "text": "😀".repeat(2_501)}),
            json!({"type": "image", "originalContentUrl": "http://cdn.shop.example/a.png"}),
        ]),
        [
            "m[0]",
            "m[1].text",
            "m[2].text",
            "m[3].originalContentUrl",
            "m[3].previewImageUrl"
        ],
        "5,002 UTF-16 units of emoji are over 5,000"
    );
}

#[test]
fn alt_text_is_required_and_at_most_1500_characters() {
    let mut no_alt = card("x", vec![]);
    no_alt.as_object_mut().unwrap().remove("altText");
    assert_eq!(fields(&[no_alt]), ["m[0].altText"]);
    assert_eq!(fields(&[card("   ", vec![])]), ["m[0].altText"]);
    let exact = "ก".repeat(1_500);
    assert_eq!(fields(&[card(&exact, vec![])]), Vec::<String>::new());
    let (field, why) = problems(&[card(&format!("{exact}ข"), vec![])]).remove(0);
    assert_eq!(field, "m[0].altText");
    assert_eq!(
        why,
        "must be at most 1500 characters (LINE Flex Message altText), got 1501"
    );
}

#[test]
fn a_bubble_over_30_kb_and_a_carousel_over_its_limits_are_refused() {
    let big_text = |n: usize| json!({"type": "text", "text": "ก".repeat(n), "wrap": true});
    let mut big = card("x", vec![]);
    // Thai is 3 bytes per character in UTF-8: 10,000 characters are 30,000 bytes.
    big["contents"]["body"]["contents"] = json!([big_text(10_000)]);
    let (field, why) = problems(&[big]).remove(0);
    assert_eq!(field, "m[0].contents");
    assert!(why.contains("at most 30000 bytes"), "{why}");

    let bubble = |n: usize| {
        json!({"type": "bubble", "body": {"type": "box", "layout": "vertical",
            "contents": [big_text(n)]}})
    };
    let carousel = |bubbles: Vec<Value>| json!({"type": "flex", "altText": "x", "contents": {"type": "carousel", "contents": bubbles}});
    assert_eq!(
        fields(&[carousel(vec![bubble(1); 12])]),
        Vec::<String>::new()
    );
    assert_eq!(
        fields(&[carousel(vec![bubble(1); 13])]),
        ["m[0].contents.contents"]
    );
    assert_eq!(fields(&[carousel(vec![])]), ["m[0].contents.contents"]);
    // Three bubbles of 18,000+ bytes each: each within 30 KB, the carousel over 50 KB.
    assert_eq!(
        fields(&[carousel(vec![bubble(6_000); 3])]),
        ["m[0].contents"]
    );
    assert_eq!(
        fields(&[json!({"type": "flex", "altText": "x", "contents": {"type": "box"}})]),
        ["m[0].contents"]
    );
}

#[test]
fn labels_follow_the_rule_of_where_the_action_stands() {
    let l40 = "ก".repeat(40);
    let l41 = "ก".repeat(41);
    let link = uri("https://shop.example/o/1");
    assert_eq!(
        fields(&[card("x", vec![button(&l40, link.clone())])]),
        Vec::<String>::new()
    );
    assert_eq!(
        fields(&[card("x", vec![button(&l41, link.clone())])]),
        ["m[0].contents.footer.contents[0].action.label"]
    );
    let unlabelled = json!({"type": "button", "action": link});
    assert_eq!(
        fields(&[card("x", vec![unlabelled])]),
        ["m[0].contents.footer.contents[0].action.label"],
        "a Flex button needs a label"
    );
    let mut tap = card("x", vec![]);
    tap["contents"]["action"] = uri("https://shop.example/o/1");
    assert_eq!(
        fields(&[tap]),
        Vec::<String>::new(),
        "a bubble's action needs none"
    );

    let qr = |label: &str, n: usize| {
        json!({"type": "text", "text": "t", "quickReply": {"items": vec![
            json!({"type": "action", "action": {"type": "postback", "label": label, "data": "x"}}); n]}})
    };
    assert_eq!(fields(&[qr(&"ก".repeat(20), 13)]), Vec::<String>::new());
    assert_eq!(
        fields(&[qr(&"ก".repeat(21), 1)]),
        ["m[0].quickReply.items[0].action.label"]
    );
    assert_eq!(fields(&[qr("ok", 14)]), ["m[0].quickReply.items"]);

    let template = json!({"type": "template", "altText": "x", "template": {"type": "buttons",
        "text": "t", "actions": [{"type": "uri", "label": "ก".repeat(21), "uri": "https://a.example/"}]}});
    assert_eq!(fields(&[template]), ["m[0].template.actions[0].label"]);
}

#[test]
fn uris_use_a_scheme_line_opens_and_postback_data_fits() {
    let at = "m[0].contents.footer.contents[0].action";
    let one = |a: Value| fields(&[card("x", vec![button("b", a)])]);
    assert_eq!(one(uri("myshop://orders/1")), [format!("{at}.uri")]);
    assert_eq!(one(uri("javascript:alert(1)")), [format!("{at}.uri")]);
    assert_eq!(one(uri("")), [format!("{at}.uri")]);
    assert_eq!(
        one(uri(&format!("https://shop.example/{}", "a".repeat(1_000)))),
        [format!("{at}.uri")]
    );
    assert_eq!(one(uri("LINE://nv/chat")), Vec::<String>::new());
    let mut alt = uri("https://shop.example/");
    alt["altUri"] = json!({"desktop": "ftp://x"});
    assert_eq!(one(alt), [format!("{at}.altUri.desktop")]);
    assert_eq!(
        one(json!({"type": "postback", "data": "a".repeat(301)})),
        [format!("{at}.data")]
    );
    assert_eq!(
        one(json!({"type": "postback", "data": "a".repeat(300)})),
        Vec::<String>::new()
    );
    assert_eq!(one(json!({"type": "postback"})), [format!("{at}.data")]);
}

#[test]
fn image_urls_are_https_and_at_most_2000_characters() {
    let mut c = card("x", vec![]);
    c["contents"]["hero"]["url"] = json!("http://cdn.shop.example/a.png");
    assert_eq!(fields(&[c.clone()]), ["m[0].contents.hero.url"]);
    c["contents"]["hero"]["url"] = json!(format!("https://cdn.shop.example/{}", "a".repeat(2_000)));
    assert_eq!(fields(&[c]), ["m[0].contents.hero.url"]);
    let icon = json!({"type": "flex", "altText": "x", "contents": {"type": "bubble", "body": {
        "type": "box", "layout": "baseline", "contents": [{"type": "icon", "url": "data:image/png;base64,AA"}]}}});
    assert_eq!(fields(&[icon]), ["m[0].contents.body.contents[0].url"]);
}

#[test]
fn postback_data_round_trips_and_other_data_is_not_ours() {
    let id = Uuid::now_v7();
    let data = postback_data(id, "track");
    assert_eq!(parse_postback_data(&data), Some((id, "track".to_string())));
    let longest = postback_data(id, &"a".repeat(64));
    assert!(units(&longest) <= MAX_POSTBACK_DATA);
    for other in [
        "",
        "action=buy&item=1",
        &format!("d={id}"),
        &format!("d={id}&a="),
        "d=not-a-uuid&a=view",
        &format!("d={id}&a=view&x=1"),
    ] {
        assert_eq!(parse_postback_data(other), None, "{other:?}");
    }
}

#[test]
fn only_http_https_line_and_tel_open_as_uri() {
    for u in [
        "https://a.example",
        "http://localhost/x",
        "line://nv/chat",
        "tel:021234567",
    ] {
        assert!(opens_as_uri(u), "{u}");
    }
    for u in ["myshop://orders/1", "mailto:a@b.example", "no-scheme"] {
        assert!(!opens_as_uri(u), "{u}");
    }
}
