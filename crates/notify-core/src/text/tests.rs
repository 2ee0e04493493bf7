use super::*;

/// Payment received, thanks for using the service, and a new-device sign-in alert.
const PAID: &str = "เราได้รับชำระเงินเรียบร้อยแล้ว ขอบคุณที่ใช้บริการ แจ้งเตือนการเข้าสู่ระบบใหม่จากอุปกรณ์ที่ไม่รู้จัก";
/// Order 12345 has shipped; the parcel arrives tomorrow; track it in the app.
const SHIPPED: &str = "คำสั่งซื้อหมายเลข 12345 ของคุณถูกจัดส่งแล้ว พัสดุจะถึงภายในวันพรุ่งนี้ ติดตามสถานะได้ที่แอป";

/// Thai vowels written before the consonant they follow in speech.
const LEADING_VOWELS: [char; 5] = ['เ', 'แ', 'โ', 'ใ', 'ไ'];

/// The segmenter's own word boundaries (byte offsets), straight from ICU4X.
fn icu_bounds(text: &str) -> Vec<usize> {
    WORDS.segment_str(text).collect()
}

fn grapheme_bounds(text: &str) -> Vec<usize> {
    let mut b: Vec<usize> = text.grapheme_indices(true).map(|(i, _)| i).collect();
    b.push(text.len());
    b
}

/// Asserts `pieces` concatenate to `text` and every cut between them is a word boundary
/// by ICU4X, with no Thai leading vowel left at the end of a piece.
fn assert_cut_at_words(text: &str, pieces: &[String]) {
    assert_eq!(pieces.concat(), text, "nothing lost or added");
    let bounds = icu_bounds(text);
    let mut at = 0;
    for p in pieces {
        assert!(bounds.contains(&at), "a piece starts inside a word at {at}");
        at += p.len();
        assert!(bounds.contains(&at), "a piece ends inside a word: {p:?}");
        assert!(!p.ends_with(LEADING_VOWELS), "dangling vowel: {p:?}");
    }
}

fn starts_with_combining_mark(s: &str) -> bool {
    s.chars().next().is_some_and(
        |c| matches!(c, '\u{0E31}' | '\u{0E34}'..='\u{0E3A}' | '\u{0E47}'..='\u{0E4E}'),
    )
}

#[test]
fn thai_words_are_the_dictionary_words() {
    assert_eq!(words("ขอบคุณที่ใช้บริการ"), ["ขอบคุณ", "ที่", "ใช้", "บริการ"]);
    assert_eq!(
        words("แจ้งเตือนการเข้าสู่ระบบ"),
        ["แจ้ง", "เตือน", "การ", "เข้า", "สู่", "ระบบ"]
    );
    assert_eq!(words("Hi, you"), ["Hi", ",", " ", "you"]);
    assert!(words("").is_empty());
    for text in [PAID, SHIPPED] {
        let w = words(text);
        assert_eq!(w.concat(), text);
        let mut at = 0;
        let mut ours = vec![0];
        for word in &w {
            at += word.len();
            ours.push(at);
        }
        assert_eq!(ours, icu_bounds(text), "exactly the segmenter's boundaries");
    }
}

#[test]
fn the_measured_apns_cut_keeps_the_whole_word_instead_of_a_dangling_vowel() {
    // The budget the grapheme cut filled with `…แจ้งเ…`: room for "แจ้งเ" and "…".
    let inside = PAID.find("แจ้งเ").unwrap() + "แจ้งเ".len();
    let budget = inside + ELLIPSIS.len();
    let out = shorten_to_fit(PAID, |s| s.len() <= budget).unwrap();
    assert_eq!(out, "เราได้รับชำระเงินเรียบร้อยแล้ว ขอบคุณที่ใช้บริการ แจ้ง…");
    // One grapheme further in ("แจ้งเต") still keeps "แจ้ง" only.
    let budget = budget + "ต".len();
    let out = shorten_to_fit(PAID, |s| s.len() <= budget).unwrap();
    assert!(out.ends_with(" แจ้ง…"), "{out}");
    // Room for "แจ้งเตือน" exactly: the next word is kept whole.
    let end = PAID.find("แจ้งเตือน").unwrap() + "แจ้งเตือน".len();
    let out = shorten_to_fit(PAID, |s| s.len() <= end + ELLIPSIS.len()).unwrap();
    assert!(out.ends_with(" แจ้งเตือน…"), "{out}");
}

#[test]
fn every_push_budget_cuts_thai_at_the_last_word_that_fits() {
    for text in [PAID, SHIPPED] {
        let bounds = icu_bounds(text);
        // From the first budget every word fits in (smaller ones cut a word: see below).
        let longest = words(text).iter().map(|w| w.len()).max().unwrap();
        for budget in longest + ELLIPSIS.len()..text.len() {
            let out = shorten_to_fit(text, |s| s.len() <= budget).unwrap();
            assert!(out.len() <= budget);
            let kept = out
                .strip_suffix(ELLIPSIS)
                .expect("shortened text ends with …");
            assert!(text.starts_with(kept));
            assert!(bounds.contains(&kept.len()), "cut inside a word: {out}");
            assert!(!kept.ends_with(LEADING_VOWELS), "{out}");
            // The longest such text: the next word (with any space before it) does not fit.
            let next = bounds
                .iter()
                .find(|&&b| b > kept.len() && !text[kept.len()..b].trim().is_empty());
            let next = text[..*next.unwrap()].trim_end();
            assert!(
                next.len() + ELLIPSIS.len() > budget,
                "{out} could keep {next}"
            );
        }
    }
}

#[test]
fn english_is_cut_between_words() {
    let text = "Your order has shipped and arrives tomorrow";
    let out = shorten_to_fit(text, |s| s.len() <= 20).unwrap();
    assert_eq!(out, "Your order has…");
    let parts = split_utf16(text, 12, 5).unwrap();
    assert_eq!(
        parts,
        ["Your order ", "has shipped ", "and arrives ", "tomorrow"]
    );
}

#[test]
fn short_text_is_one_piece() {
    assert_eq!(split_utf16("สวัสดี", 5000, 5).unwrap(), vec!["สวัสดี"]);
    assert_eq!(split_utf16("", 5000, 5).unwrap(), vec![""]);
}

#[test]
fn a_long_line_text_without_spaces_is_split_between_thai_words() {
    // Sentences run together with no space: only the dictionary can find the cuts.
    let sentence: String = PAID.split(' ').collect();
    let text = sentence.repeat(90);
    assert!(text.encode_utf16().count() > 6_000);
    let parts = split_utf16(&text, 5000, 5).unwrap();
    assert_eq!(parts.len(), 2);
    assert_cut_at_words(&text, &parts);
    let first = parts[0].encode_utf16().count();
    assert!(first <= 5000);
    // The first piece is as full as whole words allow: the next word would not fit.
    let bounds = icu_bounds(&text);
    let next_end = *bounds.iter().find(|&&b| b > parts[0].len()).unwrap();
    let next = &text[parts[0].len()..next_end];
    assert!(
        first + next.encode_utf16().count() > 5000,
        "{first} + {next}"
    );
    assert!(!starts_with_combining_mark(&parts[1]));
}

#[test]
fn a_long_line_text_with_spaces_is_split_after_a_space() {
    let text = [PAID, SHIPPED].join(" ").repeat(40); // about 6,900 UTF-16 units
    assert!(text.encode_utf16().count() > 6_000);
    let parts = split_utf16(&text, 5000, 5).unwrap();
    assert_eq!(parts.len(), 2);
    assert_cut_at_words(&text, &parts);
    assert!(
        parts[0].ends_with(' '),
        "{:?}",
        &parts[0][parts[0].len() - 30..]
    );
    assert!(parts.iter().all(|p| p.encode_utf16().count() <= 5000));
}

#[test]
fn a_thai_run_the_dictionary_does_not_know_is_still_cut_where_icu_allows() {
    let text = "ก".repeat(7000);
    let parts = split_utf16(&text, 5000, 5).unwrap();
    assert_cut_at_words(&text, &parts);
    assert!(parts.iter().all(|p| p.encode_utf16().count() <= 5000));
}

#[test]
fn a_word_longer_than_a_piece_falls_back_to_whole_grapheme_clusters() {
    // One word of 3,500 clusters "é" (e + U+0301: 2 UTF-16 units each) after a short word.
    let word = "e\u{301}".repeat(3500);
    assert_eq!(words(&word).len(), 1, "one word by UAX #29");
    let text = format!("Code {word}");
    let parts = split_utf16(&text, 5001, 5).unwrap();
    assert_eq!(parts.concat(), text);
    // The piece is filled to the last whole cluster within the limit: 5 + 2 x 2,498.
    assert_eq!(parts[0].encode_utf16().count(), 5001);
    assert_eq!(parts[1].encode_utf16().count(), 7005 - 5001);
    let clusters = grapheme_bounds(&text);
    assert!(clusters.contains(&parts[0].len()), "a cluster was split");
    assert!(parts[1].starts_with('e'));

    // A long URL token in a push body: cut inside it, at the budget, not before "https".
    let url = format!("https://example.com/t/{}", "A1b2".repeat(1000));
    let body = format!("Open {url} now");
    let out = shorten_to_fit(&body, |s| s.len() <= 100).unwrap();
    assert_eq!(out.len(), 100);
    assert_eq!(out, format!("{}{ELLIPSIS}", &body[..97]));
    // And the clustered word alone, with a byte budget landing inside a cluster.
    let out = shorten_to_fit(&word, |s| s.len() <= 10).unwrap();
    assert_eq!(out, format!("{}{ELLIPSIS}", "e\u{301}".repeat(2)));
}

#[test]
fn surrogate_pairs_and_emoji_sequences_are_never_split() {
    // 4 units per family emoji part pair; make the limit land inside one.
    let text = "👨‍👩‍👧".repeat(10); // each cluster: 8 UTF-16 units
    let parts = split_utf16(&text, 12, 10).unwrap();
    assert_eq!(parts.concat(), text);
    assert!(parts.iter().all(|p| p == "👨‍👩‍👧"), "{parts:?}");
    let parts = split_utf16(&"😀".repeat(5), 3, 5).unwrap();
    assert_eq!(parts, vec!["😀"; 5]);
}

#[test]
fn a_line_break_near_the_end_is_preferred() {
    let text = format!("{}\n{}", "a ".repeat(45), "b".repeat(50));
    let parts = split_utf16(&text, 100, 5).unwrap();
    assert_eq!(parts[0], format!("{}\n", "a ".repeat(45)));
    assert_eq!(parts[1], "b".repeat(50));
}

#[test]
fn more_than_the_allowed_pieces_is_an_error() {
    let text = "ขอบคุณที่ใช้บริการ".repeat(1500); // 27,000 units > 5 x 5,000
    let e = split_utf16(&text, 5000, 5).unwrap_err();
    assert_eq!(e.needed_units, 27_000);
    assert!(
        split_utf16(&"😀".repeat(3), 1, 5).is_err(),
        "a pair cannot fit in 1 unit"
    );
}

#[test]
fn shortening_returns_fitting_text_unchanged_and_none_when_nothing_fits() {
    assert_eq!(shorten_to_fit("short", |s| s.len() <= 10).unwrap(), "short");
    assert_eq!(shorten_to_fit("long text", |s| s.len() <= 2), None);
    assert_eq!(shorten_to_fit(PAID, |s| s.len() <= 3).unwrap(), ELLIPSIS);
}
