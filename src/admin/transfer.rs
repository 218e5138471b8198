//! The backup transfers: a backup streamed to the browser as it is made, and a restore
//! uploaded, bounded, checked in full and left for the restart (the backups wing,
//! `crate::backups`).

use std::rc::Rc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response};
use tracing::{info, warn};

use super::context::{Ctx, Gate};
use super::jobs::{Kind, Ticket};
use super::receive::receive;
use super::reply::{redirect, refused, sentence, whole, Body, Refusal, Reply};
use super::restore_job::{restore_room, start_restore};
use super::route::Route;
use super::{session, Admin};
use crate::backups::{format_of, Format, FOREIGN, RECEIVED_PART};
use crate::hub::Hub;

/// The longest a backup download or a restore upload's body may take beyond the request
/// deadline: moving the bytes only; what the upload starts is a job (`jobs.rs`) with no such
/// bound.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(3600);
/// A restore upload may be this much larger than `limits.media_quota_bytes` (the store part).
pub const RESTORE_STORE_ALLOWANCE: u64 = 1 << 30;

/// Requests that may outlast the request deadline: the backup download and restore upload.
pub fn is_transfer(req: &Request<Incoming>) -> bool {
    Route::parse(req.uri().path()).is_some_and(|r| r.is_transfer())
}
/// The backup download and restore upload: a signed-in session first, before any byte is made
/// or read; the upload's CSRF token comes in a header (its body is the file).
pub(super) async fn serve(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    ctx: Ctx,
) -> Response<Body> {
    let peer = ctx.peer();
    // The backup transfers: a signed-in session first, before any byte is made or read.
    let Gate::SignedIn(_, who) = Gate::of(admin, req.headers(), ctx) else {
        return whole(refused(admin, Refusal::NoSession, ctx));
    };
    match (req.method().clone(), Route::parse(req.uri().path())) {
        (Method::GET, Some(Route::BackupDownload)) => download(admin, hub, ctx),
        (Method::POST, Some(route @ (Route::BackupRestore | Route::UpdateUpload))) => {
            let token = req
                .headers()
                .get("x-csrf-token")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !session::same(token, who.csrf()) {
                info!(%peer, "admin page: restore without its CSRF token; nothing done");
                return whole(refused(admin, Refusal::BadCsrf, ctx));
            }
            if route == Route::BackupRestore {
                whole(restore(admin, hub, req, ctx).await)
            } else {
                whole(super::updates::upload(admin, hub, req, ctx).await)
            }
        }
        _ => whole(refused(admin, Refusal::NotFound, ctx)),
    }
}

/// `GET /admin/backup/download`: a backup made now, streamed.
pub(super) fn download(admin: &Admin, hub: &Rc<Hub>, ctx: Ctx) -> Response<Body> {
    let rx = match crate::backups::stream(hub) {
        Ok(rx) => rx,
        Err(e) => {
            warn!("admin page: backup refused: {e}");
            return whole(refused(
                admin,
                Refusal::Unavailable(format!("cannot make a backup: {e}")),
                ctx,
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

/// The header that carries a sealed backup's passphrase with its upload (percent-encoded, as
/// the page's script sends it); never logged.
pub(super) const PASSPHRASE_HEADER: &str = "x-backup-passphrase";

/// `POST /admin/backup/restore`: the body is a backup file, plain or sealed. The restore slot
/// (`jobs.rs`) is taken first and held by the upload and then by its job: the body is streamed
/// to the data dir (bounded, with room for it and for the store built from it checked first and
/// as it grows) within the transfer's time; once it is all here, the answer is a `303` to the
/// restore job's page, and the job checks and builds it off the event loop and restarts into it.
pub(super) async fn restore(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    ctx: Ctx,
) -> Reply {
    let peer = ctx.peer();
    let limit = hub.limits().media_quota_bytes + RESTORE_STORE_ALLOWANCE;
    let announced = hyper::body::Body::size_hint(req.body()).lower();
    if announced > limit {
        return refused(admin, Refusal::TooLarge, ctx);
    }
    let passphrase = req
        .headers()
        .get(PASSPHRASE_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(|v| zeroize::Zeroizing::new(crate::pairing::page::percent_decode(v)));
    let ticket = match admin
        .jobs
        .begin(Kind::Restore, "Receiving the uploaded backup.")
    {
        Ok(t) => t,
        Err(busy) => {
            info!(%peer, "admin page: a restore upload while a restore is under way; refused");
            return refused(admin, Refusal::Conflict(busy.to_string()), ctx);
        }
    };
    let fail = |ticket: Ticket, r: Refusal| {
        let _ = std::fs::remove_file(admin.data_dir.join(RECEIVED_PART));
        ticket.finish(Err(sentence(&r.to_string())));
        refused(admin, r, ctx)
    };
    // The upload and the store built from it, about as big, both stay until the restart.
    if let Err(why) = restore_room(admin, hub, announced) {
        info!(%peer, "admin page: restore upload refused: {why}");
        return fail(ticket, Refusal::Conflict(why));
    }
    let received = admin.data_dir.join(RECEIVED_PART);
    let size = match receive(hub, req.into_body(), &received, limit).await {
        Ok(size) => size,
        Err(r) => return fail(ticket, r),
    };
    if let Err(e) = hub.store().disk_ok(size / 2) {
        info!(%peer, "admin page: restore upload refused: {e}");
        return fail(
            ticket,
            Refusal::Unavailable(format!(
                "not enough room on the data disk for the store restored from the upload ({e}); \
                 nothing was changed"
            )),
        );
    }
    let passphrase = match (format_of(&received), passphrase) {
        (None, _) => {
            info!(%peer, "admin page: uploaded file is no backup; refused");
            return fail(ticket, Refusal::BadInput(FOREIGN.into()));
        }
        (Some(Format::Sealed), None) => {
            return fail(
                ticket,
                Refusal::BadInput(
                    "this is a scheduled (encrypted) backup: give its backup passphrase with \
                     it; nothing was changed"
                        .into(),
                ),
            )
        }
        (Some(Format::Sealed), Some(p)) => Some(p),
        (Some(Format::Plain), _) => None,
    };
    info!(%peer, bytes = size, sealed = passphrase.is_some(), "admin page: backup uploaded; its restore job checks it");
    start_restore(admin, hub, ticket, received, passphrase, true);
    redirect(&Kind::Restore.page())
}

/// Asks `run` to restart once this answer has had time to reach the browser.
pub(super) fn schedule_restart(admin: &Admin) {
    super::restore_job::restart_soon(admin.restart.clone());
}
