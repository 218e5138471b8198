//! The control socket's `backup`: a backup made now (by the backups wing, `crate::backups`)
//! streamed to `iris-gateway backup`, or an `Error` line naming why none can be made.

use std::io::{BufWriter, Write};
use std::time::Duration;

use super::wire::ControlResponse;
use crate::backups;
use crate::hub::Hub;
use crate::store::StoreError;

/// How long the gateway waits for a `backup` command that stopped reading (its event loop is
/// paused meanwhile: well inside the systemd watchdog's 30 s).
pub const STALLED_READER: Duration = Duration::from_secs(10);

/// Streams a backup to a `backup` command on the control socket. The store part goes to a spool
/// file first ([`backups::stream`]), so that a snapshot that fails (a damaged history database)
/// is answered with an `Error` line naming the cause, not with the start of a backup the command
/// would then call damaged. When the spool cannot be written (a full or read-only disk: just
/// when a backup matters most) the store part goes straight to the socket instead.
pub async fn serve(hub: &std::rc::Rc<Hub>, stream: tokio::net::UnixStream) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let started = std::time::Instant::now();
    let mut rx = match backups::stream(hub) {
        Ok(rx) => rx,
        Err(
            backups::Error::Io { .. }
            | backups::Error::Store(StoreError::Full { .. } | StoreError::ReadOnly { .. }),
        ) => {
            return serve_direct(hub, stream).await;
        }
        Err(e) => return refuse(stream, &e).await,
    };
    let mut stream = stream;
    while let Some(chunk) = rx.recv().await {
        // A failure half-way ends the stream: the command's read-back then refuses the file.
        let chunk = chunk?;
        tokio::time::timeout(STALLED_READER, stream.write_all(&chunk))
            .await
            .map_err(|_| std::io::Error::other("the backup command stopped reading"))??;
    }
    tracing::info!(ms = started.elapsed().as_millis() as u64, "backup sent");
    stream.shutdown().await
}

/// The `Error` line for a backup that cannot be made.
fn refusal_line(e: &backups::Error) -> Vec<u8> {
    tracing::warn!("backup refused: {e}");
    let answer = ControlResponse::Error {
        message: format!("cannot make a backup: {e}"),
    };
    let mut line = serde_json::to_vec(&answer).unwrap_or_default();
    line.push(b'\n');
    line
}

async fn refuse(mut stream: tokio::net::UnixStream, e: &backups::Error) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    stream.write_all(&refusal_line(e)).await?;
    stream.shutdown().await
}

/// The store part straight to the socket, for when no spool can be written.
async fn serve_direct(hub: &Hub, stream: tokio::net::UnixStream) -> std::io::Result<()> {
    let std_stream = stream.into_std()?;
    std_stream.set_nonblocking(false)?;
    std_stream.set_write_timeout(Some(STALLED_READER))?;
    let started = std::time::Instant::now();
    let out = BufWriter::with_capacity(backups::CHUNK, std_stream.try_clone()?);
    let part = match backups::store_part(hub, out) {
        Ok(part) => part,
        Err(e) => {
            let mut s = std_stream;
            return s.write_all(&refusal_line(&e));
        }
    };
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        bytes = part.bytes(),
        "backup: store snapshot sent; sending media"
    );
    match part.send_media(hub).await {
        Ok(included) => {
            tracing::info!(
                media = included,
                ms = started.elapsed().as_millis() as u64,
                "backup sent"
            );
            Ok(())
        }
        Err(e) => {
            tracing::warn!("backup not completed: {e}");
            Err(e)
        }
    }
}
