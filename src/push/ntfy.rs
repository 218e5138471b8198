//! ntfy: one JSON publish per push to the server's root URL.
//!
//! ntfy passes only its own fields to subscribers, so the ids the app needs to open the right
//! chat ride in the `click` URL: `iris://chat?chat_id=…&thread_id=…&message_id=…&cursor=…`
//! (thread_id omitted in a flat lane). See docs/push.md for the exact shape.

use base64::Engine;
use serde_json::json;

use super::{read_secret, Content, Deliver, Failure, PushConfig, PushError, PushJob, Target};

pub struct Ntfy {
    agent: ureq::Agent,
    server: String,
    /// The full `Authorization` header value, if the server needs one. Never logged.
    authorization: Option<String>,
}

impl Ntfy {
    pub fn new(config: &PushConfig, agent: ureq::Agent) -> Result<Ntfy, PushError> {
        let token = match (&config.ntfy_token, &config.ntfy_token_file) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(path)) => Some(read_secret("the ntfy token file", path)?),
            (None, None) => None,
        };
        let authorization = match (token, &config.ntfy_user, &config.ntfy_password) {
            (Some(t), _, _) => Some(format!("Bearer {t}")),
            (None, Some(user), Some(pass)) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
            )),
            _ => None,
        };
        Ok(Ntfy {
            agent,
            server: config.ntfy_server.trim_end_matches('/').to_owned(),
            authorization,
        })
    }
}

/// The link a tap opens: everything the app needs to show the right message.
pub fn click_url(job: &PushJob) -> String {
    let mut url = format!("iris://chat?chat_id={}", job.chat_id);
    if let Some(t) = &job.thread_id {
        url.push_str(&format!("&thread_id={t}"));
    }
    url.push_str(&format!(
        "&message_id={}&cursor={}",
        job.message_id, job.cursor
    ));
    url
}

impl Deliver for Ntfy {
    fn deliver(&mut self, job: &PushJob, content: Content) -> Result<(), Failure> {
        let Target::Ntfy { topic } = &job.target else {
            return Err(Failure {
                reason: "not an ntfy target".into(),
                permanent: true,
            });
        };
        let (title, message) = content.shape(job);
        let body = json!({
            "topic": topic,
            "title": title,
            "message": message,
            "tags": ["speech_balloon"],
            "click": click_url(job),
        });
        let mut req = self.agent.post(format!("{}/", self.server));
        if let Some(auth) = &self.authorization {
            req = req.header("Authorization", auth);
        }
        let resp = req
            .send_json(&body)
            .map_err(|e| Failure::retry(format!("ntfy at {} unreachable: {e}", self.server)))?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(|v| format!(" (retry after {v} s)"))
            .unwrap_or_default();
        Err(Failure::from_status("ntfy", status, &retry_after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn click_url_carries_the_ids() {
        let job = PushJob {
            device_id: "d".into(),
            target: Target::Ntfy { topic: "t".into() },
            cursor: 42,
            chat_id: "chan_1".into(),
            thread_id: Some("thr_2".into()),
            message_id: "msg_3".into(),
            title: "x".into(),
            body: "y".into(),
            count: 1,
        };
        assert_eq!(
            click_url(&job),
            "iris://chat?chat_id=chan_1&thread_id=thr_2&message_id=msg_3&cursor=42"
        );
    }
}
