//! `media.pull`: a stored file streamed to the device as binary frames, then `media.pull.end`.

use bytes::Bytes;
use tokio_tungstenite::tungstenite::Message;
use tracing::warn;

use crate::outlet::{encode_text, Outlet};
use crate::protocol::Frame;

use super::send::send_or_abort;
use super::WsSink;

/// Bytes per binary frame of a pull: small enough to interleave nothing large, large enough
/// that framing costs little.
const PULL_CHUNK: usize = 64 << 10;

/// Streams a media file from disk, one chunk in memory at a time, each awaiting the socket.
pub async fn pull(
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
