//! The admin web app on the gateway's own port: first-run set-up (claim the box with an owner
//! passphrase), sign-in, and the owner's pages (status, devices, agent, push, backup, log).
//!
//! It is a door into the house, so (docs/security.md, "The admin page"):
//! - the passphrase is kept only as an Argon2id hash (`owner.rs`), checked on a blocking thread
//!   one at a time, and wrong ones are limited per address and in all by the same rotation-proof
//!   counter as the hello gate (`guessing.rs`: no reset by a success), each attempt counted
//!   before its hash runs so attempts sent together cannot all be checked; the
//!   change-passphrase form shares that count;
//! - the agent key, the transcription key and the ntfy token go only to the address they were saved for (`forms.rs`);
//! - a session is a random cookie (`HttpOnly`, `SameSite=Strict`, `Secure` over https) in a
//!   bounded table that forgets it when idle, old, signed out or the passphrase changes
//!   (`session.rs`); every POST carries the session's CSRF token (before a session: a
//!   double-submit token in a `SameSite=Strict` cookie);
//! - every answer is `no-store`, with a CSP that allows only this box's own stylesheet and
//!   script (no inline script or style, nothing from outside, no framing), and every form body
//!   is bounded by `limits.admin_max_form_bytes`;
//! - secrets (the agent key, the transcription key, the ntfy token, device tokens after their one showing) are never
//!   rendered, and the passphrase is never logged.
//!
//! Routes live under `/admin/`; a browser's `GET /` is sent here. What it changes goes through
//! the hub (devices), the switchable agent (agent settings, applied to the next turn) and the
//! data dir's `settings.toml` (`crate::settings`), so flags and the config file keep their
//! place in the order.

mod backups;
mod forms;
mod log_page;
pub mod owner;
mod pages;
mod reply;
pub mod session;
mod transfer;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tracing::{info, warn};

use crate::agent::{Agent, Switchable};
use crate::config::Config;
use crate::guessing::GuessLimiter;
use crate::hub::Hub;
use crate::pairing::Invitation;
use crate::settings::Settings;
pub use backups::start_schedule;
use forms::post;
use pages::{Notice, Shell};
pub use reply::Body;
use reply::{
    asset, page, redirect, refused, set_cookies, setup_page, signin_page, whole, Refusal, Reply,
    CSS, JS,
};
use session::Sessions;
pub use transfer::{is_transfer, RESTORE_STORE_ALLOWANCE, TRANSFER_TIMEOUT};

/// Every admin path starts with this.
pub const PREFIX: &str = "/admin/";
/// Source addresses whose wrong passphrases are counted one by one; past them, the rest share
/// one count (`guessing.rs`), so at most 17 × `admin_signin_failures_per_minute` a minute.
const SIGNIN_TABLE: usize = 16;

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
    /// A restore upload is being received or checked: one at a time (`transfer.rs`).
    restoring: std::cell::Cell<bool>,
    /// The scheduled backups: one at a time, and how the last went (`backups.rs`).
    backups: Rc<crate::backups::State>,
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
            restoring: std::cell::Cell::new(false),
            backups: Rc::default(),
            url,
            tls,
        }
    }

    fn shell(&self, secure: bool) -> Shell<'_> {
        Shell {
            secure,
            https: self.https.as_deref().filter(|_| !secure),
            fingerprint: self.tls.as_ref().map(|t| t.fingerprint.as_str()),
        }
    }

    /// The session the request's cookie names, if it is still the owner's: the pages and the
    /// transfers ask the same question, so a change to what a session needs is made once.
    fn signed_in(
        &self,
        headers: &hyper::HeaderMap,
        owner: &owner::Owner,
    ) -> Option<session::Valid> {
        let id = session::cookie(headers, session::COOKIE)?;
        self.sessions
            .borrow_mut()
            .check(id, owner.stamp(), Instant::now())
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
    transfer::serve(admin, hub, req, peer, secure).await
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
    let query = req.uri().query().unwrap_or("").to_owned();
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
    let Some(valid) = admin.signed_in(req.headers(), &owner) else {
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
        Method::GET | Method::HEAD => match path.as_str() {
            "/admin/backup" => backups::get(admin, &query, &csrf, secure),
            "/admin/log" | "/admin/log/download" => {
                log_page::get(admin, &path, &query, &csrf, secure)
            }
            _ => get(admin, hub, &path, &csrf, secure).await,
        },
        Method::POST => {
            let form = match read_form(admin, req).await {
                Ok(f) => f,
                Err(r) => return refused(admin, r, secure),
            };
            if !session::same(form.get("csrf"), &csrf) {
                info!(%peer, path, "admin page: CSRF token missing or wrong; nothing done");
                return refused(admin, Refusal::BadCsrf, secure);
            }
            match backups::post(admin, hub, &path, &form, &csrf, secure).await {
                Some(done) => done,
                None => match log_page::post(admin, &path, &form, &csrf, secure) {
                    Some(done) => done,
                    None => post(admin, hub, &owner, &path, &form, &csrf, peer, secure).await,
                },
            }
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
    // Refused before the passphrase is read, when the limit is already spent.
    if let Err(limited) = admin.signin.borrow().check(peer.ip(), Instant::now()) {
        return signin_limited(admin, limited, peer, secure);
    }
    let pre = session::cookie(req.headers(), session::PRE_COOKIE).map(str::to_owned);
    let form = match read_form(admin, req).await {
        Ok(f) => f,
        Err(r) => return refused(admin, r, secure),
    };
    if !pre.is_some_and(|p| session::same(&p, form.get("pre"))) {
        return refused(admin, Refusal::BadCsrf, secure);
    }
    // Counted now, before the hash: attempts in flight together are counted as they begin,
    // so no more than the limit ever reach `verify` (`guessing.rs`).
    let begun = admin.signin.borrow_mut().begin(peer.ip(), Instant::now());
    let attempt = match begun {
        Ok(a) => a,
        Err(limited) => return signin_limited(admin, limited, peer, secure),
    };
    if !verify(admin, owner, form.get("passphrase")).await {
        info!(%peer, "admin page: wrong passphrase");
        return signin_page(
            admin,
            StatusCode::UNAUTHORIZED,
            &Notice::Bad("That passphrase is not right."),
            secure,
        );
    }
    admin.signin.borrow_mut().succeeded(attempt, Instant::now());
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

/// What a refusal by the passphrase limit says: why, and when to try again (`Retry-After`).
/// The page is for the owner, so it names no config key; the log line does.
fn limited_notice(
    limited: crate::guessing::Limited,
    peer: SocketAddr,
    door: &str,
) -> (String, u64) {
    let whose = if limited.shared {
        "from too many addresses at once"
    } else {
        "from this address"
    };
    let secs = limited.retry_after.as_secs().max(1);
    info!(%peer, "admin page: {door} refused, over limits.admin_signin_failures_per_minute");
    let n = format!(
        "Too many wrong passphrases {whose}. For safety, passphrases are not checked for a \
         while: try again in {secs} s."
    );
    (n, secs)
}

fn signin_limited(
    admin: &Admin,
    limited: crate::guessing::Limited,
    peer: SocketAddr,
    secure: bool,
) -> Reply {
    let (n, secs) = limited_notice(limited, peer, "sign-in");
    let mut reply = signin_page(
        admin,
        StatusCode::TOO_MANY_REQUESTS,
        &Notice::Bad(&n),
        secure,
    );
    retry_after(&mut reply, secs);
    reply
}

fn retry_after(reply: &mut Reply, secs: u64) {
    reply
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
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
        "/admin/agent" => ok(
            "Agent",
            agent_body(admin, hub, csrf, &Notice::None, &Notice::None),
        ),
        "/admin/push" => ok("Push", push_body(admin, hub, csrf, &Notice::None)?),
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

/// The agent section: what is in effect now (never the key), and what flags pin; then the
/// transcription section (`nt` its notice).
fn agent_body(admin: &Admin, hub: &Hub, csrf: &str, n: &Notice, nt: &Notice) -> String {
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
        files: if a.backend == "demo" {
            "The demo agent answers a message that has files with a small text file.".to_owned()
        } else {
            crate::agent::media_out::FilePolicy::from_config(&config).describe()
        },
    };
    let t = &config.transcription;
    let transcription = pages::TranscriptionView {
        url: &t.url,
        model: &t.model,
        language: &t.language,
        key_set: !t.key.is_empty() || t.key_file.is_some(),
        now: hub.transcription_service(),
    };
    pages::agent(&view, csrf, n) + &pages::transcription(&transcription, csrf, nt)
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

/// The https address of the admin page when TLS is on (for what `run` prints).
pub fn address(url: &str, tls: Option<&crate::tls::Advert>) -> String {
    match tls {
        Some(t) => https_of(&t.url),
        None => format!("{}{PREFIX}", url.replacen("ws://", "http://", 1)),
    }
}
