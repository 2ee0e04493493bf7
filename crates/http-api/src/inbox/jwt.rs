//! End-user tokens: the JWT checks of the inbox API (see the [`super`] module docs) and
//! the JWKS they verify against.

use super::InboxState;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

/// Largest bearer token accepted, in bytes. A JWT with the claims this service reads is
/// well under 1 KiB; the bound keeps a client from making every request parse and hash
/// a large header.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Clock skew allowed on `exp` and `nbf`, in seconds.
pub const TOKEN_LEEWAY_SECS: u64 = 30;

/// Verifies end-user tokens.
pub struct Verifier {
    hs256: Option<DecodingKey>,
    /// Keys from the JWKS file, then those last fetched from the JWKS URL.
    jwks: std::sync::RwLock<Vec<(Option<String>, DecodingKey, Algorithm)>>,
    file_keys: usize,
    /// Required `aud`, if configured.
    audience: Option<String>,
    /// Required `iss`, if configured.
    issuer: Option<String>,
}

/// The RS256/ES256 keys of a JWKS document.
fn jwks_keys(text: &str) -> Result<Vec<(Option<String>, DecodingKey, Algorithm)>, String> {
    let set: jsonwebtoken::jwk::JwkSet =
        serde_json::from_str(text).map_err(|e| format!("the JWKS is not valid: {e}"))?;
    let mut keys = Vec::new();
    for k in &set.keys {
        let alg = match &k.algorithm {
            jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => Algorithm::RS256,
            jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_) => Algorithm::ES256,
            _ => continue,
        };
        let key = DecodingKey::from_jwk(k).map_err(|e| format!("JWKS key: {e}"))?;
        keys.push((k.common.key_id.clone(), key, alg));
    }
    Ok(keys)
}

/// Fetches the JWKS at `url` into `verifier` now and every 10 minutes; a failed fetch
/// keeps the keys it had.
pub async fn refresh_jwks(verifier: Arc<InboxState>, url: String) {
    let http = reqwest::Client::new();
    loop {
        let fetched = async {
            let text = http
                .get(&url)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .map_err(|e| e.to_string())?
                .error_for_status()
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            jwks_keys(&text)
        }
        .await;
        match fetched {
            Ok(keys) => {
                let v = &verifier.verifier;
                let mut slot = v.jwks.write().unwrap_or_else(|e| e.into_inner());
                slot.truncate(v.file_keys);
                slot.extend(keys);
            }
            Err(e) => {
                tracing::warn!(%url, error = %e, "JWKS fetch failed; keeping the keys I have")
            }
        }
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
}

impl Verifier {
    /// Builds the keys; `Err` names what is wrong with the JWKS.
    pub fn new(cfg: &super::InboxConfig) -> Result<Self, String> {
        let hs256 = cfg
            .jwt_secret
            .as_ref()
            .map(|s| DecodingKey::from_secret(s.as_bytes()))
            .transpose()
            .map_err(|e| format!("NOTIFY_INBOX_JWT_SECRET: {e}"))?;
        let jwks = match &cfg.jwks_json {
            Some(text) => jwks_keys(text)?,
            None => Vec::new(),
        };
        Ok(Self {
            hs256,
            file_keys: jwks.len(),
            jwks: std::sync::RwLock::new(jwks),
            audience: cfg.jwt_audience.clone(),
            issuer: cfg.jwt_issuer.clone(),
        })
    }

    /// The user id (`sub`, NFC-normalised) of a valid token.
    ///
    /// # Errors
    /// Why the token is refused, for the 401 answer: too large, not a JWT, an algorithm or
    /// key not accepted, wrongly signed, expired, not valid yet (`nbf`), wrong `aud` or
    /// `iss`, a required claim missing, or a `sub` that is not a valid user id.
    pub fn verify(&self, token: &str) -> Result<String, String> {
        #[derive(Deserialize)]
        struct Claims {
            sub: String,
            /// As sent: jsonwebtoken also takes an array here, which RFC 7519 does not.
            #[serde(default)]
            iss: Option<serde_json::Value>,
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(format!("must be at most {MAX_TOKEN_BYTES} bytes"));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| "not a JWT".to_string())?;
        let jwks = self.jwks.read().unwrap_or_else(|e| e.into_inner());
        let key = match header.alg {
            Algorithm::HS256 => self.hs256.as_ref().map(|k| (k, Algorithm::HS256)),
            alg => jwks
                .iter()
                .find(|(kid, _, a)| *a == alg && (header.kid.is_none() || kid == &header.kid))
                .map(|(_, k, a)| (k, *a)),
        }
        .ok_or("signed with an algorithm or key this service does not accept")?;
        let mut v = Validation::new(key.1);
        v.leeway = TOKEN_LEEWAY_SECS;
        v.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        match &self.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                required.push("aud");
            }
            None => v.validate_aud = false,
        }
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        v.set_required_spec_claims(&required);
        let data = jsonwebtoken::decode::<Claims>(token, key.0, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::ExpiredSignature => "expired".to_string(),
                ErrorKind::ImmatureSignature => "not valid yet (nbf)".to_string(),
                ErrorKind::InvalidSignature => "wrongly signed".to_string(),
                ErrorKind::InvalidAudience => "issued for another audience (aud)".to_string(),
                ErrorKind::InvalidIssuer => "from another issuer (iss)".to_string(),
                ErrorKind::MissingRequiredClaim(c) => format!("the {c} claim is required"),
                _ => "invalid".to_string(),
            }
        })?;
        // RFC 7519 section 4.1.1: `iss` is one StringOrURI. jsonwebtoken accepts an array
        // too (and matches any of its members), so a token naming several issuers is
        // refused here, whether or not an issuer is required.
        if data.claims.iss.as_ref().is_some_and(|iss| !iss.is_string()) {
            return Err("iss must be a single string (RFC 7519)".to_string());
        }
        // The one id rule ingest applies to a recipient's user id (NFC-normalised), so a
        // token can name only a user id that can exist (and a NUL never reaches Postgres).
        let mut violations = notify_core::validate::Violations::default();
        match violations.id(
            "sub",
            &data.claims.sub,
            notify_core::event::MAX_USER_ID_BYTES,
        ) {
            Some(sub) => Ok(sub),
            None => {
                let why = violations.0.first().map_or("", |f| f.description.as_str());
                Err(format!("sub {why}"))
            }
        }
    }
}
