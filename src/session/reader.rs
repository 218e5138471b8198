//! The reader: the device's frames in order, within the session's rate limits, each handed to
//! the hub or, for an upload, to the upload in progress.

use std::rc::Rc;

use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::Message;
use tracing::{debug, info};

use crate::config::Limits;
use crate::hub::Hub;
use crate::outlet::{CloseReason, Outlet};
use crate::protocol::{decode_request, ErrorCode, Frame, Request};

use super::rate::{data_bytes, RateLimit};
use super::upload;
use super::violation::{close_code, violation};
use super::WsStream;

/// Reads the device's frames in order and hands each to the hub (or to the upload in
/// progress), within the connection's frame and byte rates, until the socket ends or the
/// connection is told to close.
pub async fn read_loop(hub: &Rc<Hub>, outlet: &Rc<Outlet>, mut stream: WsStream) {
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
                    if let Some((reason, message)) = violation(&e) {
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

    /// Hands an admitted frame on. `false` when the device closed the socket.
    ///
    /// Uploads are decided here and nowhere else: an upload's binary frames only mean something
    /// next to the session's slot (`upload.rs`), which lives as long as this socket, so the
    /// session keeps `media.upload.start`/`end` and the hub never receives them.
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
