//! The admin web app on the gateway's own port: first-run set-up (claim the box with an owner
//! passphrase), sign-in, and the owner's pages (status, devices, agent, push, backup, log).
//!
//! It is a door into the house, so (docs/security.md, "The admin page"):
//! - the passphrase is kept only as an Argon2id hash (`owner.rs`), checked on a blocking thread
//!   one at a time, and wrong ones are limited per address and in all by the same rotation-proof
//!   counter as the hello gate (`guessing.rs`: no reset by a success);
//! - a session is a random cookie (`HttpOnly`, `SameSite=Strict`, `Secure` over https) in a
//!   bounded table that forgets it when idle, old, signed out or the passphrase changes
//!   (`session.rs`); every POST carries the session's CSRF token (before a session: a
//!   double-submit token in a `SameSite=Strict` cookie);
//! - every answer is `no-store`, with a CSP that allows only this box's own stylesheet and
//!   script (no inline script or style, nothing from outside, no framing), and every form body
//!   is bounded by `limits.admin_max_form_bytes`;
//! - secrets (the agent key, the ntfy token, device tokens after their one showing) are never
//!   rendered, and the passphrase is never logged.
//!
//! Routes live under `/admin/`; a browser's `GET /` is sent here. What it changes goes through
//! the hub (devices), the switchable agent (agent settings, applied to the next turn) and the
//! data dir's `settings.toml` (`crate::settings`), so flags and the config file keep their
//! place in the order.

pub mod owner;
mod pages;
pub mod session;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tracing::{info, warn};

use crate::agent::{Agent, Switchable};
use crate::config::Config;
use crate::guessing::GuessLimiter;
use crate::hub::Hub;
use crate::pairing::Invitation;
use crate::settings::{Hidden, Settings};
use pages::{Frame, Notice};
use session::Sessions;

/// Every admin path starts with this.
pub const PREFIX: &str = "/admin/";
/// Source addresses whose wrong passphrases are counted one by one; past them, the rest share
/// one count (`guessing.rs`), so at most 17 × `admin_signin_failures_per_minute` a minute.
const SIGNIN_TABLE: usize = 16;
/// How long "Test connection" waits for the agent.
const TEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest agent URL, model name and key accepted from the form.
const MAX_URL_BYTES: usize = 2048;
const MAX_MODEL_BYTES: usize = 256;
const MAX_KEY_BYTES: usize = 4096;

/// The longest a backup download or a restore upload may take beyond the request deadline.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(3600);
/// A restore upload may be this much larger than `limits.media_quota_bytes` (the store part).
pub const RESTORE_STORE_ALLOWANCE: u64 = 1 << 30;
/// How often (in bytes written) an upload checks the disk still has room.
const DISK_CHECK_EVERY: u64 = 8 << 20;
/// The backup transfers' paths: they may take longer than a page (`is_transfer`).
const DOWNLOAD: &str = "/admin/backup/download";
const RESTORE: &str = "/admin/backup/restore";

/// The page's only stylesheet and script, embedded: nothing is loaded from outside the box.
const CSS: &str = include_str!("assets/admin.css");
const JS: &str = include_str!("assets/admin.js");

/// A whole answer (most pages).
type Reply = Response<Full<Bytes>>;
/// Every answer's body: whole pages, or a backup streamed as it is made.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// A whole answer as a [`Body`].
fn whole(reply: Reply) -> Response<Body> {
    reply.map(|b| b.map_err(|never| match never {}).boxed_unsync())
}

/// Requests that may outlast the request deadline: the backup download and restore upload.
pub fn is_transfer(req: &Request<Incoming>) -> bool {
    matches!(req.uri().path(), DOWNLOAD | RESTORE)
}

/// The admin app's state: sessions, the sign-in limiter, and what it needs to change settings.
pub struct Admin {
    data_dir: PathBuf,
    sessions: RefCell<Sessions>,
    signin: RefCell<GuessLimiter<SIGNIN_TABLE>>,
    /// One Argon2 hash at a time (each takes 19 MiB and a second of a Pi's CPU).
    hashing: tokio::sync::Semaphore,
    agent: Rc<Switchable>,
    /// The effective configuration (file, saved settings, flags), updated by what is saved.
    config: RefCell<Config>,
    /// What flags set: saved settings never override it.
    pinned: crate::config::Pinned,
    /// The plain URL and the TLS advert, as `pair` reports them: what a pairing QR carries.
    url: String,
    tls: Option<crate::tls::Advert>,
    /// `https://HOST:PORT/admin/` when TLS is on: what a plain page's warning points to.
    https: Option<String>,
    /// Asks `run` to stop and start again (after a restore was uploaded).
    pub restart: Rc<tokio::sync::Notify>,
}

/// A parsed `application/x-www-form-urlencoded` body.
struct Form(Vec<(String, String)>);

impl Form {
    fn get(&self, key: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }
}

/// Decodes a form body; `None` if it is not UTF-8 (no form of ours is).
fn parse_form(body: &[u8]) -> Option<Form> {
    let text = std::str::from_utf8(body).ok()?;
    Some(Form(
        text.split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (
                    crate::pairing::page::percent_decode(k),
                    crate::pairing::page::percent_decode(v),
                )
            })
            .collect(),
    ))
}

/// Why a request could not be served; each maps to a status and a page.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("sign in first")]
    NoSession,
    #[error("this form is stale or came from another site; reload the page and try again")]
    BadCsrf,
    #[error("too large: a form is at most limits.admin_max_form_bytes, a restore upload at most limits.media_quota_bytes plus 1 GiB")]
    TooLarge,
    #[error("{0}")]
    BadInput(String),
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    Unavailable(String),
}

impl Refusal {
    fn status(&self) -> StatusCode {
        match self {
            Refusal::NoSession => StatusCode::UNAUTHORIZED,
            Refusal::BadCsrf => StatusCode::FORBIDDEN,
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::BadInput(_) => StatusCode::BAD_REQUEST,
            Refusal::NotFound => StatusCode::NOT_FOUND,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl Admin {
    pub fn new(
        data_dir: PathBuf,
        config: Config,
        pinned: crate::config::Pinned,
        agent: Rc<Switchable>,
        url: String,
        tls: Option<crate::tls::Advert>,
    ) -> Admin {
        let l = &config.limits;
        Admin {
            sessions: RefCell::new(Sessions::new(
                l.admin_max_sessions,
                Duration::from_secs(l.admin_session_idle_secs),
                Duration::from_secs(l.admin_session_max_secs),
            )),
            signin: RefCell::new(GuessLimiter::new(
                l.admin_signin_failures_per_minute,
                Instant::now(),
            )),
            hashing: tokio::sync::Semaphore::new(1),
            data_dir,
            agent,
            config: RefCell::new(config),
            pinned,
            https: tls.as_ref().map(|t| https_of(&t.url)),
            restart: Rc::new(tokio::sync::Notify::new()),
            url,
            tls,
        }
    }

    fn frame(&self, secure: bool) -> Frame<'_> {
        Frame {
            secure,
            https: self.https.as_deref().filter(|_| !secure),
            fingerprint: self.tls.as_ref().map(|t| t.fingerprint.as_str()),
        }
    }

    fn max_form(&self) -> usize {
        self.config.borrow().limits.admin_max_form_bytes
    }
}

/// Where the https address of the page is, for a plain page's warning: `wss://` → `https://`.
fn https_of(url: &str) -> String {
    format!("{}{PREFIX}", url.replacen("wss://", "https://", 1))
}

/// Serves one request under [`PREFIX`] (or a browser's `GET /`). `secure`: it came over TLS.
pub async fn serve(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    peer: SocketAddr,
    secure: bool,
) -> Response<Body> {
    if !is_transfer(&req) {
        return whole(serve_page(admin, hub, req, peer, secure).await);
    }
    // The backup transfers: a signed-in session first, before any byte is made or read.
    let owner = match owner::load(&admin.data_dir) {
        Ok(Some(o)) => o,
        _ => return whole(refused(admin, Refusal::NoSession, secure)),
    };
    let valid = session::cookie(req.headers(), session::COOKIE).and_then(|id| {
        admin
            .sessions
            .borrow_mut()
            .check(id, owner.stamp(), Instant::now())
    });
    let Some(valid) = valid else {
        return whole(refused(admin, Refusal::NoSession, secure));
    };
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, DOWNLOAD) => download(admin, hub, secure),
        (Method::POST, RESTORE) => {
            let token = req
                .headers()
                .get("x-csrf-token")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !session::same(token, &valid.csrf) {
                info!(%peer, "admin page: restore without its CSRF token; nothing done");
                return whole(refused(admin, Refusal::BadCsrf, secure));
            }
            whole(restore(admin, hub, req, peer, secure).await)
        }
        _ => whole(refused(admin, Refusal::NotFound, secure)),
    }
}

/// `GET /admin/backup/download`: a backup made now, streamed.
fn download(admin: &Admin, hub: &Rc<Hub>, secure: bool) -> Response<Body> {
    let rx = match crate::backup::stream(hub) {
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

/// `POST /admin/backup/restore`: the body is a backup file. Streamed to the data dir (bounded,
/// with the disk checked as it grows), checked in full, then left for the restart to restore.
async fn restore(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    peer: SocketAddr,
    secure: bool,
) -> Reply {
    let limit = hub.limits().media_quota_bytes + RESTORE_STORE_ALLOWANCE;
    if hyper::body::Body::size_hint(req.body()).lower() > limit {
        return refused(admin, Refusal::TooLarge, secure);
    }
    let partial = admin
        .data_dir
        .join(format!("{}.partial", crate::backup::PENDING_RESTORE));
    let result = receive(hub, req.into_body(), &partial, limit).await;
    let fail = |r: Refusal| {
        let _ = std::fs::remove_file(&partial);
        refused(admin, r, secure)
    };
    if let Err(r) = result {
        return fail(r);
    }
    let checked = {
        let path = partial.clone();
        tokio::task::spawn_blocking(move || crate::backup::check_upload(&path)).await
    };
    let summary = match checked {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            info!(%peer, "admin page: uploaded backup refused: {e}");
            return fail(Refusal::BadInput(format!(
                "not a whole, undamaged backup ({e}); nothing was changed"
            )));
        }
        Err(e) => return fail(Refusal::Unavailable(e.to_string())),
    };
    let pending = admin.data_dir.join(crate::backup::PENDING_RESTORE);
    if let Err(e) = std::fs::rename(&partial, &pending) {
        return fail(Refusal::Unavailable(e.to_string()));
    }
    info!(%peer, "admin page: backup uploaded and checked ({summary}); restarting into it");
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
                "The backup is whole ({summary}). The gateway now restarts into it; the \
                 current store is kept aside in the data dir. Sign in again in a moment."
            ),
            &Notice::Good("Restore accepted."),
        ),
    )
}

/// Asks `run` to restart once this answer has had time to reach the browser.
fn schedule_restart(admin: &Admin) {
    let restart = admin.restart.clone();
    tokio::task::spawn_local(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        restart.notify_one();
    });
}

/// Writes a request body to `path`, refusing it past `limit` bytes or when the disk fills.
async fn receive(
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
        if written - checked >= DISK_CHECK_EVERY {
            hub.store()
                .disk_ok(DISK_CHECK_EVERY)
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

/// Everything but the two transfers: set-up, sign-in, then the signed-in pages and forms.
async fn serve_page(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    peer: SocketAddr,
    secure: bool,
) -> Reply {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/admin/static/admin.css") => return asset("text/css", CSS),
        (&Method::GET, "/admin/static/admin.js") => return asset("text/javascript", JS),
        _ => {}
    }
    if path == "/" || path == "/admin" {
        return redirect(PREFIX);
    }
    let owner = match owner::load(&admin.data_dir) {
        Ok(o) => o,
        Err(e) => {
            warn!("admin page: {e}");
            return page(
                admin,
                StatusCode::INTERNAL_SERVER_ERROR,
                "Owner unreadable",
                "",
                None,
                secure,
                &pages::message(&e.to_string(), &Notice::None),
            );
        }
    };
    let Some(owner) = owner else {
        return unclaimed(admin, hub, req, peer, secure).await;
    };
    if method == Method::POST && path == "/admin/signin" {
        return sign_in(admin, &owner, req, peer, secure).await;
    }
    if path == "/admin/setup" {
        return page(
            admin,
            StatusCode::CONFLICT,
            "Already claimed",
            "",
            None,
            secure,
            &pages::message(
                "This gateway already has an owner. Sign in with the passphrase, or take it \
                 back at the box with iris-gateway owner reset.",
                &Notice::None,
            ),
        );
    }
    let valid = session::cookie(req.headers(), session::COOKIE).and_then(|id| {
        admin
            .sessions
            .borrow_mut()
            .check(id, owner.stamp(), Instant::now())
    });
    let Some(valid) = valid else {
        if method == Method::GET || method == Method::HEAD {
            if path == PREFIX {
                return signin_page(admin, StatusCode::OK, &Notice::None, secure);
            }
            return redirect(PREFIX);
        }
        return refused(admin, Refusal::NoSession, secure);
    };
    let csrf = valid.csrf;
    let result = match method {
        Method::GET | Method::HEAD => get(admin, hub, &path, &csrf, secure).await,
        Method::POST => {
            let form = match read_form(admin, req).await {
                Ok(f) => f,
                Err(r) => return refused(admin, r, secure),
            };
            if !session::same(form.get("csrf"), &csrf) {
                info!(%peer, path, "admin page: CSRF token missing or wrong; nothing done");
                return refused(admin, Refusal::BadCsrf, secure);
            }
            post(admin, hub, &owner, &path, &form, &csrf, peer, secure).await
        }
        _ => Err(Refusal::NotFound),
    };
    match result {
        Ok(reply) => reply,
        Err(r) => refused(admin, r, secure),
    }
}

/// Reads a form body, refusing it past `limits.admin_max_form_bytes` (nothing more is buffered).
async fn read_form(admin: &Admin, req: Request<Incoming>) -> Result<Form, Refusal> {
    let body = Limited::new(req.into_body(), admin.max_form())
        .collect()
        .await
        .map_err(|_| Refusal::TooLarge)?
        .to_bytes();
    parse_form(&body).ok_or_else(|| Refusal::BadInput("the form is not UTF-8".into()))
}

/// The box has no owner: set-up, and nothing else.
async fn unclaimed(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    peer: SocketAddr,
    secure: bool,
) -> Reply {
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::POST, "/admin/setup") => {}
        (Method::GET | Method::HEAD, PREFIX) => {
            return setup_page(admin, StatusCode::OK, &Notice::None, secure)
        }
        (Method::GET | Method::HEAD, _) => return redirect(PREFIX),
        _ => return refused(admin, Refusal::NoSession, secure),
    }
    let pre = session::cookie(req.headers(), session::PRE_COOKIE).map(str::to_owned);
    let form = match read_form(admin, req).await {
        Ok(f) => f,
        Err(r) => return refused(admin, r, secure),
    };
    if !pre.is_some_and(|p| session::same(&p, form.get("pre"))) {
        return refused(admin, Refusal::BadCsrf, secure);
    }
    let (pass, confirm) = (form.get("passphrase"), form.get("confirm"));
    if pass != confirm {
        let n = Notice::Bad("The two passphrases differ.");
        return setup_page(admin, StatusCode::BAD_REQUEST, &n, secure);
    }
    if let Err(e) = owner::check_new(pass) {
        return setup_page(
            admin,
            StatusCode::BAD_REQUEST,
            &Notice::Bad(&e.to_string()),
            secure,
        );
    }
    let owner = match hash_new(admin, pass).await {
        Ok(o) => o,
        Err(e) => return refused(admin, Refusal::Unavailable(e), secure),
    };
    match owner::claim(&admin.data_dir, &owner) {
        Ok(true) => {}
        Ok(false) => return redirect(PREFIX),
        Err(e) => return refused(admin, Refusal::Unavailable(e.to_string()), secure),
    }
    info!(%peer, "admin page: the gateway was claimed (owner passphrase set)");
    let id = admin
        .sessions
        .borrow_mut()
        .create(owner.stamp(), Instant::now());
    let csrf = admin
        .sessions
        .borrow_mut()
        .check(&id, owner.stamp(), Instant::now())
        .map(|v| v.csrf)
        .unwrap_or_default();
    // Right after claiming: pair the phone showing the page (or another one).
    let body = match hub.pair("").await {
        Ok((device, token)) => {
            let inv = Invitation::new(&admin.url, &token, admin.tls.as_ref());
            pages::invitation(
                &inv,
                &device.device_id,
                "The gateway is yours. Now pair this phone:",
            )
        }
        Err(e) => pages::message(
            &format!("The gateway is yours, but a device could not be paired ({e}); try Devices."),
            &Notice::None,
        ),
    };
    let mut reply = page(
        admin,
        StatusCode::OK,
        "Pair this phone",
        "",
        Some(&csrf),
        secure,
        &body,
    );
    set_cookies(
        &mut reply,
        &[
            session::set_cookie(session::COOKIE, &id, secure),
            session::set_cookie(session::PRE_COOKIE, "", secure),
        ],
    );
    reply
}

/// Hashes a new passphrase on a blocking thread, one at a time.
async fn hash_new(admin: &Admin, passphrase: &str) -> Result<owner::Owner, String> {
    let _permit = admin.hashing.acquire().await.map_err(|e| e.to_string())?;
    let p = zeroize::Zeroizing::new(passphrase.to_owned());
    tokio::task::spawn_blocking(move || owner::hash(&p))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// Checks a passphrase on a blocking thread, one at a time.
async fn verify(admin: &Admin, owner: &owner::Owner, passphrase: &str) -> bool {
    let Ok(_permit) = admin.hashing.acquire().await else {
        return false;
    };
    let (o, p) = (
        owner.clone(),
        zeroize::Zeroizing::new(passphrase.to_owned()),
    );
    tokio::task::spawn_blocking(move || owner::verify(&o, &p))
        .await
        .unwrap_or(false)
}

/// `POST /admin/signin`: limited before the passphrase is read, then checked off the event loop.
async fn sign_in(
    admin: &Admin,
    owner: &owner::Owner,
    req: Request<Incoming>,
    peer: SocketAddr,
    secure: bool,
) -> Reply {
    // Refused before the passphrase is looked at (or even read).
    if let Err(limited) = admin.signin.borrow().check(peer.ip(), Instant::now()) {
        let whose = if limited.shared {
            "from too many addresses at once"
        } else {
            "from this address"
        };
        let secs = limited.retry_after.as_secs().max(1);
        info!(%peer, "admin page: sign-in refused, over limits.admin_signin_failures_per_minute");
        let n = format!(
            "Too many wrong passphrases {whose} (limits.admin_signin_failures_per_minute). \
             Try again in {secs} s."
        );
        let mut reply = signin_page(
            admin,
            StatusCode::TOO_MANY_REQUESTS,
            &Notice::Bad(&n),
            secure,
        );
        reply
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return reply;
    }
    let pre = session::cookie(req.headers(), session::PRE_COOKIE).map(str::to_owned);
    let form = match read_form(admin, req).await {
        Ok(f) => f,
        Err(r) => return refused(admin, r, secure),
    };
    if !pre.is_some_and(|p| session::same(&p, form.get("pre"))) {
        return refused(admin, Refusal::BadCsrf, secure);
    }
    if !verify(admin, owner, form.get("passphrase")).await {
        admin.signin.borrow_mut().fail(peer.ip(), Instant::now());
        info!(%peer, "admin page: wrong passphrase");
        return signin_page(
            admin,
            StatusCode::UNAUTHORIZED,
            &Notice::Bad("That passphrase is not right."),
            secure,
        );
    }
    admin.signin.borrow_mut().succeed(peer.ip(), Instant::now());
    info!(%peer, "admin page: owner signed in");
    let id = admin
        .sessions
        .borrow_mut()
        .create(owner.stamp(), Instant::now());
    let mut reply = redirect(PREFIX);
    set_cookies(
        &mut reply,
        &[
            session::set_cookie(session::COOKIE, &id, secure),
            session::set_cookie(session::PRE_COOKIE, "", secure),
        ],
    );
    reply
}

/// The signed-in pages (GET): each renders fresh state, nothing is cached.
async fn get(
    admin: &Admin,
    hub: &Rc<Hub>,
    path: &str,
    csrf: &str,
    secure: bool,
) -> Result<Reply, Refusal> {
    let ok = |title: &str, body: String| {
        Ok(page(
            admin,
            StatusCode::OK,
            title,
            path,
            Some(csrf),
            secure,
            &body,
        ))
    };
    match path {
        PREFIX => ok("Status", pages::status(&hub.status_report(), &Notice::None)),
        "/admin/devices" => ok("Devices", devices_body(hub, csrf, &Notice::None)?),
        "/admin/agent" => ok("Agent", agent_body(admin, csrf, &Notice::None)),
        "/admin/push" => ok("Push", push_body(admin, hub, csrf, &Notice::None)?),
        "/admin/backup" => ok("Backup", pages::backup(csrf, &Notice::None)),
        "/admin/log" => ok("Log", pages::log(&crate::logring::lines())),
        "/admin/owner" => ok("Owner", pages::owner(csrf, &Notice::None)),
        _ => Err(Refusal::NotFound),
    }
}

/// The devices section with the store's devices, oldest first.
fn devices_body(hub: &Hub, csrf: &str, n: &Notice) -> Result<String, Refusal> {
    let mut list = hub
        .store()
        .devices()
        .map_err(|e| Refusal::Unavailable(e.to_string()))?;
    list.sort_by_key(|d| d.created_ms);
    Ok(pages::devices(&list, &hub.connected_devices(), csrf, n))
}

/// The agent section: what is in effect now (never the key), and what flags pin.
fn agent_body(admin: &Admin, csrf: &str, n: &Notice) -> String {
    let config = admin.config.borrow();
    let a = &config.agent;
    let view = pages::AgentView {
        backend: &a.backend,
        url: &a.url,
        model: &a.model,
        key_set: !a.key.is_empty() || a.key_file.is_some(),
        pinned: admin
            .pinned
            .iter()
            .copied()
            .filter(|k| k.starts_with("agent."))
            .collect(),
        describe: admin.agent.describe(),
    };
    pages::agent(&view, csrf, n)
}

/// The push section: what runs now, and the saved settings (they apply at the next start).
fn push_body(admin: &Admin, hub: &Hub, csrf: &str, n: &Notice) -> Result<String, Refusal> {
    let saved = Settings::load(&admin.data_dir).map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let mut config = admin.config.borrow().clone();
    saved.apply(&mut config);
    let p = &config.push;
    let report = hub.status_report();
    let running = match &report.push_error {
        Some(e) => format!("{}, failing: {e}", report.push),
        None => report.push.clone(),
    };
    let targets: Vec<_> = hub
        .store()
        .devices()
        .map_err(|e| Refusal::Unavailable(e.to_string()))?
        .into_iter()
        .filter(|d| d.ntfy_topic.is_some() || d.fcm_token.is_some())
        .collect();
    let view = pages::PushView {
        running: &running,
        backend: &p.backend,
        ntfy_server: &p.ntfy_server,
        token_set: p.ntfy_token.is_some() || p.ntfy_token_file.is_some(),
        content: &p.content,
        pinned: admin
            .pinned
            .iter()
            .copied()
            .filter(|k| k.starts_with("push."))
            .collect(),
    };
    Ok(pages::push(&view, &targets, csrf, n))
}

/// The signed-in forms (POST), after their CSRF token was checked: each does one thing and
/// answers with the section it belongs to.
#[allow(clippy::too_many_arguments)]
async fn post(
    admin: &Admin,
    hub: &Rc<Hub>,
    owner: &owner::Owner,
    path: &str,
    form: &Form,
    csrf: &str,
    peer: SocketAddr,
    secure: bool,
) -> Result<Reply, Refusal> {
    let show = |status: StatusCode, title: &str, current: &str, body: String| {
        Ok(page(
            admin,
            status,
            title,
            current,
            Some(csrf),
            secure,
            &body,
        ))
    };
    let unavailable = |e: &dyn std::fmt::Display| Refusal::Unavailable(e.to_string());
    match path {
        "/admin/signout" => {
            admin.sessions.borrow_mut().end_all();
            info!(%peer, "admin page: signed out (every session ended)");
            let mut reply = redirect(PREFIX);
            set_cookies(
                &mut reply,
                &[session::set_cookie(session::COOKIE, "", secure)],
            );
            Ok(reply)
        }
        "/admin/passphrase" => {
            let (new, confirm) = (form.get("passphrase"), form.get("confirm"));
            let bad = |t: &str| {
                show(
                    StatusCode::BAD_REQUEST,
                    "Owner",
                    "/admin/owner",
                    pages::owner(csrf, &Notice::Bad(t)),
                )
            };
            if new != confirm {
                return bad("The two new passphrases differ.");
            }
            if let Err(e) = owner::check_new(new) {
                return bad(&e.to_string());
            }
            if !verify(admin, owner, form.get("current")).await {
                admin.signin.borrow_mut().fail(peer.ip(), Instant::now());
                return bad("The current passphrase is not right.");
            }
            let fresh = hash_new(admin, new).await.map_err(|e| unavailable(&e))?;
            owner::store(&admin.data_dir, &fresh).map_err(|e| unavailable(&e))?;
            admin.sessions.borrow_mut().end_all();
            info!(%peer, "admin page: passphrase changed (every session ended)");
            let mut reply = signin_page(
                admin,
                StatusCode::OK,
                &Notice::Good("Passphrase changed. Sign in with the new one."),
                secure,
            );
            set_cookies(
                &mut reply,
                &[session::set_cookie(session::COOKIE, "", secure)],
            );
            Ok(reply)
        }
        "/admin/devices/pair" => {
            let name = form.get("name").trim();
            let (device, token) = hub.pair(name).await.map_err(|e| unavailable(&e))?;
            let inv = Invitation::new(&admin.url, &token, admin.tls.as_ref());
            show(
                StatusCode::OK,
                "Pair a phone",
                "/admin/devices",
                pages::invitation(&inv, &device.device_id, "Pair the phone with:"),
            )
        }
        "/admin/devices/rename" => {
            let id = form.get("device_id");
            let found = hub
                .rename_device(id, form.get("name").trim())
                .await
                .map_err(|e| unavailable(&e))?;
            if !found {
                return Err(Refusal::BadInput(format!("no device `{}`", cut(id))));
            }
            let n = Notice::Good("Renamed.");
            show(
                StatusCode::OK,
                "Devices",
                "/admin/devices",
                devices_body(hub, csrf, &n)?,
            )
        }
        "/admin/devices/revoke" => {
            let id = form.get("device_id");
            let existed = hub.revoke(id).await.map_err(|e| unavailable(&e))?;
            if !existed {
                return Err(Refusal::BadInput(format!("no device `{}`", cut(id))));
            }
            let n = Notice::Good("Revoked: its token no longer works and it was disconnected.");
            show(
                StatusCode::OK,
                "Devices",
                "/admin/devices",
                devices_body(hub, csrf, &n)?,
            )
        }
        "/admin/agent" | "/admin/agent/test" => {
            let test = path.ends_with("/test");
            let (config, saved) = agent_from_form(admin, form)?;
            let agent = match crate::agent::from_config(&config) {
                Ok(a) => a,
                Err(e) => {
                    let n = format!("Not usable: {e}");
                    return show(
                        StatusCode::BAD_REQUEST,
                        "Agent",
                        "/admin/agent",
                        agent_body(admin, csrf, &Notice::Bad(&n)),
                    );
                }
            };
            if test {
                let seen = test_agent(agent.as_ref()).await;
                let n = match &seen {
                    Ok(t) => Notice::Good(t),
                    Err(t) => Notice::Bad(t),
                };
                return show(
                    StatusCode::OK,
                    "Agent",
                    "/admin/agent",
                    agent_body(admin, csrf, &n),
                );
            }
            saved.save(&admin.data_dir).map_err(|e| unavailable(&e))?;
            admin.agent.replace(agent);
            *admin.config.borrow_mut() = config;
            hub.agent_switched();
            info!(%peer, agent = %admin.agent.describe(), "admin page: agent settings saved; new turns use them");
            let n = Notice::Good("Saved: new messages go to this agent.");
            show(
                StatusCode::OK,
                "Agent",
                "/admin/agent",
                agent_body(admin, csrf, &n),
            )
        }
        "/admin/push" => {
            let mut saved = Settings::load(&admin.data_dir).map_err(|e| unavailable(&e))?;
            let backend = form.get("backend");
            if !matches!(backend, "none" | "ntfy" | "fcm") {
                return Err(Refusal::BadInput(
                    "backend must be none, ntfy or fcm".into(),
                ));
            }
            let content = form.get("content");
            if !matches!(content, "full" | "preview" | "title" | "none") {
                return Err(Refusal::BadInput(
                    "content must be full, preview, title or none".into(),
                ));
            }
            let server = checked_url(form.get("ntfy_server"), "the ntfy server")?;
            let token = form.get("ntfy_token");
            if token.len() > MAX_KEY_BYTES {
                return Err(Refusal::BadInput(format!(
                    "the token is over {MAX_KEY_BYTES} bytes"
                )));
            }
            saved.push.backend = Some(backend.to_owned());
            saved.push.content = Some(content.to_owned());
            if !server.is_empty() {
                saved.push.ntfy_server = Some(server.to_owned());
            }
            if !token.is_empty() {
                saved.push.ntfy_token = Some(Hidden(token.to_owned()));
            }
            saved.save(&admin.data_dir).map_err(|e| unavailable(&e))?;
            info!(%peer, "admin page: push settings saved (they apply at the next start)");
            let n = Notice::Good(
                "Saved. Push settings apply when the gateway restarts (Restart now, below).",
            );
            show(
                StatusCode::OK,
                "Push",
                "/admin/push",
                push_body(admin, hub, csrf, &n)?,
            )
        }
        "/admin/restart" => {
            info!(%peer, "admin page: restart asked for");
            schedule_restart(admin);
            Ok(page(
                admin,
                StatusCode::OK,
                "Restarting",
                "",
                None,
                secure,
                &pages::message(
                    "The gateway restarts now, with the saved settings; phones reconnect by \
                     themselves. Sign in again in a moment.",
                    &Notice::Good("Restarting."),
                ),
            ))
        }
        "/admin/push/test" => {
            let n = match hub.test_push(form.get("device_id")) {
                Ok(place) => format!("Test push queued to {place}. Status says if it fails."),
                Err(e) => format!("No test push: {e}"),
            };
            let notice = if n.starts_with("Test") {
                Notice::Good(&n)
            } else {
                Notice::Bad(&n)
            };
            show(
                StatusCode::OK,
                "Push",
                "/admin/push",
                push_body(admin, hub, csrf, &notice)?,
            )
        }
        _ => Err(Refusal::NotFound),
    }
}

/// At most 64 characters of something a client sent, for a message.
fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

/// An http(s) URL from a form, or empty; refused otherwise.
fn checked_url<'a>(url: &'a str, what: &str) -> Result<&'a str, Refusal> {
    let url = url.trim();
    if url.len() > MAX_URL_BYTES {
        return Err(Refusal::BadInput(format!(
            "{what} URL is over {MAX_URL_BYTES} bytes"
        )));
    }
    if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
        return Err(Refusal::BadInput(format!(
            "{what} URL must start with http:// or https://"
        )));
    }
    Ok(url)
}

/// The configuration the agent form asks for (flags still win), and the settings to save.
fn agent_from_form(admin: &Admin, form: &Form) -> Result<(Config, Settings), Refusal> {
    let backend = form.get("backend");
    if !matches!(backend, "demo" | "hermes" | "openai") {
        return Err(Refusal::BadInput(
            "backend must be demo, hermes or openai".into(),
        ));
    }
    let url = checked_url(form.get("url"), "the agent")?;
    let model = form.get("model").trim();
    let key = form.get("key");
    if model.len() > MAX_MODEL_BYTES || key.len() > MAX_KEY_BYTES {
        return Err(Refusal::BadInput(format!(
            "the model is at most {MAX_MODEL_BYTES} bytes and the key {MAX_KEY_BYTES}"
        )));
    }
    let mut saved =
        Settings::load(&admin.data_dir).map_err(|e| Refusal::Unavailable(e.to_string()))?;
    saved.agent.backend = Some(backend.to_owned());
    saved.agent.url = Some(url.to_owned());
    saved.agent.model = Some(model.to_owned());
    if form.get("clear_key") == "1" {
        saved.agent.key = Some(Hidden(String::new()));
    } else if !key.is_empty() {
        saved.agent.key = Some(Hidden(key.trim().to_owned()));
    }
    let old = admin.config.borrow().clone();
    let mut config = old.clone();
    saved.apply(&mut config);
    // A flag outranks the page: put back what each flag set.
    for key in admin.pinned.iter() {
        match *key {
            "agent.backend" => config.agent.backend = old.agent.backend.clone(),
            "agent.url" => config.agent.url = old.agent.url.clone(),
            "agent.key" => {
                config.agent.key = old.agent.key.clone();
                config.agent.key_file = old.agent.key_file.clone();
            }
            "agent.model" => config.agent.model = old.agent.model.clone(),
            _ => {}
        }
    }
    Ok((config, saved))
}

/// What the gateway sees of an agent: reachable with our key, and its models when it lists them.
async fn test_agent(agent: &dyn Agent) -> Result<String, String> {
    match tokio::time::timeout(TEST_TIMEOUT, agent.probe()).await {
        Err(_) => return Err(format!("no answer within {} s", TEST_TIMEOUT.as_secs())),
        Ok(Err(e)) => return Err(format!("{}: {e}", agent.describe())),
        Ok(Ok(())) => {}
    }
    let models = match tokio::time::timeout(TEST_TIMEOUT, agent.models()).await {
        Ok(Ok(m)) if !m.is_empty() => {
            let shown: Vec<_> = m.iter().take(10).map(String::as_str).collect();
            format!("; models: {}", shown.join(", "))
        }
        _ => String::new(),
    };
    Ok(format!("{}: reachable{models}", agent.describe()))
}

/// The set-up page, with a fresh double-submit token in its cookie and its form.
fn setup_page(admin: &Admin, status: StatusCode, n: &Notice, secure: bool) -> Reply {
    let pre = session::random_token();
    let mut reply = page(
        admin,
        status,
        "Set up this gateway",
        "",
        None,
        secure,
        &pages::setup(&pre, n),
    );
    set_cookies(
        &mut reply,
        &[session::set_cookie(session::PRE_COOKIE, &pre, secure)],
    );
    reply
}

/// The sign-in page, with a fresh double-submit token in its cookie and its form.
fn signin_page(admin: &Admin, status: StatusCode, n: &Notice, secure: bool) -> Reply {
    let pre = session::random_token();
    let mut reply = page(
        admin,
        status,
        "Sign in",
        "",
        None,
        secure,
        &pages::signin(&pre, n),
    );
    set_cookies(
        &mut reply,
        &[session::set_cookie(session::PRE_COOKIE, &pre, secure)],
    );
    reply
}

/// The page for a refusal, with its status.
fn refused(admin: &Admin, r: Refusal, secure: bool) -> Reply {
    let status = r.status();
    let text = r.to_string();
    let body = match r {
        Refusal::NoSession => format!(
            "{}<p><a href=\"{PREFIX}\">Sign in</a></p>",
            pages::message(&text, &Notice::None)
        ),
        _ => pages::message(&text, &Notice::Bad(&text)),
    };
    page(admin, status, "Not done", "", None, secure, &body)
}

/// A whole page with the headers every admin answer carries.
fn page(
    admin: &Admin,
    status: StatusCode,
    title: &str,
    current: &str,
    csrf: Option<&str>,
    secure: bool,
    body: &str,
) -> Reply {
    let html = pages::document(title, current, csrf, &admin.frame(secure), body);
    let mut reply = Response::new(Full::new(Bytes::from(html)));
    *reply.status_mut() = status;
    guard(&mut reply, "text/html; charset=utf-8");
    reply
}

/// Headers every admin answer carries.
fn guard(reply: &mut Reply, content_type: &'static str) {
    let h = reply.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// The embedded stylesheet or script.
fn asset(content_type: &'static str, body: &'static str) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    guard(&mut reply, content_type);
    reply
}

/// `303 See Other` to an admin path (after a POST, or to sign in).
fn redirect(to: &'static str) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::new()));
    *reply.status_mut() = StatusCode::SEE_OTHER;
    guard(&mut reply, "text/plain; charset=utf-8");
    reply
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    reply
}

/// Adds `Set-Cookie` headers (one per cookie, as browsers need them).
fn set_cookies(reply: &mut Reply, cookies: &[String]) {
    for c in cookies {
        if let Ok(v) = HeaderValue::from_str(c) {
            reply.headers_mut().append(header::SET_COOKIE, v);
        }
    }
}

/// The https address of the admin page when TLS is on (for what `run` prints).
pub fn address(url: &str, tls: Option<&crate::tls::Advert>) -> String {
    match tls {
        Some(t) => https_of(&t.url),
        None => format!("{}{PREFIX}", url.replacen("ws://", "http://", 1)),
    }
}
