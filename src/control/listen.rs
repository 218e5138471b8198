//! The gateway's end of the control socket: accepting commands and answering them.

use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use super::wire::{socket_path, ControlRequest, ControlResponse, CLIENT_TIMEOUT};
use crate::hub::Hub;
use crate::shutdown::Listener;

/// Longest request line accepted on the control socket.
const MAX_LINE: usize = 4096;

/// A one-time code for the pairing page, as `pair --page` shows it.
pub struct PageCode {
    /// `XXXX-XXXX`; it replaces any earlier code.
    pub code: String,
    /// Where to enter it: `http(s)://HOST:PORT/pair`.
    pub page_url: String,
    pub expires_in: Duration,
}

/// Whatever issues pairing-page codes. The pairing page is a door beside this one, so the
/// control socket does not know it by name: the server, which wires both, supplies it.
pub trait PageCodeIssuer {
    /// A fresh code (it replaces any earlier one) and where to enter it.
    fn issue(&self) -> PageCode;
}

/// Binds the control socket, replacing a stale one left by a crashed gateway.
pub fn bind(data_dir: &Path) -> std::io::Result<UnixListener> {
    let path = socket_path(data_dir);
    if path.exists() {
        // We hold the store lock, so no other gateway can be using this socket.
        std::fs::remove_file(&path)?;
    }
    let listener = UnixListener::bind(&path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// How long the accept loop waits after a failed accept (as the gateway's own listener does).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves control requests until the shutdown begins. A request under way (a `pair`, a
/// backup streaming out) holds its own listener, so the server waits for it (bounded) before
/// the final flush.
pub async fn serve(
    listener: UnixListener,
    hub: Rc<Hub>,
    url: String,
    tls: Option<crate::tls::Advert>,
    page: Rc<dyn PageCodeIssuer>,
    mut stop: Listener,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.recv() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                warn!("control socket accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let done = stop.clone();
        let hub = hub.clone();
        let url = url.clone();
        let tls = tls.clone();
        let page = page.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = serve_one(stream, &hub, &url, tls, &*page).await {
                debug!("control request failed: {e}");
            }
            drop(done);
        });
    }
}

/// One request line, one answer line (or a backup stream).
async fn serve_one(
    stream: UnixStream,
    hub: &Rc<Hub>,
    url: &str,
    tls: Option<crate::tls::Advert>,
    page: &dyn PageCodeIssuer,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_LINE as u64));
    tokio::time::timeout(CLIENT_TIMEOUT, reader.read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::other("control client too slow"))??;
    let request = serde_json::from_str::<ControlRequest>(&line);
    // Answered with the backup stream itself (or an `Error` line): see `backup.rs` beside this file.
    if let Ok(ControlRequest::Backup) = request {
        let stream = reader
            .into_inner()
            .into_inner()
            .reunite(write)
            .map_err(std::io::Error::other)?;
        return super::backup::serve(hub, stream).await;
    }
    let response = match request {
        Ok(ControlRequest::Pair { name }) => match hub.devices().pair(&name).await {
            Ok((device, token)) => ControlResponse::Paired {
                device_id: device.device_id,
                token,
                url: url.to_owned(),
                tls,
            },
            Err(e) => ControlResponse::Error {
                message: e.to_string(),
            },
        },
        Ok(ControlRequest::Devices) => match hub.store().devices() {
            Ok(devices) => ControlResponse::Devices { devices },
            Err(e) => ControlResponse::Error {
                message: e.to_string(),
            },
        },
        Ok(ControlRequest::Revoke { device_id }) => match hub.devices().revoke(&device_id).await {
            Ok(existed) => ControlResponse::Revoked { existed },
            Err(e) => ControlResponse::Error {
                message: e.to_string(),
            },
        },
        Ok(ControlRequest::PairPage) => {
            let issued = page.issue();
            ControlResponse::PageCode {
                code: issued.code,
                page_url: issued.page_url,
                expires_in_secs: issued.expires_in.as_secs(),
            }
        }
        Ok(ControlRequest::Status) => ControlResponse::Status {
            report: Box::new(hub.status().report()),
        },
        Ok(ControlRequest::Backup) => unreachable!("answered above"),
        Err(e) => {
            warn!("bad control request: {e}");
            ControlResponse::Error {
                message: format!("bad request: {e}"),
            }
        }
    };
    let mut out = serde_json::to_vec(&response).unwrap_or_default();
    out.push(b'\n');
    write.write_all(&out).await?;
    write.shutdown().await
}
