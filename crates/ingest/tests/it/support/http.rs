//! Clients of the in-process http-api: the console's sign-in, session cookie and CSRF
//! token, inbox bearer tokens, and signed LINE webhooks.

use super::{CONSOLE_PASSWORD, CONSOLE_USER, LINE_SECRET, Platform};
use serde_json::Value;

/// An HTTP client that does not follow redirects, so a test sees the console's 303s.
pub(crate) fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The console's sign-in form (`POST {base}/console/login`) with the test staff account
/// ([`CONSOLE_USER`], [`CONSOLE_PASSWORD`]), not sent yet: the caller may add headers.
/// A sign-in that succeeds answers 303 with the session cookie.
pub(crate) fn console_login(http: &reqwest::Client, base: &str) -> reqwest::RequestBuilder {
    http.post(format!("{base}/console/login"))
        .form(&[("user", CONSOLE_USER), ("password", CONSOLE_PASSWORD)])
}

/// The cookie `r` sets, as `name=value` (what a browser sends back); panics if it sets
/// none.
pub(crate) fn session_cookie(r: &reqwest::Response) -> String {
    r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

/// The CSRF token of the first form in a console page (its hidden `csrf` field).
pub(crate) fn csrf_token(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string()
}

impl Platform {
    /// Signs in to the console with the test staff account; returns the session cookie
    /// (`name=value`). Panics if the sign-in sets none.
    pub(crate) async fn console_cookie(&self) -> String {
        let r = console_login(&no_redirects(), &self.http_url)
            .send()
            .await
            .unwrap();
        session_cookie(&r)
    }

    /// The console page at `path` (`/console/...`) as the session `cookie` sees it.
    pub(crate) async fn console_page(&self, cookie: &str, path: &str) -> String {
        no_redirects()
            .get(format!("{}{path}", self.http_url))
            .header("cookie", cookie)
            .text_body()
            .await
    }

    /// Posts the console form at `path` with the session `cookie` and the CSRF token of
    /// the `confirm` page that offered it; redirects are not followed (an action answers
    /// 303).
    pub(crate) async fn console_post(
        &self,
        cookie: &str,
        path: &str,
        confirm: &str,
    ) -> reqwest::Response {
        no_redirects()
            .post(format!("{}{path}", self.http_url))
            .header("cookie", cookie)
            .form(&[("csrf", csrf_token(confirm).as_str())])
            .send()
            .await
            .unwrap()
    }
}

/// An HS256 JWT of `claims` signed with `secret` (the inbox API's tokens use
/// [`super::INBOX_SECRET`]).
pub(crate) fn hs256(claims: &Value, secret: &str) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// A LINE webhook body with one `postback` event from `user` carrying `data` (what a
/// button of a Flex message with a postback action sends), with webhook event id
/// `event_id`, as the Messaging API reference describes it.
pub(crate) fn postback(user: &str, data: &str, event_id: &str) -> String {
    serde_json::json!({"destination": "U00000000000000000000000000000000", "events": [{
        "type": "postback",
        "mode": "active",
        "timestamp": chrono::Utc::now().timestamp_millis(),
        "source": {"type": "user", "userId": user},
        "webhookEventId": event_id,
        "deliveryContext": {"isRedelivery": false},
        "replyToken": "b60d432864f44d079f6d8efe86cf404b",
        "postback": {"data": data},
    }]})
    .to_string()
}

/// An inbox API token for `user` ([`super::INBOX_SECRET`], HS256) that expires in
/// `seconds`.
pub(crate) fn inbox_token(user: &str, seconds: i64) -> String {
    hs256(
        &serde_json::json!({"sub": user, "exp": chrono::Utc::now().timestamp() + seconds}),
        super::INBOX_SECRET,
    )
}

/// `POST {base}/webhooks/line` with `body` and the `x-line-signature` LINE computes over
/// it with [`LINE_SECRET`]; returns the response.
pub(crate) async fn line_webhook(p: &Platform, base: &str, body: &str) -> reqwest::Response {
    p.http
        .post(format!("{base}/webhooks/line"))
        .header(
            "x-line-signature",
            notify_core::signed::line_signature(LINE_SECRET, body.as_bytes()),
        )
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// Sending a request and reading its whole body, for tests that read the body whatever
/// the status: `req.json_body().await` instead of
/// `req.send().await.unwrap().json().await.unwrap()`.
pub(crate) trait SendExt {
    /// Sends the request and parses the body as JSON; panics on a transport error or a
    /// body that is not `T`.
    fn json_body<T: serde::de::DeserializeOwned>(self) -> impl Future<Output = T> + Send;
    /// Sends the request and returns the body as text; panics on a transport error.
    fn text_body(self) -> impl Future<Output = String> + Send;
}

impl SendExt for reqwest::RequestBuilder {
    async fn json_body<T: serde::de::DeserializeOwned>(self) -> T {
        self.send().await.unwrap().json().await.unwrap()
    }

    async fn text_body(self) -> String {
        self.send().await.unwrap().text().await.unwrap()
    }
}

/// A caller of the inbox API acting for one user with a bearer token (`token`).
pub(crate) struct InboxClient<'a> {
    pub(crate) p: &'a super::Platform,
    pub(crate) token: String,
}

impl<'a> InboxClient<'a> {
    /// A client acting for `user` with a token valid for 5 minutes.
    pub(crate) fn of(p: &'a super::Platform, user: &str) -> Self {
        InboxClient {
            p,
            token: inbox_token(user, 300),
        }
    }

    /// `GET path`: the status and the JSON body (`null` when there is none).
    pub(crate) async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self
            .p
            .http
            .get(format!("{}{path}", self.p.http_url))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        (
            r.status().as_u16(),
            r.json().await.unwrap_or(serde_json::Value::Null),
        )
    }

    /// `POST path` with a JSON `body`: the status and the JSON body.
    pub(crate) async fn post(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let r = self
            .p
            .http
            .post(format!("{}{path}", self.p.http_url))
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (
            r.status().as_u16(),
            r.json().await.unwrap_or(serde_json::Value::Null),
        )
    }

    /// `POST /v1/inbox/notifications/{id}/click` for `action` (`""` = the notification).
    pub(crate) async fn click(&self, id: &str, action: &str) -> (u16, serde_json::Value) {
        let body = serde_json::json!({ "action_id": action }).to_string();
        self.post(&format!("/v1/inbox/notifications/{id}/click"), &body)
            .await
    }

    /// The first page of the inbox (asserting 200).
    pub(crate) async fn page(&self) -> serde_json::Value {
        let (status, page) = self.get("/v1/inbox/notifications").await;
        assert_eq!(status, 200, "{page}");
        page
    }

    /// Waits up to `within` for the newest notification in the inbox and marks it read
    /// (`POST .../read`, asserted 2xx). Returns its id.
    pub(crate) async fn read_newest(&self, within: std::time::Duration) -> String {
        let id = super::eventually("the notification in the inbox", within, async || {
            let page = self.page().await;
            match page["items"][0]["id"].as_str() {
                Some(id) => Ok(id.to_string()),
                None => Err(page),
            }
        })
        .await;
        let (status, body) = self
            .post(&format!("/v1/inbox/notifications/{id}/read"), "")
            .await;
        assert!((200..300).contains(&status), "{status} {body}");
        id
    }
}
