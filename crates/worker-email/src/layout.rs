//! The HTML and text parts of every email.
//!
//! The HTML part is the content rendered into a layout: by default the shipped
//! [`DEFAULT_LAYOUT`] (`crates/worker-email/layout/notification.html`: one file, CSS inlined
//! on the elements plus one media query for narrow screens, a Thai-safe font stack, the
//! image, the actions as buttons and, for marketing mail, the unsubscribe link), or the
//! operator's own minijinja template named by `NOTIFY_EMAIL_LAYOUT`. A content whose
//! `email_html` is a whole document (it has `<html`) is sent as it is; a fragment is put
//! in the layout in place of the body.
//!
//! The text part says the same as the HTML part: the title, the body (or `email_text`
//! when given), each action as `label: url` (or the tap link), and the unsubscribe link.
//! Actions with an app deep link (`myshop://…`) are left out of both: no mail reader
//! opens them.

use minijinja::{AutoEscape, Environment, UndefinedBehavior, context};
use notify_core::Content;
use notify_core::content::escape_html;

/// The shipped layout.
pub const DEFAULT_LAYOUT: &str = include_str!("../layout/notification.html");

const NAME: &str = "layout.html";

/// A compiled email layout.
#[derive(Debug)]
pub struct Layout {
    env: Environment<'static>,
}

impl Default for Layout {
    fn default() -> Self {
        Self::new(DEFAULT_LAYOUT.to_string()).expect("the shipped layout compiles and renders")
    }
}

/// What a layout is rendered with.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    /// The rendered content.
    pub content: &'a Content,
    /// The recipient's locale (`th-TH`): the page's `lang` and the footer's language.
    pub locale: &'a str,
    /// The one-click unsubscribe URL (marketing types only).
    pub unsubscribe_url: Option<&'a str>,
}

fn language(locale: &str) -> &str {
    locale.split(['-', '_']).next().unwrap_or("th")
}

/// The body as HTML paragraphs: blank lines separate paragraphs, single line breaks
/// become `<br>`, everything escaped.
fn paragraphs(body: &str) -> String {
    body.split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            format!(
                "<p style=\"margin:0 0 12px 0;\">{}</p>",
                escape_html(p).replace('\n', "<br>")
            )
        })
        .collect()
}

impl Layout {
    /// Compiles `source` (minijinja, HTML auto-escaped, strict about undefined
    /// variables) and renders it once with a sample, so that a broken layout fails when
    /// the worker starts, not at send time.
    ///
    /// # Errors
    /// The template does not compile or render, named with its line.
    pub fn new(source: String) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env.set_auto_escape_callback(|_| AutoEscape::Html);
        env.set_fuel(Some(notify_core::template::FUEL));
        env.add_template_owned(NAME, source)
            .map_err(|e| format!("email layout line {}: {e}", e.line().unwrap_or(0)))?;
        let layout = Self { env };
        let sample = Content {
            title: "ตัวอย่าง".into(),
            body: "ตัวอย่าง".into(),
            actions: vec![notify_core::Action {
                id: "a".into(),
                label: "ดู".into(),
                url: "https://example.test/".into(),
            }],
            ..Default::default()
        };
        layout.html(Parts {
            content: &sample,
            locale: "th-TH",
            unsubscribe_url: Some("https://example.test/unsubscribe"),
        })?;
        Ok(layout)
    }

    /// Reads the layout file named by `NOTIFY_EMAIL_LAYOUT` (unset = the shipped layout).
    /// A file that cannot be read or does not compile is recorded in `env`.
    pub fn from_env(env: &mut notify_core::config::Env) -> Self {
        let path = env.string("NOTIFY_EMAIL_LAYOUT", "");
        if path.is_empty() {
            return Self::default();
        }
        match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(Self::new)
        {
            Ok(layout) => layout,
            Err(e) => {
                env.error(format!("NOTIFY_EMAIL_LAYOUT={path:?}: {e}"));
                Self::default()
            }
        }
    }

    /// The HTML part.
    ///
    /// # Errors
    /// The layout fails to render (an operator's layout with a runtime error).
    pub fn html(&self, parts: Parts) -> Result<String, String> {
        let c = parts.content;
        if c.email_html.to_ascii_lowercase().contains("<html") {
            return Ok(c.email_html.clone());
        }
        let body_html = if c.email_html.is_empty() {
            paragraphs(&c.body)
        } else {
            c.email_html.clone()
        };
        // Every value goes in escaped by `escape_html` (which leaves `/` alone, so links
        // read as written) and marked safe, so the layout's auto-escaping keeps it as is.
        let safe = |text: &str| minijinja::Value::from_safe_string(escape_html(text));
        let preheader: String = c.body.chars().take(110).collect();
        let actions: Vec<_> = c
            .actions
            .iter()
            .filter(|a| a.is_web_link())
            .map(|a| context! {label => safe(&a.label), url => safe(&a.url), id => safe(&a.id)})
            .collect();
        let template = self.env.get_template(NAME).map_err(|e| e.to_string())?;
        template
            .render(context! {
                lang => safe(language(parts.locale)),
                subject => safe(c.subject()),
                title => safe(&c.title),
                preheader => safe(&preheader),
                body_html => minijinja::Value::from_safe_string(body_html),
                image_url => safe(&c.image_url),
                actions => actions,
                url => safe(&c.url),
                unsubscribe_url => parts.unsubscribe_url.map(safe),
            })
            .map_err(|e| format!("email layout line {}: {e}", e.line().unwrap_or(0)))
    }
}

/// The text part: `email_text` when given, else the title and the body; then each action
/// as `label: url` (or the tap link when there are none), and the unsubscribe link.
pub fn text_part(parts: Parts) -> String {
    let c = parts.content;
    let mut blocks: Vec<String> = Vec::new();
    if c.email_text.is_empty() {
        blocks.push(c.title.clone());
        if !c.body.trim().is_empty() {
            blocks.push(c.body.clone());
        }
        let web: Vec<_> = c.actions.iter().filter(|a| a.is_web_link()).collect();
        if !web.is_empty() {
            blocks.push(
                web.iter()
                    .map(|a| format!("{}: {}", a.label, a.url))
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
        } else if !c.url.is_empty() {
            blocks.push(c.url.clone());
        }
    } else {
        blocks.push(c.email_text.clone());
    }
    if let Some(u) = parts.unsubscribe_url {
        blocks.push(if language(parts.locale) == "th" {
            format!("ยกเลิกการรับอีเมล: {u}")
        } else {
            format!("Unsubscribe: {u}")
        });
    }
    blocks.join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rich() -> Content {
        Content {
            title: "ชำระเงินสำเร็จ <#1001>".into(),
            body: "เราได้รับชำระเงิน 1,250.00 บาท\nขอบคุณ\n\nย่อหน้าสอง".into(),
            image_url: "https://cdn.shop.example/o/1001.png".into(),
            actions: vec![
                notify_core::Action {
                    id: "view".into(),
                    label: "ดูคำสั่งซื้อ".into(),
                    url: "https://shop.example/o/1001?a=1&b=2".into(),
                },
                notify_core::Action {
                    id: "help".into(),
                    label: "ติดต่อร้าน".into(),
                    url: "https://shop.example/help".into(),
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn the_layout_shows_title_body_image_buttons_and_unsubscribe_escaped() {
        let c = rich();
        let parts = Parts {
            content: &c,
            locale: "th-TH",
            unsubscribe_url: Some("https://notify.example/unsubscribe?token=x"),
        };
        let html = Layout::default().html(parts).unwrap();
        assert!(
            html.starts_with("<!doctype html>\n<html lang=\"th\">"),
            "{html}"
        );
        assert!(html.contains(">ชำระเงินสำเร็จ &lt;#1001&gt;</h1>"), "{html}");
        assert!(
            html.contains("เราได้รับชำระเงิน 1,250.00 บาท<br>ขอบคุณ</p>"),
            "{html}"
        );
        assert!(html.contains(">ย่อหน้าสอง</p>"), "{html}");
        assert!(
            html.contains("<img src=\"https://cdn.shop.example/o/1001.png\""),
            "{html}"
        );
        assert!(
            html.contains("href=\"https://shop.example/o/1001?a=1&amp;b=2\""),
            "{html}"
        );
        assert!(
            html.contains(">ดูคำสั่งซื้อ</a>") && html.contains(">ติดต่อร้าน</a>"),
            "{html}"
        );
        assert!(html.contains(">ยกเลิกการรับอีเมล</a>"), "{html}");
        assert!(html.contains("'Noto Sans Thai'"), "a Thai-safe font stack");
        assert_eq!(
            text_part(parts),
            "ชำระเงินสำเร็จ <#1001>\n\nเราได้รับชำระเงิน 1,250.00 บาท\nขอบคุณ\n\nย่อหน้าสอง\n\n\
             ดูคำสั่งซื้อ: https://shop.example/o/1001?a=1&b=2\nติดต่อร้าน: https://shop.example/help\n\n\
             ยกเลิกการรับอีเมล: https://notify.example/unsubscribe?token=x"
        );
    }

    #[test]
    fn a_transactional_mail_has_no_footer_and_a_whole_document_is_sent_as_it_is() {
        let mut c = rich();
        c.actions.clear();
        c.url = "https://shop.example/o/1001".into();
        let parts = Parts {
            content: &c,
            locale: "en",
            unsubscribe_url: None,
        };
        let html = Layout::default().html(parts).unwrap();
        assert!(!html.contains("nsubscribe"), "{html}");
        assert!(html.contains("<html lang=\"en\">"));
        assert!(text_part(parts).ends_with("\n\nhttps://shop.example/o/1001"));
        let mut whole = c.clone();
        whole.email_html = "<html><body><p>mine</p></body></html>".into();
        let parts = Parts {
            content: &whole,
            locale: "en",
            unsubscribe_url: None,
        };
        assert_eq!(Layout::default().html(parts).unwrap(), whole.email_html);
        let mut fragment = c.clone();
        fragment.email_html = "<p>ส่วน <b>HTML</b></p>".into();
        let parts = Parts {
            content: &fragment,
            ..parts
        };
        assert!(
            Layout::default()
                .html(parts)
                .unwrap()
                .contains("<div style=\"margin:0 0 8px 0;\"><p>ส่วน <b>HTML</b></p></div>")
        );
    }

    #[test]
    fn an_operators_layout_replaces_the_shipped_one_and_a_broken_one_is_refused() {
        let mine = Layout::new(
            "<main>{{ title }}{% for a in actions %}[{{ a.label }}]{% endfor %}</main>".into(),
        )
        .unwrap();
        let c = rich();
        let html = mine
            .html(Parts {
                content: &c,
                locale: "th",
                unsubscribe_url: None,
            })
            .unwrap();
        assert_eq!(
            html,
            "<main>ชำระเงินสำเร็จ &lt;#1001&gt;[ดูคำสั่งซื้อ][ติดต่อร้าน]</main>"
        );
        let err = Layout::new("<p>\n{% for %}</p>".into()).unwrap_err();
        assert!(err.starts_with("email layout line 2"), "{err}");
    }
}
