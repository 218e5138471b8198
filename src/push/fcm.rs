//! FCM HTTP v1: a service-account key signs a JWT, exchanged for an OAuth2 access token (cached
//! until shortly before it expires), which authorises each send.
//!
//! The JWT is signed with ring, the crypto library rustls already links: the jsonwebtoken crate
//! offers only aws-lc-rs (which needs cmake and clang to cross-build for ARM) or a second,
//! RustCrypto-based RSA stack, for what is one RS256 signature an hour.

use std::time::{Duration, Instant};

use base64::Engine;
use serde::Deserialize;
use serde_json::json;

use super::{Content, Deliver, Failure, PushConfig, PushError, PushJob, Target};

const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
/// Renew the access token this long before Google says it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);

/// Largest service-account key file read (from the config file's path or the Push page's
/// upload): Google's are about 2.3 KB, a 4096-bit key about 3.3 KB.
pub const MAX_KEY_BYTES: usize = 8 << 10;

struct ServiceAccount {
    project_id: String,
    client_email: String,
    private_key: String,
    token_uri: String,
}

/// What of a service-account key may be shown (never the private key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySummary {
    pub project_id: String,
    pub client_email: String,
}

/// Reads a service-account key file, at most [`MAX_KEY_BYTES`].
pub fn read_key_file(path: &std::path::Path) -> Result<String, PushError> {
    use std::io::Read;
    let read = |source| PushError::Read {
        what: "the FCM credentials",
        path: path.to_owned(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(read)?
        .take(MAX_KEY_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(read)?;
    if text.len() > MAX_KEY_BYTES {
        return Err(PushError::Credentials(format!(
            "the key file is larger than {MAX_KEY_BYTES} bytes"
        )));
    }
    Ok(text)
}

/// Whether `text` is a service-account key FCM can use: JSON of `type` `service_account`
/// with a project, a client email, a token URI and an RSA private key that parses. The errors
/// never quote the key.
pub fn check_key(text: &str) -> Result<KeySummary, PushError> {
    let (account, _) = parse_key(text)?;
    Ok(KeySummary {
        project_id: account.project_id,
        client_email: account.client_email,
    })
}

/// Who a stored key is for, read from its JSON alone (no key parsing: for showing, not for
/// trusting; `check_key` is what judges a key).
pub fn key_summary(text: &str) -> Option<KeySummary> {
    let fields = key_fields(text).ok()?;
    Some(KeySummary {
        project_id: text_field(&fields, "project_id").ok()?,
        client_email: text_field(&fields, "client_email").ok()?,
    })
}

/// The key file's JSON object. Read as a plain value, not into a struct: serde's type errors
/// quote the value they met, which here may be the private key.
fn key_fields(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, PushError> {
    if text.len() > MAX_KEY_BYTES {
        return Err(PushError::Credentials(format!(
            "the key is larger than {MAX_KEY_BYTES} bytes"
        )));
    }
    // A syntax error names a position, never the text there.
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(PushError::Credentials(
            "not a service-account key: not a JSON object".into(),
        )),
        Err(e) => Err(PushError::Credentials(format!(
            "not a service-account key: not JSON ({e})"
        ))),
    }
}

/// A field of the key that must be non-empty text; the error names the field only.
fn text_field(
    fields: &serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Result<String, PushError> {
    match fields.get(name).and_then(serde_json::Value::as_str) {
        Some(v) if !v.trim().is_empty() => Ok(v.to_owned()),
        _ => Err(PushError::Credentials(format!(
            "`{name}` is missing, empty or not text"
        ))),
    }
}

fn parse_key(text: &str) -> Result<(ServiceAccount, ring::signature::RsaKeyPair), PushError> {
    let bad = |why: &str| PushError::Credentials(why.to_owned());
    let fields = key_fields(text)?;
    if fields.get("type").and_then(serde_json::Value::as_str) != Some("service_account") {
        return Err(bad(
            "not a service-account key: `type` is not `service_account`",
        ));
    }
    let account = ServiceAccount {
        project_id: text_field(&fields, "project_id")?,
        client_email: text_field(&fields, "client_email")?,
        private_key: text_field(&fields, "private_key")?,
        token_uri: text_field(&fields, "token_uri")?,
    };
    if !account.token_uri.starts_with("https://") && !account.token_uri.starts_with("http://") {
        return Err(bad("`token_uri` is not an http(s) URL"));
    }
    let pem = ureq::tls::PrivateKey::from_pem(account.private_key.as_bytes())
        .map_err(|_| bad("`private_key` is not a PEM private key"))?;
    let key = ring::signature::RsaKeyPair::from_pkcs8(pem.der()).map_err(|e| {
        PushError::Credentials(format!("`private_key` is not an RSA PKCS#8 key: {e}"))
    })?;
    Ok((account, key))
}

pub struct Fcm {
    agent: ureq::Agent,
    endpoint: String,
    account: ServiceAccount,
    key: ring::signature::RsaKeyPair,
    token: Option<(String, Instant)>,
}

impl Fcm {
    pub fn new(config: &PushConfig, agent: ureq::Agent) -> Result<Fcm, PushError> {
        let path = config
            .fcm_credentials
            .as_ref()
            .ok_or(PushError::NoCredentials)?;
        let (account, key) = parse_key(&read_key_file(path)?)?;
        Ok(Fcm {
            agent,
            endpoint: config.fcm_endpoint.trim_end_matches('/').to_owned(),
            account,
            key,
            token: None,
        })
    }

    /// A signed JWT asserting the service account, for the token endpoint.
    fn assertion(&self) -> Result<String, String> {
        let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let now = crate::ids::now_ms() / 1000;
        let header = json!({ "alg": "RS256", "typ": "JWT" });
        let claims = json!({
            "iss": self.account.client_email,
            "scope": SCOPE,
            "aud": self.account.token_uri,
            "iat": now,
            "exp": now + 3600,
        });
        let signing_input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = ring::rand::SystemRandom::new();
        let mut sig = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &rng,
                signing_input.as_bytes(),
                &mut sig,
            )
            .map_err(|_| "signing the FCM assertion failed".to_owned())?;
        Ok(format!("{signing_input}.{}", b64(&sig)))
    }

    fn access_token(&mut self) -> Result<String, String> {
        if let Some((token, until)) = &self.token {
            if Instant::now() < *until {
                return Ok(token.clone());
            }
        }
        let assertion = self.assertion()?;
        let resp = self
            .agent
            .post(&self.account.token_uri)
            .send_form([
                ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                ("assertion", assertion.as_str()),
            ])
            .map_err(|e| format!("FCM token endpoint unreachable: {e}"))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(format!("FCM token endpoint answered HTTP {status}"));
        }
        #[derive(Deserialize)]
        struct Token {
            access_token: String,
            expires_in: u64,
        }
        let t: Token = resp
            .into_body()
            .read_json()
            .map_err(|e| format!("FCM token response unreadable: {e}"))?;
        let until = Instant::now() + Duration::from_secs(t.expires_in).saturating_sub(TOKEN_MARGIN);
        self.token = Some((t.access_token.clone(), until));
        Ok(t.access_token)
    }
}

impl Deliver for Fcm {
    fn deliver(&mut self, job: &PushJob, content: Content) -> Result<(), Failure> {
        let Target::Fcm { token } = &job.target else {
            return Err(Failure {
                reason: "not an FCM target".into(),
                permanent: true,
            });
        };
        let (title, body) = content.shape(job);
        let access = self.access_token().map_err(Failure::retry)?;
        let message = json!({
            "message": {
                "token": token,
                "notification": { "title": title, "body": body },
                "data": {
                    "chat_id": job.chat_id,
                    "thread_id": job.thread_id.clone().unwrap_or_default(),
                    "message_id": job.message_id,
                    "cursor": job.cursor.to_string(),
                },
            }
        });
        let url = format!(
            "{}/v1/projects/{}/messages:send",
            self.endpoint, self.account.project_id
        );
        let resp = self
            .agent
            .post(&url)
            .header("Authorization", &format!("Bearer {access}"))
            .send_json(&message)
            .map_err(|e| Failure::retry(format!("FCM unreachable: {e}")))?;
        let status = resp.status().as_u16();
        if status == 401 {
            // The cached token was revoked or expired early: fetch a new one next attempt.
            self.token = None;
        }
        if (200..300).contains(&status) {
            Ok(())
        } else if status == 401 {
            // A stale access token: worth another try with a fresh one.
            Err(Failure::retry("FCM answered HTTP 401".into()))
        } else {
            Err(Failure::from_status("FCM", status, ""))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../../tests/fixtures/fcm-service-account.json");

    #[test]
    fn a_key_is_judged_without_its_secret_ever_quoted() {
        let summary = check_key(FIXTURE).unwrap();
        assert_eq!(summary.project_id, "iris-test");
        assert_eq!(key_summary(FIXTURE), Some(summary));
        let secret = "-----BEGIN PRIVATE KEY-----\\nSECRET-BYTES\\n-----END PRIVATE KEY-----";
        for bad in [
            format!("\"{secret}\""),
            format!("{{\"type\": \"service_account\", \"private_key\": [\"{secret}\"]}}"),
            FIXTURE.replace("MII", "SECRET-BYTES"),
            format!("{{\"type\": \"{secret}\"}}"),
        ] {
            let e = check_key(&bad).unwrap_err().to_string();
            assert!(!e.contains("SECRET"), "{e}");
        }
    }
}
