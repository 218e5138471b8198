//! A request body written to a file as it arrives, bounded: the restore upload and the update
//! upload both take a file this way.

use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::reply::Refusal;
use crate::hub::Hub;

/// How often (in bytes written) an upload checks the disk still has room.
const DISK_CHECK_EVERY: u64 = 8 << 20;

/// Writes a request body to `path`, refusing it past `limit` bytes or when the disk fills.
pub(super) async fn receive(
    hub: &Hub,
    mut body: Incoming,
    path: &std::path::Path,
    limit: u64,
) -> Result<u64, Refusal> {
    use std::io::Write;
    let unavailable = |e: std::io::Error| Refusal::Unavailable(e.to_string());
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(unavailable)?);
    let (mut written, mut checked) = (0u64, 0u64);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Refusal::BadInput(format!("the upload broke off: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        written += data.len() as u64;
        if written > limit {
            return Err(Refusal::TooLarge);
        }
        // From the first bytes on: a small upload must not eat the store's reserve either.
        if checked == 0 || written - checked >= DISK_CHECK_EVERY {
            hub.store()
                .disk_ok(DISK_CHECK_EVERY.min(written))
                .map_err(|e| Refusal::Unavailable(format!("no room for the upload: {e}")))?;
            checked = written;
        }
        file.write_all(&data).map_err(unavailable)?;
    }
    file.into_inner()
        .map_err(|e| unavailable(e.into_error()))?
        .sync_all()
        .map_err(unavailable)?;
    Ok(written)
}
