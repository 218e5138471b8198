//! The HTTP front: every accepted TCP connection is served by hyper (HTTP/1.1).
//!
//! - A WebSocket upgrade (`GET` with `Upgrade: websocket`) gets `101` and becomes a device
//!   session (`super::session`): the hello gate, the read loop and the writer.
//! - `POST /hooks/<name>` is a webhook: checked here against the HTTP contract (token, sizes,
//!   rate), then posted into its automation channel by the hub (hub/automation.rs).
//! - `/pair` is the pairing page (`crate::pairing::page`): a one-time code in, a QR code out.
//! - `/admin/…` is the owner's web app (`crate::admin`): set-up, sign-in, settings; a browser's
//!   `GET /` (asking for HTML) is redirected there.
//! - Anything else gets a short plain-text answer: `426` for a browser's `GET /`, else 404/405.
//!
//! TLS shares the port (`crate::tls`): a connection whose first byte is a TLS handshake record
//! is handed to rustls first, then served exactly like a plain one. With `[tls] allow_plain =
//! false`, every plain request is answered `426` (use `wss://`/`https://`) and nothing else.
//!
//! Bounds: the request head is at most [`MAX_HEAD_BYTES`]; the TLS handshake, the request (head
//! and, for a webhook, body) and then the WebSocket `hello` must all arrive within
//! `limits.hello_timeout_secs` of accept; a webhook body is at most `limits.max_webhook_bytes`.
//! Every answer except `101` closes the connection, so one connection carries one request.

use std::cell::RefCell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, info};

use crate::admin::{self, Admin};
use crate::hub::{HookError, Hub};
use crate::pairing::page::{self, PairingPage};
use crate::shutdown::Listener;
use crate::tls::{Tls, HANDSHAKE_RECORD};

use super::Ws;

/// The upgraded socket a device session runs on.
pub type Io = TokioIo<hyper::upgrade::Upgraded>;

/// Largest request head (request line and headers) buffered; hyper answers 431 beyond it.
pub const MAX_HEAD_BYTES: usize = 16 << 10;

type Reply = Response<Full<Bytes>>;

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

/// How a connection reached the HTTP front.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Tls,
    Plain,
    /// Plain, while `[tls] allow_plain = false`: every request is answered 426.
    PlainRefused,
}

/// Serves one accepted TCP connection until it closes: one HTTP request, or a WebSocket
/// session after an upgrade. With `tls`, a connection that starts with a TLS handshake is
/// decrypted first. `stop` is this connection's share of the shutdown: until a device session
/// begins, the shutdown ends the connection at once (a half-sent request or a page left open
/// must not hold the final flush up); a session is closed by the hub (`status{restarting}`,
/// then 1012 after its queue drains) and keeps `stop` until it has.
pub async fn serve(
    hub: Rc<Hub>,
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<Rc<Tls>>,
    pairing: Rc<PairingPage>,
    admin: Rc<Admin>,
    mut stop: Listener,
) {
    let _ = tcp.set_nodelay(true);
    let hello_timeout = Duration::from_secs(hub.limits().hello_timeout_secs);
    let deadline = Instant::now() + hello_timeout;
    let front = front(hub.clone(), tcp, peer, deadline, tls, pairing, admin);
    let ws = tokio::select! {
        ws = front => ws,
        _ = stop.recv() => return debug!(%peer, "gateway stopping; closed before a session began"),
    };
    if let Some(ws) = ws {
        super::session(hub, ws, peer, deadline, stop).await;
    }
}

/// Everything before a device session: TLS (if the first byte asks for it), then HTTP. Gives
/// the upgraded WebSocket when the request was one; answers every other request itself.
async fn front(
    hub: Rc<Hub>,
    tcp: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    tls: Option<Rc<Tls>>,
    pairing: Rc<PairingPage>,
    admin: Rc<Admin>,
) -> Option<Ws> {
    let Some(tls) = tls else {
        return serve_http(
            hub,
            TokioIo::new(tcp),
            peer,
            deadline,
            Transport::Plain,
            pairing,
            admin,
        )
        .await;
    };
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, tcp.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        Ok(_) => return None,
        Err(_) => {
            debug!(%peer, "nothing sent within limits.hello_timeout_secs; closed");
            return None;
        }
    }
    if first[0] != HANDSHAKE_RECORD {
        let transport = if tls.allow_plain {
            Transport::Plain
        } else {
            Transport::PlainRefused
        };
        return serve_http(
            hub,
            TokioIo::new(tcp),
            peer,
            deadline,
            transport,
            pairing,
            admin,
        )
        .await;
    }
    match tokio::time::timeout_at(deadline, tls.acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => {
            serve_http(
                hub,
                TokioIo::new(stream),
                peer,
                deadline,
                Transport::Tls,
                pairing,
                admin,
            )
            .await
        }
        Ok(Err(e)) => {
            debug!(%peer, "TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            debug!(%peer, "TLS handshake not complete within limits.hello_timeout_secs; closed");
            None
        }
    }
}

async fn serve_http<I>(
    hub: Rc<Hub>,
    io: I,
    peer: SocketAddr,
    deadline: Instant,
    transport: Transport,
    pairing: Rc<PairingPage>,
    admin: Rc<Admin>,
) -> Option<Ws>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (hello_timeout, max_frame_bytes) = {
        let limits = hub.limits();
        (
            Duration::from_secs(limits.hello_timeout_secs),
            limits.max_frame_bytes,
        )
    };
    let upgrade: Rc<RefCell<Option<OnUpgrade>>> = Rc::default();
    // Set for an admin backup download or restore upload: it may take longer than the request
    // deadline (up to `admin::TRANSFER_TIMEOUT` more).
    let long: Rc<std::cell::Cell<bool>> = Rc::default();
    let service = {
        let (hub, upgrade, long) = (hub.clone(), upgrade.clone(), long.clone());
        service_fn(move |req| {
            let (hub, upgrade, pairing) = (hub.clone(), upgrade.clone(), pairing.clone());
            let (admin, long) = (admin.clone(), long.clone());
            async move {
                if transport == Transport::PlainRefused {
                    return Ok::<_, Infallible>(boxed(tls_required(peer)));
                }
                if is_admin(&req) {
                    let secure = transport == Transport::Tls;
                    if admin::is_transfer(&req) {
                        long.set(true);
                    }
                    return Ok(admin::serve(&admin, &hub, req, peer, secure).await);
                }
                if req.uri().path() == page::PATH && !req.headers().contains_key(header::UPGRADE) {
                    let secure = transport == Transport::Tls;
                    return Ok(boxed(page::serve(&pairing, &hub, req, peer, secure).await));
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
        let until = if long.get() {
            deadline + admin::TRANSFER_TIMEOUT
        } else {
            deadline
        };
        tokio::select! {
            r = &mut connection => break Some(r),
            _ = tokio::time::sleep_until(until) => {
                if !long.get() || Instant::now() >= deadline + admin::TRANSFER_TIMEOUT {
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
    let pending = upgrade.borrow_mut().take()?;
    let upgraded = match tokio::time::timeout_at(deadline, pending).await {
        Ok(Ok(upgraded)) => upgraded,
        Ok(Err(e)) => {
            debug!(%peer, "websocket upgrade failed: {e}");
            return None;
        }
        Err(_) => return None,
    };
    let ws = WebSocketStream::from_raw_socket(
        TokioIo::new(upgraded),
        Role::Server,
        Some(super::ws_config(
            max_frame_bytes,
            hub.limits().max_out_frame_bytes,
        )),
    )
    .await;
    Some(ws)
}

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
    upgrade: &RefCell<Option<OnUpgrade>>,
    peer: SocketAddr,
) -> Reply {
    let headers = req.headers();
    if headers.contains_key(header::UPGRADE) || headers.contains_key(header::SEC_WEBSOCKET_KEY) {
        return match websocket_accept(&req) {
            Ok(accept) => {
                *upgrade.borrow_mut() = Some(hyper::upgrade::on(&mut req));
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

/// A closing answer with a body of `content_type`.
fn answer(status: StatusCode, content_type: &'static str, body: Bytes) -> Reply {
    let mut reply = Response::new(Full::new(body));
    *reply.status_mut() = status;
    let h = reply.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    reply
}

fn text(status: StatusCode, body: &str) -> Reply {
    answer(
        status,
        "text/plain; charset=utf-8",
        Bytes::from(body.to_owned()),
    )
}

fn json(status: StatusCode, body: &serde_json::Value) -> Reply {
    answer(status, "application/json", Bytes::from(body.to_string()))
}

fn with_allow(mut reply: Reply, methods: &'static str) -> Reply {
    reply
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(methods));
    reply
}

/// `POST /hooks/<name>`: 404 unknown name, 401 bad token, 413 too large (announced or read),
/// 429 over the rate, 400 unusable body, 202 `{"message_id"}` once the message is durable.
async fn webhook(hub: &Rc<Hub>, name: &str, req: Request<Incoming>, peer: SocketAddr) -> Reply {
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
    let channel = hub.webhook_admit(name, authorization, announced, peer.ip())?;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = read_limited(req.into_body(), limit).await?;
    hub.post_webhook(name, &channel, content_type.as_deref(), &body)
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
