//! A command's end of the control socket (blocking: the commands have no event loop). The only
//! place that connects to it, so every command tells "no gateway runs" apart the same way.

use std::io::{BufRead, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::wire::{socket_path, ControlRequest, ControlResponse, CLIENT_TIMEOUT};

/// Outcome of asking a running gateway.
pub enum Reached {
    /// A gateway answered.
    Answer(ControlResponse),
    /// Nothing listens: the caller may open the store itself.
    NotRunning,
}

/// Connects to the gateway running from `data_dir`; `None` when nothing listens there (no
/// socket, or a stale one a stopped gateway left).
pub fn connect(data_dir: &Path) -> std::io::Result<Option<UnixStream>> {
    let stream = match UnixStream::connect(socket_path(data_dir)) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    Ok(Some(stream))
}

/// Writes one request line.
pub fn send(stream: &mut UnixStream, req: &ControlRequest) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(req).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// Sends one request to the gateway running from `data_dir`, if any, and reads its answer.
pub fn request(data_dir: &Path, req: &ControlRequest) -> std::io::Result<Reached> {
    let Some(mut stream) = connect(data_dir)? else {
        return Ok(Reached::NotRunning);
    };
    send(&mut stream, req)?;
    let mut answer = String::new();
    std::io::BufReader::new(stream).read_line(&mut answer)?;
    let resp = serde_json::from_str(&answer).map_err(|e| {
        std::io::Error::other(format!(
            "the gateway's control socket answered nonsense: {e}"
        ))
    })?;
    Ok(Reached::Answer(resp))
}

/// Whether a gateway answers on `data_dir`'s control socket, and how it was seen (for the
/// refusal of a restore while it runs: `crate::backups::Probe`).
pub fn answering(data_dir: &Path) -> Option<String> {
    match request(data_dir, &ControlRequest::Devices) {
        Ok(Reached::Answer(_)) => Some(format!(
            "it answered on {}",
            socket_path(data_dir).display()
        )),
        _ => None,
    }
}
