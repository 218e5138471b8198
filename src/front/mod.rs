//! The port's front door: every accepted TCP connection is admitted (`admit.rs`), decrypted if
//! its first byte is a TLS handshake, then served by hyper (HTTP/1.1), one request per connection.
//!
//! - A WebSocket upgrade (`GET` with `Upgrade: websocket`) gets `101` and becomes a device
//!   session (`crate::session`), which owns the socket from then on.
//! - `POST /hooks/<name>` is a webhook: checked here against the HTTP contract (token, sizes,
//!   rate), then posted into its automation channel by the hub (`webhook.rs`, hub/automation.rs).
//! - `/pair` is the pairing page (`crate::pairing::page`): a one-time code in, a QR code out.
//! - `/admin/…` is the owner's web app (`crate::admin`): set-up, sign-in, settings; a browser's
//!   `GET /` (asking for HTML) is redirected there.
//! - Anything else gets a short plain-text answer: `426` for a browser's `GET /`, else 404/405.
//!
//! TLS shares the port (`crate::tls`): a connection whose first byte is a TLS handshake record
//! is handed to rustls first, then served exactly like a plain one. With `[tls] allow_plain =
//! false`, every plain request is answered `426` (use `wss://`/`https://`) and nothing else.
//!
//! Bounds: the request head is at most [`http::MAX_HEAD_BYTES`]; the TLS handshake, the request (head
//! and, for a webhook, body) and then the WebSocket `hello` must all arrive within
//! `limits.hello_timeout_secs` of accept; a webhook body is at most `limits.max_webhook_bytes`.
//! Every answer except `101` closes the connection, so one connection carries one request.

mod admit;
mod http;
mod reply;
mod webhook;

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::debug;

pub use admit::{address_key, Admission, Admitted};

use crate::admin::Admin;
use crate::hub::Hub;
use crate::pairing::page::PairingPage;
use crate::session;
use crate::shutdown::Listener;
use crate::tls::{Tls, HANDSHAKE_RECORD};

use self::http::serve_http;

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
    let upgraded = tokio::select! {
        upgraded = front => upgraded,
        _ = stop.recv() => return debug!(%peer, "gateway stopping; closed before a session began"),
    };
    if let Some((upgraded, user_agent)) = upgraded {
        session::run(hub, upgraded, peer, user_agent, deadline, stop).await;
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
) -> Option<(Upgraded, Option<String>)> {
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
