//! `POST /hooks/<name>` in HTTP terms: the token, the body's size and the status codes; what a
//! webhook posts, and to which channel, is the hub's (hub/automation.rs).

use std::net::SocketAddr;
use std::rc::Rc;

use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Request, StatusCode};
use tracing::info;

use crate::hub::{HookError, Hub};

use super::reply::{json, Reply};

/// The HTTP status a refused webhook gets: one per kind of refusal.
fn hook_status(e: &HookError) -> StatusCode {
    match e {
        HookError::NotFound => StatusCode::NOT_FOUND,
        HookError::Unauthorized => StatusCode::UNAUTHORIZED,
        HookError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        HookError::RateLimited { .. } | HookError::Guessing { .. } => StatusCode::TOO_MANY_REQUESTS,
        HookError::BadRequest(_) => StatusCode::BAD_REQUEST,
        HookError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// `POST /hooks/<name>`: 404 unknown name, 401 bad token, 413 too large (announced or read),
/// 429 over the rate, 400 unusable body, 202 `{"message_id"}` once the message is durable.
pub async fn webhook(hub: &Rc<Hub>, name: &str, req: Request<Incoming>, peer: SocketAddr) -> Reply {
    let result = post_hook(hub, name, req, peer).await;
    let shown: String = name.chars().take(64).collect();
    match result {
        Ok(message_id) => {
            info!(hook = %shown, %peer, message_id = %message_id, "webhook posted");
            json(
                StatusCode::ACCEPTED,
                &serde_json::json!({ "message_id": message_id }),
            )
        }
        Err(e) => {
            let status = hook_status(&e);
            info!(hook = %shown, %peer, status = status.as_u16(), "webhook refused: {}", e.message());
            let mut reply = json(status, &serde_json::json!({ "error": e.message() }));
            let h = reply.headers_mut();
            match e {
                HookError::Unauthorized => {
                    h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                }
                HookError::RateLimited { retry_after_secs }
                | HookError::Guessing {
                    retry_after_secs, ..
                } => {
                    h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
                }
                _ => {}
            }
            reply
        }
    }
}

async fn post_hook(
    hub: &Rc<Hub>,
    name: &str,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<String, HookError> {
    let limit = hub.limits().max_webhook_bytes;
    // Content-Length when the request has one; a chunked body is counted while it is read.
    let announced = req.body().size_hint().lower();
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let channel = hub
        .automation()
        .webhook_admit(name, authorization, announced, peer.ip())?;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = read_limited(req.into_body(), limit).await?;
    hub.automation()
        .post_webhook(name, &channel, content_type.as_deref(), &body)
        .await
}

/// Reads a body, refusing it as soon as it passes `limit` bytes (nothing more is buffered).
async fn read_limited(mut body: Incoming, limit: usize) -> Result<Vec<u8>, HookError> {
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| HookError::BadRequest(format!("could not read the body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(HookError::TooLarge(format!(
                    "the body is over {limit} bytes (limits.max_webhook_bytes)"
                )));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}
