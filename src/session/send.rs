//! Sending one frame to the device: within `limits.max_out_frame_bytes`, and never stuck behind a
//! device that stopped reading once the session is told to close.

use futures_util::SinkExt;
use tokio_tungstenite::tungstenite::error::Error as WsError;
use tokio_tungstenite::tungstenite::Message;
use tracing::{debug, warn};

use crate::outlet::{encode_text, CloseReason, FrameText, Outlet};

use super::{WsSink, DRAIN_TIMEOUT};

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
pub async fn send_text(
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
pub async fn send_or_abort(outlet: &Outlet, sink: &mut WsSink, msg: Message) -> Result<(), ()> {
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
