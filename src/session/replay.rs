//! `sync` replay: the outboxed frames a device missed, from the store, before live delivery
//! resumes.

use tokio_tungstenite::tungstenite::Message;
use tracing::warn;

use crate::hub::Hub;
use crate::outlet::{encode_text, Outlet};
use crate::protocol::{ErrorCode, Frame};

use super::send::{send_or_abort, send_text};
use super::WsSink;

/// `sync`: streams outboxed frames after `cursor` straight from the store (not through the
/// queue, so a long catch-up costs no memory), then `sync.done`, then switches the connection
/// back to live delivery. Reading the head and switching happen with no await in between, so
/// every frame is delivered exactly once: by this replay or by live fan-out.
pub async fn replay(
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
