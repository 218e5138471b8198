//! The local control channel: how `pair` and `devices` reach a running gateway.
//!
//! sled locks its database for one process, so while the gateway runs (the normal case under
//! systemd) no other process can open the store. The gateway therefore listens on a Unix socket
//! in its data dir (mode 0600: only the gateway's user and root reach it) and the commands send
//! it one JSON line and read one back. When nothing listens there, the commands open the store
//! themselves.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use crate::hub::Hub;
use crate::pairing::page::PairingPage;
use crate::store::Device;

/// Longest request line accepted on the control socket.
const MAX_LINE: usize = 4096;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ControlRequest {
    Pair {
        name: String,
    },
    Devices,
    Revoke {
        device_id: String,
    },
    Backup,
    /// A fresh one-time code for the pairing page (`pair --page`).
    PairPage,
    /// Health, agent, push, storage and devices (`status`).
    Status,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ControlResponse {
    Paired {
        device_id: String,
        token: String,
        url: String,
        /// `wss://` URL and certificate fingerprint, when TLS is on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tls: Option<crate::tls::Advert>,
    },
    Devices {
        devices: Vec<Device>,
    },
    Revoked {
        existed: bool,
    },
    PageCode {
        /// `XXXX-XXXX`; it replaces any earlier code.
        code: String,
        /// Where to enter it: `http(s)://HOST:PORT/pair`.
        page_url: String,
        expires_in_secs: u64,
    },
    Status {
        report: Box<crate::hub::StatusReport>,
    },
    Error {
        message: String,
    },
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

/// Serves control requests until the listener is dropped.
pub async fn serve(
    listener: UnixListener,
    hub: Rc<Hub>,
    url: String,
    tls: Option<crate::tls::Advert>,
    page: Rc<PairingPage>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let hub = hub.clone();
        let url = url.clone();
        let tls = tls.clone();
        let page = page.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = serve_one(stream, &hub, &url, tls, &page).await {
                debug!("control request failed: {e}");
            }
        });
    }
}

async fn serve_one(
    stream: UnixStream,
    hub: &Hub,
    url: &str,
    tls: Option<crate::tls::Advert>,
    page: &PairingPage,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_LINE as u64));
    tokio::time::timeout(CLIENT_TIMEOUT, reader.read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::other("control client too slow"))??;
    let request = serde_json::from_str::<ControlRequest>(&line);
    // Answered with the backup stream itself (or an `Error` line): see `backup.rs`.
    if let Ok(ControlRequest::Backup) = request {
        let stream = reader
            .into_inner()
            .into_inner()
            .reunite(write)
            .map_err(std::io::Error::other)?;
        return crate::backup::serve(hub, stream).await;
    }
    let response = match request {
        Ok(ControlRequest::Pair { name }) => match hub.pair(&name).await {
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
        Ok(ControlRequest::Revoke { device_id }) => match hub.revoke(&device_id).await {
            Ok(existed) => ControlResponse::Revoked { existed },
            Err(e) => ControlResponse::Error {
                message: e.to_string(),
            },
        },
        Ok(ControlRequest::PairPage) => ControlResponse::PageCode {
            code: page.codes.mint(),
            page_url: page.address(),
            expires_in_secs: page.codes.ttl().as_secs(),
        },
        Ok(ControlRequest::Status) => ControlResponse::Status {
            report: Box::new(hub.status_report()),
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

/// Outcome of asking a running gateway.
pub enum Reached {
    /// A gateway answered.
    Answer(ControlResponse),
    /// Nothing listens: the caller may open the store itself.
    NotRunning,
}

/// Sends one request to the gateway running from `data_dir`, if any (blocking; for the CLI).
pub fn request(data_dir: &Path, req: &ControlRequest) -> std::io::Result<Reached> {
    use std::io::{BufRead, Write};
    let path = socket_path(data_dir);
    let mut stream = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(Reached::NotRunning)
        }
        Err(e) => return Err(e),
    };
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut line = serde_json::to_vec(req).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut answer = String::new();
    std::io::BufReader::new(stream).read_line(&mut answer)?;
    let resp = serde_json::from_str(&answer).map_err(|e| {
        std::io::Error::other(format!(
            "the gateway's control socket answered nonsense: {e}"
        ))
    })?;
    Ok(Reached::Answer(resp))
}
