//! One WebSocket connection: the hello gate, reading with limits, writing from a bounded queue.
//! Knows nothing about channels or agents; it hands decoded frames to the hub. The HTTP front
//! (`http.rs`) accepts the socket and performs the upgrade; everything after it is here.
//!
//! Each socket gets two local tasks: this one reads (and awaits the hub's handling of each
//! request in order), a writer drains the `Outlet`'s queue. The hub only ever pushes to an
//! outlet, so a slow phone can never stall the hub or another phone.

mod admit;
pub mod http;
mod upload;
mod violation;

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tracing::{debug, info, warn};

pub use admit::{address_key, Admission, Admitted};
pub use http::serve;

use crate::config::Limits;
use crate::hub::Hub;
use crate::outlet::{encode_text, CloseReason, FrameText, Outbound, Outlet};
use crate::protocol::{decode_request, ErrorCode, Frame, Request};
use crate::shutdown::Listener;

/// tungstenite's own buffers; its 128 KiB defaults would cost ~13 MB for 100 idle phones.
const SOCKET_BUFFER_BYTES: usize = 4096;
/// How long a closing connection may take to flush what it still has queued.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The close code a reason is told with (RFC 6455 §7.4): the outlet says why, the socket says
/// it in WebSocket terms.
fn close_code(reason: CloseReason) -> CloseCode {
    match reason {
        CloseReason::Bye => CloseCode::Normal,
        CloseReason::Revoked | CloseReason::RateLimited => CloseCode::Policy,
        CloseReason::Restarting => CloseCode::Restart,
        CloseReason::SlowConsumer => CloseCode::Again,
        CloseReason::FrameTooLarge => CloseCode::Size,
        CloseReason::SendFailed => CloseCode::Error,
        CloseReason::InvalidUtf8 => CloseCode::Invalid,
        CloseReason::ProtocolViolation => CloseCode::Protocol,
    }
}

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

/// The WebSocket a device session runs on: a socket the HTTP front upgraded.
type Ws = WebSocketStream<http::Io>;

/// Runs one device session on an upgraded socket until it closes. `deadline` is when the
/// connection's hello time (`limits.hello_timeout_secs`, counted from accept) runs out.
/// `stop` is held until the session ends, so the server's shutdown waits for it; before the
/// hello, the shutdown ends the session at once (no device to tell yet).
async fn session(
    hub: Rc<Hub>,
    mut ws: Ws,
    peer: SocketAddr,
    deadline: tokio::time::Instant,
    mut stop: Listener,
) {
    let gate = tokio::select! {
        gate = hello_gate(&hub, &mut ws, peer, deadline) => gate,
        _ = stop.recv() => None,
    };
    let Some(outlet) = gate else {
        return;
    };
    info!(%peer, device = %outlet.device_id, conn = outlet.conn_id, "device connected");
    let (sink, stream) = ws.split();
    let writer = tokio::task::spawn_local(write_loop(hub.clone(), outlet.clone(), sink));
    read_loop(&hub, &outlet, stream).await;
    hub.detach(outlet.conn_id);
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

/// Nothing but an `error` reaches a socket before a good hello.
async fn hello_gate(
    hub: &Rc<Hub>,
    ws: &mut Ws,
    peer: SocketAddr,
    deadline: tokio::time::Instant,
) -> Option<Rc<Outlet>> {
    let refuse = |id, code, msg: String| Frame::error(id, code, msg).encode();
    let first = match tokio::time::timeout_at(deadline, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => t,
        Ok(Some(Ok(Message::Binary(_)))) => {
            let e = refuse(None, ErrorCode::Auth, "send a hello frame first".into());
            close_with(ws, e, CloseCode::Policy, "hello required").await;
            return None;
        }
        Ok(Some(Err(WsError::Capacity(_)))) => {
            let e = refuse(None, ErrorCode::Unsupported, "frame too large".into());
            close_with(ws, e, CloseCode::Size, "frame too large").await;
            return None;
        }
        Ok(Some(Err(e))) => {
            if let Some((reason, message)) = violation::violation(&e) {
                let code = close_code(reason);
                info!(%peer, "closing before hello with {}: {e}", u16::from(code));
                let e = refuse(None, ErrorCode::Unsupported, message);
                close_with(ws, e, code, reason.text()).await;
            }
            return None;
        }
        Ok(_) => return None,
        Err(_) => {
            let e = refuse(
                None,
                ErrorCode::Auth,
                "no hello within the time limit".into(),
            );
            close_with(ws, e, CloseCode::Policy, "hello timeout").await;
            return None;
        }
    };
    let frame = match decode_request(first.as_str()) {
        Ok(f) => f,
        Err(e) => {
            // Whatever the first frame got wrong, what the device lacks is a valid hello.
            let bytes = refuse(
                e.id,
                ErrorCode::Auth,
                format!("send a valid hello first: {}", e.message),
            );
            close_with(ws, bytes, CloseCode::Policy, "bad hello").await;
            return None;
        }
    };
    let Request::Hello(hello) = &frame.request else {
        let e = refuse(frame.id, ErrorCode::Auth, "send a hello frame first".into());
        close_with(ws, e, CloseCode::Policy, "hello required").await;
        return None;
    };
    match hub.authenticate(hello, peer.ip()) {
        Ok(device) => {
            let outlet = Rc::new(Outlet::new(hub.next_conn_id(), device.device_id.clone()));
            outlet.set_append_updates(hello.wants(crate::protocol::EXT_UPDATE_APPEND));
            outlet.set_busy_frames(hello.wants(crate::protocol::EXT_AGENT_BUSY));
            outlet.set_read_markers(hello.wants(crate::protocol::EXT_READ_RECEIPT));
            hub.attach(&outlet, frame.id);
            Some(outlet)
        }
        Err(refused) => {
            info!(%peer, "hello refused: {}", refused.message);
            let e = refuse(frame.id, refused.code, refused.message);
            close_with(ws, e, CloseCode::Policy, "hello refused").await;
            None
        }
    }
}

/// Before a hello: the refusal, then the close frame, within the drain timeout.
async fn close_with(ws: &mut Ws, frame: Bytes, code: CloseCode, reason: &'static str) {
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        ws.send(Message::Text(encode_text(frame))).await?;
        ws.close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }))
        .await
    })
    .await;
}

type WsStream = futures_util::stream::SplitStream<Ws>;
type WsSink = futures_util::stream::SplitSink<Ws, Message>;

/// A per-connection token bucket: `frames_per_second` / `frame_burst`, and
/// `bytes_per_second` / `byte_burst`. Starts full.
struct RateLimit {
    tokens: f64,
    last: tokio::time::Instant,
    rate: f64,
    burst: f64,
}

impl RateLimit {
    fn new(rate: f64, burst: f64) -> RateLimit {
        RateLimit {
            tokens: burst,
            last: tokio::time::Instant::now(),
            rate,
            burst,
        }
    }

    /// Adds what the rate earned since the last look, up to the burst.
    fn refill(&mut self) {
        let now = tokio::time::Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
    }

    /// Takes `n` tokens if there are that many.
    fn take(&mut self, n: f64) -> bool {
        self.refill();
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    /// One frame's token.
    fn allow(&mut self) -> bool {
        self.take(1.0)
    }

    /// How long until the bucket holds `n` tokens (capped at the burst).
    fn wait_for(&mut self, n: f64) -> Duration {
        self.refill();
        let missing = n.min(self.burst) - self.tokens;
        if missing <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(missing / self.rate)
        }
    }

    /// Takes `n` tokens whatever the balance (it may go below zero: later frames wait).
    fn spend(&mut self, n: f64) {
        self.refill();
        self.tokens -= n;
    }
}

/// Payload bytes of a data frame, for the byte rate (control frames are not counted).
fn data_bytes(msg: &Message) -> usize {
    match msg {
        Message::Text(t) => t.len(),
        Message::Binary(b) => b.len(),
        _ => 0,
    }
}

/// Reads the device's frames in order and hands each to the hub (or to the upload in
/// progress), within the connection's frame and byte rates, until the socket ends or the
/// connection is told to close.
async fn read_loop(hub: &Rc<Hub>, outlet: &Rc<Outlet>, mut stream: WsStream) {
    let mut reader = Reader::new(hub.limits().clone());
    while let Some(msg) = reader.next_message(outlet, &mut stream).await {
        match reader.admit(outlet, &msg).await {
            Admit::Take => {}
            Admit::Skip => continue,
            Admit::End => return,
        }
        if !reader.dispatch(hub, outlet, msg).await {
            return;
        }
    }
}

/// What the read loop keeps between frames: the connection's rate buckets and its upload.
struct Reader {
    limits: Limits,
    rate: RateLimit,
    bytes: RateLimit,
    /// Bytes sent after being refused, allowed at the same rate; a connection that goes past
    /// that keeps flooding whatever it is told, and is closed.
    refused: RateLimit,
    uploading: Option<upload::Uploading>,
}

/// What the rate limits say about one frame.
enum Admit {
    Take,
    /// Refused with an `error`; the connection goes on.
    Skip,
    /// The connection is closing.
    End,
}

impl Reader {
    fn new(limits: Limits) -> Reader {
        let (byte_rate, byte_burst) = (limits.bytes_per_second as f64, limits.byte_burst as f64);
        Reader {
            rate: RateLimit::new(limits.frames_per_second as f64, limits.frame_burst as f64),
            bytes: RateLimit::new(byte_rate, byte_burst),
            refused: RateLimit::new(byte_rate, byte_burst),
            uploading: None,
            limits,
        }
    }

    /// The next frame, or `None` when the connection ends: the socket closed or failed (a
    /// frame too large or a protocol violation is told first), or closing was requested. An
    /// upload that goes quiet past its deadline is abandoned meanwhile.
    async fn next_message(&mut self, outlet: &Outlet, stream: &mut WsStream) -> Option<Message> {
        loop {
            let upload_deadline = self.uploading.as_ref().map(|u| u.deadline);
            let idle = async move {
                match upload_deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                m = stream.next() => m,
                _ = outlet.wait_closing() => return None,
                _ = idle => {
                    upload::abandon(outlet, &mut self.uploading);
                    continue;
                }
            };
            return match next {
                Some(Ok(m)) => Some(m),
                Some(Err(WsError::Capacity(CapacityError::MessageTooLong { size, max_size }))) => {
                    outlet.push_frame(&Frame::error(
                        None,
                        ErrorCode::Unsupported,
                        format!("frame of {size} bytes is over the {max_size}-byte limit (limits.max_frame_bytes); closing"),
                    ));
                    outlet.close(CloseReason::FrameTooLarge);
                    None
                }
                Some(Err(e)) => {
                    if let Some((reason, message)) = violation::violation(&e) {
                        info!(conn = outlet.conn_id, device = %outlet.device_id, "closing with {}: {e}", u16::from(close_code(reason)));
                        outlet.push_frame(&Frame::error(None, ErrorCode::Unsupported, message));
                        outlet.close(reason);
                    } else {
                        debug!(conn = outlet.conn_id, "read error: {e}");
                    }
                    None
                }
                None => None,
            };
        }
    }

    /// Applies the frame and byte rates to a frame. An upload's chunks are bounded by its
    /// announced size, not by the frame rate; and a chunk is never refused for the byte rate
    /// (that would ruin the upload): it is taken later instead, so TCP slows the phone down,
    /// keeping `max_frame_bytes` of the budget free for requests sent meanwhile. Other frames
    /// over the budget are refused.
    async fn admit(&mut self, outlet: &Outlet, msg: &Message) -> Admit {
        let limits = &self.limits;
        let is_chunk = self.uploading.is_some() && matches!(msg, Message::Binary(_));
        let is_data = matches!(msg, Message::Text(_) | Message::Binary(_));
        let id = || match msg {
            Message::Text(t) => request_id_of(t.as_str()),
            _ => None,
        };
        if is_data && !is_chunk && !self.rate.allow() {
            outlet.push_frame(&Frame::error(
                id(),
                ErrorCode::RateLimited,
                format!(
                    "more than {} frames per second (burst {}); this frame was not processed, retry it later",
                    limits.frames_per_second, limits.frame_burst
                ),
            ));
            return Admit::Skip;
        }
        let size = data_bytes(msg) as f64;
        if is_chunk {
            let wait = self.bytes.wait_for(size + limits.max_frame_bytes as f64);
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = outlet.wait_closing() => return Admit::End,
                }
            }
            self.bytes.spend(size);
        } else if is_data && !self.bytes.take(size) {
            if !self.refused.take(size) {
                outlet.push_frame(&Frame::error(
                    id(),
                    ErrorCode::RateLimited,
                    format!(
                        "still sending more than {} bytes per second (burst {}) after being refused; closing",
                        limits.bytes_per_second, limits.byte_burst
                    ),
                ));
                outlet.close(CloseReason::RateLimited);
                return Admit::End;
            }
            outlet.push_frame(&Frame::error(
                id(),
                ErrorCode::RateLimited,
                format!(
                    "more than {} bytes per second (burst {}, limits.bytes_per_second); this frame was not processed, retry it later",
                    limits.bytes_per_second, limits.byte_burst
                ),
            ));
            return Admit::Skip;
        }
        Admit::Take
    }

    /// Hands an admitted frame on: uploads are handled here, every other request by the hub.
    /// `false` when the device closed the socket.
    async fn dispatch(&mut self, hub: &Rc<Hub>, outlet: &Rc<Outlet>, msg: Message) -> bool {
        let uploading = &mut self.uploading;
        match msg {
            Message::Text(text) => match decode_request(text.as_str()) {
                Ok(frame) => match frame.request {
                    Request::MediaUploadStart(start) => {
                        upload::start(hub, outlet, uploading, frame.id, start).await
                    }
                    Request::MediaUploadEnd { media_ref, sha256 } => {
                        upload::end(hub, outlet, uploading, frame.id, media_ref, sha256).await
                    }
                    _ => hub.handle(outlet, frame).await,
                },
                Err(e) => outlet.push_frame(&Frame::error(e.id, e.code, e.message)),
            },
            Message::Binary(bytes) => upload::chunk(outlet, uploading, &bytes).await,
            Message::Close(_) => return false,
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
        }
        true
    }
}

/// Best effort id for an error about a frame that was not decoded (rate limiting).
fn request_id_of(text: &str) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: Option<i64>,
    }
    serde_json_core::from_str::<IdOnly>(text)
        .ok()
        .and_then(|(v, _)| v.id)
}

/// Drains the outlet onto the socket in order until it closes, then sends the close frame.
async fn write_loop(hub: Rc<Hub>, outlet: Rc<Outlet>, mut sink: WsSink) {
    let max_out = hub.limits().max_out_frame_bytes;
    loop {
        if outlet.must_abort() {
            break;
        }
        let item = outlet.pop();
        match item {
            Some(Outbound::Frame { text, .. }) => {
                if send_text(&outlet, &mut sink, text, max_out).await.is_err() {
                    break;
                }
            }
            Some(Outbound::Update { key, streamed }) => {
                let Some(text) = outlet.render_update(key, &streamed) else {
                    continue;
                };
                if send_text(&outlet, &mut sink, text, max_out).await.is_err() {
                    break;
                }
            }
            Some(Outbound::Replay { cursor, id }) => {
                if replay(&hub, &outlet, &mut sink, cursor, id, max_out)
                    .await
                    .is_err()
                {
                    break;
                }
            }
            Some(Outbound::Pull { path, id }) => {
                if pull(&outlet, &mut sink, &path, id).await.is_err() {
                    break;
                }
            }
            None => {
                if outlet.is_closing() {
                    break;
                }
                outlet.woken().await;
            }
        }
    }
    // An aborted send leaves its frame in tungstenite's buffer; the close frame queues behind
    // it, so a device that resumes reading within the timeout still learns why (1013) instead
    // of seeing a bare reset. A socket that failed outright has no closing reason set.
    if let Some(reason) = outlet.closing() {
        let _ = tokio::time::timeout(
            DRAIN_TIMEOUT,
            sink.send(Message::Close(Some(CloseFrame {
                code: close_code(reason),
                reason: reason.text().into(),
            }))),
        )
        .await;
    }
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, sink.close()).await;
}

/// The `type` of an encoded frame, for log lines about it. The gateway's envelope puts `type`
/// within the first few fields, so a 1 MB frame is not parsed to name it.
fn frame_kind(text: &str) -> String {
    let mut end = text.len().min(256);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end]
        .split_once(r#""type":""#)
        .and_then(|(_, rest)| rest.split('"').next())
        .unwrap_or("?")
        .to_owned()
}

/// Sends one text frame within `limits.max_out_frame_bytes`. Producers build their frames to
/// fit; a frame that still does not (stored by an older version, or a path that forgot its
/// budget) is cut to fit here rather than sent too big, which would make the app drop the
/// socket, and for a stored frame do so at every `sync` for ever.
async fn send_text(
    outlet: &Outlet,
    sink: &mut WsSink,
    text: FrameText,
    max_out: usize,
) -> Result<(), ()> {
    if text.len() <= max_out {
        return send_or_abort(outlet, sink, Message::Text(text)).await;
    }
    let kind = frame_kind(text.as_str());
    match crate::protocol::fit::shrink_encoded(text.as_bytes(), max_out) {
        Some(cut) => {
            warn!(conn = outlet.conn_id, device = %outlet.device_id, kind, bytes = text.len(), sent = cut.len(), max = max_out,
                "frame over limits.max_out_frame_bytes: sent cut to fit");
            send_or_abort(outlet, sink, Message::Text(encode_text(cut))).await
        }
        None => {
            warn!(conn = outlet.conn_id, device = %outlet.device_id, kind, bytes = text.len(), max = max_out,
                "frame over limits.max_out_frame_bytes cannot be cut to fit; closing the connection");
            outlet.close(CloseReason::SendFailed);
            Err(())
        }
    }
}

/// Sends one message unless the connection is told to close without draining meanwhile (a
/// stalled reader would otherwise hold this task in `send` forever). A write that fails is
/// never silent: a socket the peer closed is logged at debug (that is how phones leave), any
/// other failure at warn with what and how big, and the connection closes with 1011.
async fn send_or_abort(outlet: &Outlet, sink: &mut WsSink, msg: Message) -> Result<(), ()> {
    // What the log line names if the write fails: a shared handle on the text (a refcount, not
    // a copy), so a frame's type is only looked up when there is something to say about it.
    let (text, size) = match &msg {
        Message::Text(t) => (Some(t.clone()), t.len()),
        Message::Binary(b) => (None, b.len()),
        _ => (None, 0),
    };
    let kind = || match &text {
        Some(t) => frame_kind(t.as_str()),
        None if size > 0 => "binary".to_owned(),
        None => "control".to_owned(),
    };
    let send = sink.send(msg);
    tokio::pin!(send);
    let result = tokio::select! {
        r = &mut send => r,
        _ = outlet.wait_closing() => {
            if outlet.must_abort() {
                return Err(());
            }
            // A draining close still lets this send finish, within the drain timeout.
            match tokio::time::timeout(DRAIN_TIMEOUT, &mut send).await {
                Ok(r) => r,
                Err(_) => return Err(()),
            }
        }
    };
    match result {
        Ok(()) => Ok(()),
        Err(e @ (WsError::ConnectionClosed | WsError::AlreadyClosed | WsError::Io(_))) => {
            debug!(conn = outlet.conn_id, device = %outlet.device_id, kind = kind(), bytes = size, "write failed, the socket is gone: {e}");
            Err(())
        }
        Err(e) => {
            warn!(conn = outlet.conn_id, device = %outlet.device_id, kind = kind(), bytes = size, "could not write a frame: {e}; closing the connection");
            outlet.close(CloseReason::SendFailed);
            Err(())
        }
    }
}

/// Bytes per binary frame of a pull: small enough to interleave nothing large, large enough
/// that framing costs little.
const PULL_CHUNK: usize = 64 << 10;

/// Streams a media file from disk, one chunk in memory at a time, each awaiting the socket.
async fn pull(
    outlet: &Outlet,
    sink: &mut WsSink,
    path: &std::path::Path,
    id: Option<i64>,
) -> Result<(), ()> {
    use tokio::io::AsyncReadExt;
    let mut file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) => {
            warn!("media file {} unreadable: {e}", path.display());
            let end = Frame::media_pull_end(id, false).encode();
            return send_or_abort(outlet, sink, Message::Text(encode_text(end))).await;
        }
    };
    let mut ok = true;
    loop {
        let mut buf = vec![0u8; PULL_CHUNK];
        let n = match file.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                warn!("media read failed: {e}");
                ok = false;
                break;
            }
        };
        buf.truncate(n);
        send_or_abort(outlet, sink, Message::Binary(Bytes::from(buf))).await?;
    }
    let end = Frame::media_pull_end(id, ok).encode();
    send_or_abort(outlet, sink, Message::Text(encode_text(end))).await
}

/// `sync`: streams outboxed frames after `cursor` straight from the store (not through the
/// queue, so a long catch-up costs no memory), then `sync.done`, then switches the connection
/// back to live delivery. Reading the head and switching happen with no await in between, so
/// every frame is delivered exactly once: by this replay or by live fan-out.
async fn replay(
    hub: &Hub,
    outlet: &Outlet,
    sink: &mut WsSink,
    cursor: u64,
    id: Option<i64>,
    max_out: usize,
) -> Result<(), ()> {
    const CHUNK: usize = 64;
    // A cursor a restore's gap holds names a frame of the store the restore replaced: what the
    // device shows is not this store's, and replaying what follows would skip what it lacks.
    // `sync.done` with a cursor below the device's tells it to reload (docs/protocol.md).
    match hub.store().forked_at(cursor) {
        Ok(Some(fork)) => {
            outlet.set_live();
            let done = Frame::sync_done(id, fork).encode();
            return send_or_abort(outlet, sink, Message::Text(encode_text(done))).await;
        }
        Ok(None) => {}
        Err(e) => {
            warn!("sync replay failed: {e}");
            outlet.set_live();
            let f = Frame::error(id, ErrorCode::Internal, format!("sync failed: {e}"));
            return send_or_abort(outlet, sink, Message::Text(encode_text(f.encode()))).await;
        }
    }
    let mut next = cursor;
    loop {
        let head = hub.published_head();
        let batch = match hub.store().outbox_range(next, head, CHUNK) {
            Ok(b) => b,
            Err(e) => {
                warn!("sync replay failed: {e}");
                outlet.set_live();
                let f = Frame::error(id, ErrorCode::Internal, format!("sync failed: {e}"));
                return send_or_abort(outlet, sink, Message::Text(encode_text(f.encode()))).await;
            }
        };
        if batch.is_empty() {
            outlet.set_live();
            let done = Frame::sync_done(id, head).encode();
            return send_or_abort(outlet, sink, Message::Text(encode_text(done))).await;
        }
        for (c, bytes) in batch {
            next = c;
            if !outlet.takes_outboxed(&bytes) {
                continue;
            }
            let text = encode_text(crate::protocol::with_cursor(&bytes, c));
            send_text(outlet, sink, text, max_out).await?;
        }
    }
}
