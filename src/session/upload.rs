//! A session's media upload: `media.upload.start`, binary frames, `media.upload.end`.
//!
//! One upload at a time per connection, so every binary frame between a start and its end
//! belongs to that upload. Bytes stream to a temp file as they arrive (`crate::media`); the
//! hub records the file only once length and checksum match.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::hub::Hub;
use crate::media::{self, MediaError};
use crate::outlet::Outlet;
use crate::protocol::{is_valid_id, mime, ErrorCode, Frame, UploadStart};

pub struct Uploading {
    media_ref: String,
    start: UploadStart,
    /// `None` once the upload has failed; its end is then answered `ok: false`.
    upload: Option<media::Upload>,
    failure: Option<String>,
    /// When the upload is abandoned if no further frame arrives.
    pub deadline: Instant,
    idle: Duration,
}

/// Handles `media.upload.start`: checks the announcement and the space, opens the temp file.
pub async fn start(
    hub: &Hub,
    outlet: &Outlet,
    slot: &mut Option<Uploading>,
    id: Option<i64>,
    start: UploadStart,
) {
    let refuse = |code, msg: String| outlet.push_frame(&Frame::error(id, code, msg));
    if let Some(active) = slot.as_ref() {
        return refuse(
            ErrorCode::Unsupported,
            format!(
                "upload `{}` is still in progress; send its media.upload.end first",
                active.media_ref
            ),
        );
    }
    if !is_valid_id(&start.media_ref) {
        return refuse(
            ErrorCode::Unsupported,
            "media_ref must be 1-64 characters of [A-Za-z0-9_.:-]".into(),
        );
    }
    if !media::KINDS.contains(&start.kind.as_str()) {
        return refuse(
            ErrorCode::Unsupported,
            format!("kind must be one of {}", media::KINDS.join(", ")),
        );
    }
    // Checked before anything is stored: a stored mime type is later written into headers.
    if let Err(e) = mime::check(&start.mime) {
        return refuse(ErrorCode::Unsupported, format!("mime: {e}"));
    }
    if start.size < 0 {
        return refuse(ErrorCode::Unsupported, "size cannot be negative".into());
    }
    match hub.media().files().begin(start.size as u64).await {
        Ok(upload) => {
            let idle = Duration::from_secs(hub.limits().media_idle_timeout_secs);
            *slot = Some(Uploading {
                media_ref: start.media_ref.clone(),
                start,
                upload: Some(upload),
                failure: None,
                deadline: Instant::now() + idle,
                idle,
            });
        }
        Err(e) => {
            if e.is_space() {
                hub.media().set_full(Some(e.to_string()));
            }
            let code = match e {
                MediaError::Io(_) => ErrorCode::Internal,
                _ => ErrorCode::MediaTooLarge,
            };
            refuse(code, e.to_string());
        }
    }
}

/// A binary frame: the next chunk of the upload in progress.
pub async fn chunk(outlet: &Outlet, slot: &mut Option<Uploading>, bytes: &[u8]) {
    let Some(active) = slot.as_mut() else {
        outlet.push_frame(&Frame::error(
            None,
            ErrorCode::Unsupported,
            "a binary frame outside an upload: send media.upload.start first",
        ));
        return;
    };
    active.deadline = Instant::now() + active.idle;
    let Some(upload) = active.upload.as_mut() else {
        return;
    };
    if let Err(e) = upload.write(bytes).await {
        warn!(media_ref = %active.media_ref, "upload failed: {e}");
        active.failure = Some(e.to_string());
        // Dropping the upload removes its temp file now rather than at the end frame.
        active.upload = None;
    }
}

/// Handles `media.upload.end`: verifies, records and acknowledges (or refuses) the upload.
pub async fn end(
    hub: &Hub,
    outlet: &Outlet,
    slot: &mut Option<Uploading>,
    id: Option<i64>,
    media_ref: String,
    sha256: String,
) {
    let matches = slot.as_ref().is_some_and(|a| a.media_ref == media_ref);
    if !matches {
        outlet.push_frame(&Frame::media_upload_ack(id, false, &media_ref));
        return;
    }
    let active = slot.take().expect("checked above");
    let Some(upload) = active.upload else {
        info!(media_ref = %media_ref, "refused upload: {}", active.failure.unwrap_or_default());
        outlet.push_frame(&Frame::media_upload_ack(id, false, &media_ref));
        return;
    };
    let files = hub.media().files();
    let ok = match upload.finish(files, &sha256).await {
        Ok((sha, size)) => {
            match hub
                .media()
                .finish_upload(&outlet.device_id, &media_ref, &active.start, sha, size)
                .await
            {
                Ok(record) => {
                    info!(media = %record.media_id, size, "stored an upload");
                    true
                }
                Err(e) => {
                    warn!("could not record an upload: {e}");
                    false
                }
            }
        }
        Err(e) => {
            info!(media_ref = %media_ref, "refused upload: {e}");
            false
        }
    };
    outlet.push_frame(&Frame::media_upload_ack(id, ok, &media_ref));
}

/// The upload went quiet past the idle timeout: drop it (and its temp file) and say so.
pub fn abandon(outlet: &Outlet, slot: &mut Option<Uploading>) {
    if let Some(active) = slot.take() {
        info!(media_ref = %active.media_ref, "abandoned an idle upload");
        outlet.push_frame(&Frame::media_upload_ack(None, false, &active.media_ref));
    }
}
