//! Text as a reader sees it, for scanning: HTML without tags and character references,
//! URLs percent-decoded.

/// The text a reader sees in an HTML fragment: tags removed, character references
/// (`&#49;`, `&#x31;`, `&amp;` and the like) decoded. For scanning email HTML.
pub fn html_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if !in_tag => out.push(c),
            _ => {}
        }
    }
    let mut decoded = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(pos) = rest.find('&') {
        decoded.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        let end = tail.find(';').filter(|e| *e <= 12);
        let reference = end.map(|e| &tail[1..e]);
        let ch = reference.and_then(|r| match r {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "nbsp" => Some('\u{00A0}'),
            _ => r
                .strip_prefix("#x")
                .or_else(|| r.strip_prefix("#X"))
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| r.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        });
        match (ch, end) {
            (Some(c), Some(e)) => {
                decoded.push(c);
                rest = &tail[e + 1..];
            }
            _ => {
                decoded.push('&');
                rest = &tail[1..];
            }
        }
    }
    decoded.push_str(rest);
    decoded
}

/// `text` with `%XX` escapes decoded (invalid UTF-8 replaced). For scanning URLs.
pub fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
