//! One device's WebSocket, from the upgraded socket the front hands over to its close: the hello
//! gate, the reader with its rate limits, the writer draining the device's outlet, `sync` replay,
//! media pulls and uploads. Knows nothing about channels or agents, nor about HTTP: it hands
//! decoded requests to the hub, and the front (`crate::front`) decides which sockets get here.
//!
//! Each session gets two local tasks: the reader (which awaits the hub's handling of each
//! request in order, bounded local work: a request that waits on the agent is handed to a task
//! beside it, `Hub::beside`) and the writer (which drains the `Outlet`'s queue). The hub only ever pushes
//! to an outlet, so a slow phone can never stall the hub or another phone.

mod hello;
mod media_pull;
mod rate;
mod reader;
mod replay;
mod send;
mod upload;
mod violation;
mod writer;

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_util::StreamExt;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, info};

use crate::config::Limits;
use crate::hub::Hub;
use crate::outlet::CloseReason;
use crate::shutdown::Listener;

/// tungstenite's own buffers; its 128 KiB defaults would cost ~13 MB for 100 idle phones.
const SOCKET_BUFFER_BYTES: usize = 4096;
/// How long a closing connection may take to flush what it still has queued.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The WebSocket a device session runs on: a socket the HTTP front upgraded.
type Ws = WebSocketStream<TokioIo<Upgraded>>;
type WsStream = futures_util::stream::SplitStream<Ws>;
type WsSink = futures_util::stream::SplitSink<Ws, Message>;

/// `max_frame_bytes` bounds what is read; the write buffer must hold the largest frame written
/// (`max_out_frame_bytes`, which the writer enforces) plus a close frame.
fn ws_config(max_frame_bytes: usize, max_out_frame_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(SOCKET_BUFFER_BYTES)
        .write_buffer_size(0)
        .max_write_buffer_size(SOCKET_BUFFER_BYTES + max_out_frame_bytes + 1024)
        .max_message_size(Some(max_frame_bytes))
        .max_frame_size(Some(max_frame_bytes))
}

/// The device's WebSocket on a socket the front upgraded (after its `101`).
async fn websocket(upgraded: Upgraded, limits: &Limits) -> Ws {
    WebSocketStream::from_raw_socket(
        TokioIo::new(upgraded),
        Role::Server,
        Some(ws_config(
            limits.max_frame_bytes,
            limits.max_out_frame_bytes,
        )),
    )
    .await
}

/// The most kept of an upgrade's `User-Agent` (the Devices page's "app / platform"): an app's
/// is a few dozen bytes, a browser's about 120.
pub const MAX_USER_AGENT_BYTES: usize = 200;

/// The upgrade request's `User-Agent`, cut to [`MAX_USER_AGENT_BYTES`] on a character boundary,
/// control characters left out; `None` when absent or blank. The schema's `hello` names no app
/// or platform: this header is where a device says which it is.
pub fn user_agent(headers: &hyper::HeaderMap) -> Option<String> {
    let raw = headers.get(hyper::header::USER_AGENT)?.as_bytes();
    let text = String::from_utf8_lossy(&raw[..raw.len().min(MAX_USER_AGENT_BYTES + 4)]);
    let mut kept = String::new();
    for c in text.chars().filter(|c| !c.is_control()) {
        if kept.len() + c.len_utf8() > MAX_USER_AGENT_BYTES {
            break;
        }
        kept.push(c);
    }
    let kept = kept.trim();
    (!kept.is_empty()).then(|| kept.to_owned())
}

/// Runs one device session on a socket the front upgraded, until it closes. `deadline` is when the
/// connection's hello time (`limits.hello_timeout_secs`, counted from accept) runs out.
/// `stop` is held until the session ends, so the server's shutdown waits for it; before the
/// hello, the shutdown ends the session at once (no device to tell yet).
pub async fn run(
    hub: Rc<Hub>,
    upgraded: Upgraded,
    peer: SocketAddr,
    user_agent: Option<String>,
    deadline: tokio::time::Instant,
    mut stop: Listener,
) {
    let mut ws = websocket(upgraded, hub.limits()).await;
    let gate = tokio::select! {
        gate = hello::gate(&hub, &mut ws, peer, user_agent.as_deref(), deadline) => gate,
        _ = stop.recv() => None,
    };
    let Some(outlet) = gate else {
        return;
    };
    info!(%peer, device = %outlet.device_id, conn = outlet.conn_id, "device connected");
    let (sink, stream) = ws.split();
    let writer = tokio::task::spawn_local(writer::write_loop(hub.clone(), outlet.clone(), sink));
    reader::read_loop(&hub, &outlet, stream).await;
    hub.devices().detach(outlet.conn_id);
    outlet.close(CloseReason::Bye);
    let mut writer = writer;
    if tokio::time::timeout(DRAIN_TIMEOUT * 2, &mut writer)
        .await
        .is_err()
    {
        debug!(conn = outlet.conn_id, "writer did not finish in time");
        writer.abort();
    }
    info!(%peer, device = %outlet.device_id, conn = outlet.conn_id, coalesced = outlet.coalesced(), "device disconnected");
}

#[cfg(test)]
mod tests {
    use super::{user_agent, MAX_USER_AGENT_BYTES};
    use hyper::header::{HeaderMap, HeaderValue, USER_AGENT};

    fn of(value: &[u8]) -> Option<String> {
        let mut headers = HeaderMap::new();
        headers.insert(USER_AGENT, HeaderValue::from_bytes(value).unwrap());
        user_agent(&headers)
    }

    #[test]
    fn a_user_agent_is_kept_cut_on_a_character_and_without_controls() {
        assert_eq!(
            of(b"Iris/1.4 (Android 14)").as_deref(),
            Some("Iris/1.4 (Android 14)")
        );
        assert_eq!(user_agent(&HeaderMap::new()), None);
        assert_eq!(of(b"   "), None);
        assert_eq!(of(b"a\tb").as_deref(), Some("ab"));
        // 199 bytes, then a two-byte character that would end past the bound.
        let long = format!("{}é and more", "x".repeat(MAX_USER_AGENT_BYTES - 1));
        let kept = of(long.as_bytes()).unwrap();
        assert_eq!(kept, "x".repeat(MAX_USER_AGENT_BYTES - 1));
        let kept = of("y".repeat(5000).as_bytes()).unwrap();
        assert_eq!(kept.len(), MAX_USER_AGENT_BYTES);
    }
}
