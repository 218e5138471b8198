//! The HTTP front proper: hyper on one connection, and where each request goes: the admin page,
//! the pairing page, a webhook, a WebSocket upgrade, or a short plain-text answer.

use std::cell::RefCell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::TokioTimer;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tracing::debug;

use crate::admin::{self, Admin};
use crate::hub::Hub;
use crate::pairing::page::{self, PairingPage};

use super::reply::{text, with_allow, Reply};
use super::webhook::webhook;
use super::Transport;

/// Largest request head (request line and headers) buffered; hyper answers 431 beyond it.
pub const MAX_HEAD_BYTES: usize = 16 << 10;

/// One HTTP request on a plain or decrypted connection, answered here unless it is a WebSocket
/// upgrade, which gives the upgraded socket.
pub async fn serve_http<I>(
    hub: Rc<Hub>,
    io: I,
    peer: SocketAddr,
    deadline: Instant,
    transport: Transport,
    pairing: Rc<PairingPage>,
    admin: Rc<Admin>,
) -> Option<(Upgraded, Option<String>)>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let hello_timeout = Duration::from_secs(hub.limits().hello_timeout_secs);
    let upgrade: Rc<RefCell<Option<PendingSocket>>> = Rc::default();
    // The deadline bounds the exchange: reading the request and answering it. Work a request
    // starts that may take longer (a restore, a backup, an update check or download) is a job
    // the admin page owns (`admin/jobs.rs`), answered at once, so no deadline here cuts it.
    // Set by the admin page once its request is read (`admin::RequestRead`): the answer's own
    // work (a sign-in's hash) and a transfer's bytes (a backup download, a restore or update
    // upload) may then take up to `admin::TRANSFER_TIMEOUT` more.
    let long = admin::RequestRead::default();
    let service = {
        let (hub, upgrade, long) = (hub.clone(), upgrade.clone(), long.clone());
        service_fn(move |mut req: Request<Incoming>| {
            let (hub, upgrade, pairing) = (hub.clone(), upgrade.clone(), pairing.clone());
            let (admin, long) = (admin.clone(), long.clone());
            async move {
                if transport == Transport::PlainRefused {
                    return Ok::<_, Infallible>(boxed(tls_required(peer)));
                }
                let channel = match transport {
                    Transport::Tls => crate::web::Channel::Encrypted,
                    _ => crate::web::Channel::Plain,
                };
                if is_admin(&req) {
                    long.begin();
                    req.extensions_mut().insert(long);
                    return Ok(admin::serve(&admin, &hub, req, peer, channel).await);
                }
                if req.uri().path() == page::PATH && !req.headers().contains_key(header::UPGRADE) {
                    let visit = page::Visit::new(peer, channel);
                    return Ok(boxed(page::serve(&pairing, &hub, req, visit).await));
                }
                Ok::<_, Infallible>(boxed(route(&hub, req, &upgrade, peer).await))
            }
        })
    };
    let connection = http1::Builder::new()
        .max_buf_size(MAX_HEAD_BYTES)
        .timer(TokioTimer::new())
        .header_read_timeout(hello_timeout)
        .serve_connection(io, service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let finished = loop {
        let until = if long.is_read() {
            deadline + admin::TRANSFER_TIMEOUT
        } else {
            deadline
        };
        tokio::select! {
            r = &mut connection => break Some(r),
            _ = tokio::time::sleep_until(until) => {
                if !long.is_read() || Instant::now() >= deadline + admin::TRANSFER_TIMEOUT {
                    break None;
                }
            }
        }
    };
    match finished {
        Some(Ok(())) => {}
        Some(Err(e)) => {
            debug!(%peer, "http connection ended: {e}");
            return None;
        }
        None => {
            debug!(%peer, "request not complete within limits.hello_timeout_secs; closed");
            return None;
        }
    }
    let (pending, user_agent) = upgrade.borrow_mut().take()?;
    let upgraded = match tokio::time::timeout_at(deadline, pending).await {
        Ok(Ok(upgraded)) => upgraded,
        Ok(Err(e)) => {
            debug!(%peer, "websocket upgrade failed: {e}");
            return None;
        }
        Err(_) => return None,
    };
    Some((upgraded, user_agent))
}

/// An accepted upgrade and the `User-Agent` it came with (cut: `session::user_agent`).
type PendingSocket = (OnUpgrade, Option<String>);

/// A whole answer as the body type every answer shares (the admin page also streams).
fn boxed(reply: Reply) -> Response<admin::Body> {
    reply.map(|b| b.map_err(|never| match never {}).boxed_unsync())
}

/// The admin web app's requests: its paths, and a browser's `GET /` (an `Accept` naming HTML,
/// no upgrade), which it redirects to `/admin/`. The app's WebSocket upgrade on `/` and
/// anything else asking for `/` keep their answers.
fn is_admin(req: &Request<Incoming>) -> bool {
    let path = req.uri().path();
    if path == "/admin" || path.starts_with(admin::PREFIX) {
        return true;
    }
    path == "/"
        && matches!(*req.method(), Method::GET | Method::HEAD)
        && !req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/html"))
}

/// The answer to any plain request while `[tls] allow_plain = false`.
fn tls_required(peer: SocketAddr) -> Reply {
    debug!(%peer, "plain connection refused: tls.allow_plain is false");
    let mut reply = text(
        StatusCode::UPGRADE_REQUIRED,
        "This Iris gateway accepts only TLS: connect with wss:// (webhooks: https://) and pin \
         the certificate fingerprint `iris-gateway pair` prints ([tls] allow_plain = false).\n",
    );
    reply.headers_mut().insert(
        header::UPGRADE,
        HeaderValue::from_static("TLS/1.3, TLS/1.2"),
    );
    reply
}

async fn route(
    hub: &Rc<Hub>,
    mut req: Request<Incoming>,
    upgrade: &RefCell<Option<PendingSocket>>,
    peer: SocketAddr,
) -> Reply {
    let headers = req.headers();
    let is_upgrade =
        headers.contains_key(header::UPGRADE) || headers.contains_key(header::SEC_WEBSOCKET_KEY);
    if hub.updates().on_trial() && (is_upgrade || req.uri().path().starts_with("/hooks/")) {
        // Nothing may be acknowledged by a version that may yet be rolled back: devices and
        // webhooks come back when the update is committed (or the old version is back).
        let mut reply = text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is checking an update; try again in a few seconds\n",
        );
        reply
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return reply;
    }
    if is_upgrade {
        return match websocket_accept(&req) {
            Ok(accept) => {
                let user_agent = crate::session::user_agent(req.headers());
                *upgrade.borrow_mut() = Some((hyper::upgrade::on(&mut req), user_agent));
                switching_protocols(&accept)
            }
            Err(why) => {
                debug!(%peer, "bad websocket upgrade: {why}");
                let mut reply = text(StatusCode::BAD_REQUEST, &format!("{why}\n"));
                if why.contains("Sec-WebSocket-Version") {
                    reply.headers_mut().insert(
                        header::SEC_WEBSOCKET_VERSION,
                        HeaderValue::from_static("13"),
                    );
                }
                reply
            }
        };
    }
    let path = req.uri().path().to_owned();
    if let Some(name) = path.strip_prefix("/hooks/") {
        if req.method() != Method::POST {
            return with_allow(
                text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "a webhook takes POST (see docs/automation.md)\n",
                ),
                "POST",
            );
        }
        return webhook(hub, name, req, peer).await;
    }
    match (req.method(), path.as_str()) {
        (&Method::GET | &Method::HEAD, "/") => {
            let mut reply = text(
                StatusCode::UPGRADE_REQUIRED,
                "This is the Iris gateway's WebSocket port: open it with the Iris app (or \
                 `iris-gateway chat`), not a web browser.\n",
            );
            reply
                .headers_mut()
                .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            reply
        }
        (_, "/") => with_allow(
            text(
                StatusCode::METHOD_NOT_ALLOWED,
                "this port takes WebSocket upgrades (GET) and webhooks (POST /hooks/<name>)\n",
            ),
            "GET",
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: this port serves the Iris app's WebSocket, webhooks (POST /hooks/<name>) \
             and the pairing page (/pair)\n",
        ),
    }
}

/// Checks a WebSocket upgrade request (RFC 6455 §4.2.1) and returns its `Sec-WebSocket-Accept`.
fn websocket_accept(req: &Request<Incoming>) -> Result<String, String> {
    let headers = req.headers();
    if req.method() != Method::GET {
        return Err("a WebSocket upgrade must be a GET request".into());
    }
    if req.version() != Version::HTTP_11 {
        return Err("a WebSocket upgrade needs HTTP/1.1".into());
    }
    if !has_token(headers, header::CONNECTION, "upgrade") {
        return Err("a WebSocket upgrade needs `Connection: Upgrade`".into());
    }
    if !has_token(headers, header::UPGRADE, "websocket") {
        return Err("only `Upgrade: websocket` is served here".into());
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return Err("a WebSocket upgrade needs `Sec-WebSocket-Version: 13`".into());
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or("a WebSocket upgrade needs a `Sec-WebSocket-Key`")?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(key.as_bytes());
    if key.len() != 24 || decoded.ok().map(|k| k.len()) != Some(16) {
        return Err("`Sec-WebSocket-Key` must be 16 bytes in base64".into());
    }
    Ok(derive_accept_key(key.as_bytes()))
}

/// Whether a comma-separated header (any of its occurrences) lists `token`, ignoring case.
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

fn switching_protocols(accept: &str) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::new()));
    *reply.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = reply.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    reply
}
