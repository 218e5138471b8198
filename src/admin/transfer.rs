//! The backup transfers: a backup streamed to the browser as it is made, and a restore
//! uploaded, bounded, checked in full and left for the restart (`control/backup.rs`,
//! `control/restore.rs`).

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tracing::{info, warn};

use super::pages::{self, Notice};
use super::receive::receive;
use super::reply::{page, refused, whole, Body, Refusal, Reply};
use super::{owner, session, Admin};
use crate::hub::Hub;

/// The longest a backup download or a restore upload may take beyond the request deadline.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(3600);
/// A restore upload may be this much larger than `limits.media_quota_bytes` (the store part).
pub const RESTORE_STORE_ALLOWANCE: u64 = 1 << 30;
/// The backup transfers' paths: they may take longer than a page (`is_transfer`).
pub(super) const DOWNLOAD: &str = "/admin/backup/download";
pub(super) const RESTORE: &str = "/admin/backup/restore";

/// Requests that may outlast the request deadline: the backup download and restore upload.
pub fn is_transfer(req: &Request<Incoming>) -> bool {
    matches!(
        req.uri().path(),
        DOWNLOAD | RESTORE | super::updates::UPLOAD
    )
}
/// The backup download and restore upload: a signed-in session first, before any byte is made
/// or read; the upload's CSRF token comes in a header (its body is the file).
pub(super) async fn serve(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    peer: SocketAddr,
    secure: bool,
) -> Response<Body> {
    // The backup transfers: a signed-in session first, before any byte is made or read.
    let owner = match owner::load(&admin.data_dir) {
        Ok(Some(o)) => o,
        _ => return whole(refused(admin, Refusal::NoSession, secure)),
    };
    let Some(valid) = admin.signed_in(req.headers(), &owner) else {
        return whole(refused(admin, Refusal::NoSession, secure));
    };
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, DOWNLOAD) => download(admin, hub, secure),
        (Method::POST, path @ (RESTORE | super::updates::UPLOAD)) => {
            let token = req
                .headers()
                .get("x-csrf-token")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !session::same(token, &valid.csrf) {
                info!(%peer, "admin page: restore without its CSRF token; nothing done");
                return whole(refused(admin, Refusal::BadCsrf, secure));
            }
            if path == RESTORE {
                whole(restore(admin, hub, req, peer, secure).await)
            } else {
                whole(super::updates::upload(admin, hub, req, peer, secure).await)
            }
        }
        _ => whole(refused(admin, Refusal::NotFound, secure)),
    }
}

/// `GET /admin/backup/download`: a backup made now, streamed.
pub(super) fn download(admin: &Admin, hub: &Rc<Hub>, secure: bool) -> Response<Body> {
    let rx = match crate::control::backup::stream(hub) {
        Ok(rx) => rx,
        Err(e) => {
            warn!("admin page: backup refused: {e}");
            return whole(refused(
                admin,
                Refusal::Unavailable(format!("cannot make a backup: {e}")),
                secure,
            ));
        }
    };
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (chunk.map(hyper::body::Frame::data), rx))
    });
    let mut reply = Response::new(http_body_util::StreamBody::new(chunks).boxed_unsync());
    let h = reply.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    let name = format!(
        "attachment; filename=\"iris-backup-{}.iris\"",
        chrono::Local::now().format("%Y%m%d-%H%M%S")
    );
    if let Ok(v) = HeaderValue::from_str(&name) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    reply
}

/// `POST /admin/backup/restore`: the body is a backup file. One upload at a time: streamed to
/// the data dir (bounded, with room for it and for the store built from it checked first and as
/// it grows), then checked and built in full off the event loop (`restore::prepare_upload`), and
/// only then accepted and left for the restart to move in.
pub(super) async fn restore(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    peer: SocketAddr,
    secure: bool,
) -> Reply {
    let limit = hub.limits().media_quota_bytes + RESTORE_STORE_ALLOWANCE;
    let announced = hyper::body::Body::size_hint(req.body()).lower();
    if announced > limit {
        return refused(admin, Refusal::TooLarge, secure);
    }
    if admin.restoring.replace(true) {
        info!(%peer, "admin page: a second restore upload while one is under way; refused");
        return refused(
            admin,
            Refusal::Conflict(
                "another restore upload is being received or checked; wait for its answer, \
                 nothing was changed"
                    .into(),
            ),
            secure,
        );
    }
    let _done = RestoreSlot(&admin.restoring);
    if admin
        .data_dir
        .join(crate::control::restore::PENDING_RESTORE)
        .exists()
    {
        return refused(
            admin,
            Refusal::Conflict(
                "a restore is already waiting for the restart; nothing was changed".into(),
            ),
            secure,
        );
    }
    // The upload and the store built from it, about as big, both stay until the restart.
    if let Err(e) = hub.store().disk_ok(announced) {
        info!(%peer, "admin page: restore upload refused: {e}");
        return refused(
            admin,
            Refusal::Unavailable(format!(
                "not enough room on the data disk for the upload and the store restored from \
                 it ({e}); nothing was changed"
            )),
            secure,
        );
    }
    let partial = admin.data_dir.join(format!(
        "{}.partial",
        crate::control::restore::PENDING_RESTORE
    ));
    let result = receive(hub, req.into_body(), &partial, limit).await;
    let fail = |r: Refusal| {
        let _ = std::fs::remove_file(&partial);
        refused(admin, r, secure)
    };
    let size = match result {
        Ok(size) => size,
        Err(r) => return fail(r),
    };
    if let Err(e) = hub.store().disk_ok(size / 2) {
        info!(%peer, "admin page: restore upload refused: {e}");
        return fail(Refusal::Unavailable(format!(
            "not enough room on the data disk for the store restored from the upload ({e}); \
             nothing was changed"
        )));
    }
    let prepared = {
        let (dir, path, store) = (admin.data_dir.clone(), partial.clone(), hub.store().clone());
        tokio::task::spawn_blocking(move || {
            crate::control::restore::prepare_upload(&dir, &path, || {
                store.disk_ok(0).map_err(|e| e.to_string())
            })
        })
        .await
    };
    let summary = match prepared {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            info!(%peer, "admin page: uploaded backup refused: {e}");
            let why = match e {
                crate::control::backup::Error::Refused(why) => Refusal::Unavailable(why),
                e => Refusal::BadInput(format!(
                    "not a whole, undamaged backup ({e}); nothing was changed"
                )),
            };
            return fail(why);
        }
        Err(e) => return fail(Refusal::Unavailable(e.to_string())),
    };
    info!(%peer, "admin page: backup uploaded, checked and built ({summary}); restarting into it");
    schedule_restart(admin);
    page(
        admin,
        StatusCode::OK,
        "Restoring",
        "/admin/backup",
        None,
        secure,
        &pages::message(
            &format!(
                "The backup is whole and ready ({summary}). The gateway now restarts into it; \
                 the current store is kept aside in the data dir. You stay signed in."
            ),
            &Notice::Good("Restore accepted."),
        ),
    )
}

/// Frees the one restore slot when the upload's answer is made, whichever way it went.
pub(super) struct RestoreSlot<'a>(pub(super) &'a std::cell::Cell<bool>);

impl Drop for RestoreSlot<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Asks `run` to restart once this answer has had time to reach the browser.
pub(super) fn schedule_restart(admin: &Admin) {
    let restart = admin.restart.clone();
    tokio::task::spawn_local(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        restart.notify_one();
    });
}
