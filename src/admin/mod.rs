//! The admin web app on the gateway's own port: first-run set-up (claim the box with an owner
//! passphrase), sign-in, and the owner's pages (status, devices, agent, push, backup, log).
//!
//! It is a door into the house, so (docs/security.md, "The admin page"):
//! - the passphrase is kept only as an Argon2id hash (`owner.rs`), checked on a blocking thread
//!   one at a time, and wrong ones are limited per address and in all by the same rotation-proof
//!   counter as the hello gate (`guessing.rs`: no reset by a success), each attempt counted
//!   before its hash runs so attempts sent together cannot all be checked; the
//!   change-passphrase form shares that count;
//! - the agent key, the transcription and speech keys and the ntfy token go only to the address they were saved for (`forms.rs`);
//! - a session is a random cookie (`HttpOnly`, `SameSite=Strict`, `Secure` over https) in a
//!   bounded table that forgets it when idle, old, signed out or the passphrase changes
//!   (`session.rs`); every POST carries the session's CSRF token (before a session: a
//!   double-submit token in a `SameSite=Strict` cookie, which set-up and the strength meter
//!   also need to be one the gateway signed, `session::SetupTokens`);
//! - every answer is `no-store`, with a CSP that allows only this box's own stylesheet and
//!   script (no inline script or style, nothing from outside, no framing), and every form body
//!   is bounded by `limits.admin_max_form_bytes`;
//! - secrets (the agent key, the transcription key, the ntfy token, the FCM key, device tokens
//!   after their one showing) are never rendered, and the passphrase is never logged.
//!
//! Routes live under `/admin/`; a browser's `GET /` is sent here. What it changes goes through
//! the hub (devices), the switchable agent (agent settings, applied to the next turn) and the
//! data dir's `settings.toml` (`crate::settings`), so flags and the config file keep their
//! place in the order.

mod backups;
mod context;
mod effective;
mod forms;
mod health;
mod jobs;
mod log_page;
mod multipart;
mod outcome;
pub mod owner;
mod pages;
mod passphrase_rule;
mod power;
mod receive;
mod reply;
mod restore_job;
mod route;
mod sections;
pub mod session;
mod speech;
mod strength;
mod transfer;
mod updates;
mod words;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use maud::Markup;
use tracing::{info, warn};

use crate::agent::Switchable;
use crate::config::Config;
use crate::guessing::GuessLimiter;
use crate::hub::Hub;
use crate::pairing::Invitation;
use context::{Ctx, Gate, SignedIn};
use forms::post;
pub use health::start_sampling;
use outcome::{Outcome, Paired, Tone};
use pages::{Notice, Shell};
pub use reply::Body;
use reply::{
    asset, page, redirect, redirect_to, refused, refused_page, safe_next, sentence, set_cookies,
    setup_page, signed_page, signin_page, whole, Refusal, Reply, CSS, JS,
};
use route::Route;
pub use route::PREFIX;
use sections::{agent_body, devices_body, push_body};
use session::Sessions;
pub use transfer::{is_transfer, RESTORE_STORE_ALLOWANCE, TRANSFER_TIMEOUT};
pub use updates::CheckHost;

/// The name of the device paired right after the claim, until the owner renames it.
const CLAIM_DEVICE_NAME: &str = "Phone paired at set-up";
/// Source addresses whose wrong passphrases are counted one by one; past them, the rest share
/// one count (`guessing.rs`), so at most 17 × `admin_signin_failures_per_minute` a minute.
const SIGNIN_TABLE: usize = 16;

/// The admin app's state: sessions, the sign-in limiter, and what it needs to change settings.
pub struct Admin {
    data_dir: PathBuf,
    sessions: RefCell<Sessions>,
    signin: RefCell<GuessLimiter<SIGNIN_TABLE>>,
    /// One Argon2 hash at a time (each takes 19 MiB and a second of a Pi's CPU). The hashing
    /// thread holds the permit until it is done: a request given up meanwhile (its connection
    /// closed) must not let a second hash start beside the first.
    hashing: std::sync::Arc<tokio::sync::Semaphore>,
    agent: Rc<Switchable>,
    /// The effective configuration (file, saved settings, flags), updated by what is saved.
    config: effective::Effective,
    /// What flags set: saved settings never override it.
    pinned: crate::config::Pinned,
    /// The plain URL and the TLS advert, as `pair` reports them: what a pairing QR carries.
    url: String,
    tls: Option<crate::tls::Advert>,
    /// `https://HOST:PORT/admin/` when TLS is on: what a plain page's warning points to.
    https: Option<String>,
    /// Asks `run` to stop and start again (after a restore was uploaded).
    pub restart: Rc<tokio::sync::Notify>,
    /// The long work started from the pages, one of a kind at a time (`jobs.rs`).
    jobs: Rc<jobs::Jobs>,
    /// The passphrase meter's checks this minute, over all browsers (`strength.rs`).
    meter_checks: strength::Window,
    /// Signs the set-up page's tokens, so only ones it issued pass (`session.rs`).
    setup_tokens: session::SetupTokens,
    /// The backups wing: one backup at a time, and how the last went (`backups.rs`).
    backups: Rc<crate::backups::Backups>,
    /// The last check for a newer version, made by the update wing's daily check or asked for
    /// on the Update page (`updates.rs`).
    update_checks: crate::update::checks::Checks,
    /// The Status page's last 24 hours of figures, in memory only (`health.rs`).
    day: Rc<health::Day>,
}

/// Marks a request read in full (at once for a GET or a transfer, after its form for a POST):
/// the front's request deadline bounds reading a request, never the answer's own work (a sign-in's
/// hash), so from then on it gives way to the transfer bound (`front/http.rs`). The front puts
/// one in each admin request's extensions.
#[derive(Clone, Default)]
pub struct RequestRead(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl RequestRead {
    /// A new request on the connection: not read yet.
    pub fn begin(&self) {
        self.0.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_read(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn done<B>(req: &Request<B>) {
        if let Some(r) = req.extensions().get::<RequestRead>() {
            r.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
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
        backups: Rc<crate::backups::Backups>,
    ) -> Admin {
        let l = &config.limits;
        let mut sessions = Sessions::new(
            l.admin_max_sessions,
            Duration::from_secs(l.admin_session_idle_secs),
            Duration::from_secs(l.admin_session_max_secs),
        );
        match sessions.load(&data_dir, Instant::now(), crate::ids::now_ms()) {
            Ok(0) => {}
            Ok(n) => info!(n, "admin page: sessions kept over the restart"),
            Err(e) => warn!("admin page: {e}; the owner signs in again"),
        }
        Admin {
            sessions: RefCell::new(sessions),
            signin: RefCell::new(GuessLimiter::new(
                l.admin_signin_failures_per_minute,
                Instant::now(),
            )),
            hashing: std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
            data_dir,
            agent,
            config: effective::Effective::new(config),
            pinned,
            https: tls.as_ref().map(|t| https_of(&t.url)),
            restart: Rc::new(tokio::sync::Notify::new()),
            jobs: Rc::default(),
            meter_checks: strength::Window::new(Instant::now()),
            setup_tokens: session::SetupTokens::new(),
            backups,
            update_checks: Default::default(),
            day: Rc::default(),
            url,
            tls,
        }
    }

    /// At shutdown: keeps the live sessions for the next start (`session.rs`), so a restart
    /// or a reboot does not sign the owner out.
    pub fn save_sessions(&self) {
        let saved =
            self.sessions
                .borrow_mut()
                .save(&self.data_dir, Instant::now(), crate::ids::now_ms());
        if let Err(e) = saved {
            warn!("admin page: cannot keep the sessions over the restart: {e}");
        }
    }

    /// The last check's answer, shared with the daily check the server starts
    /// (`update::checks::start`).
    pub fn update_checks(&self) -> crate::update::checks::Checks {
        self.update_checks.clone()
    }

    fn shell(&self, ctx: Ctx) -> Shell<'_> {
        let channel = ctx.channel();
        Shell {
            channel,
            https: self.https.as_deref().filter(|_| !channel.is_encrypted()),
            fingerprint: self.tls.as_ref().map(|t| t.fingerprint.as_str()),
        }
    }

    fn max_form(&self) -> usize {
        self.config.read(|c| c.limits.admin_max_form_bytes)
    }
}

/// Where the https address of the page is, for a plain page's warning: `wss://` → `https://`.
fn https_of(url: &str) -> String {
    format!("{}{PREFIX}", url.replacen("wss://", "https://", 1))
}

/// Serves one request under [`PREFIX`] (or a browser's `GET /`), which came over `channel`.
pub async fn serve(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    peer: SocketAddr,
    channel: crate::web::Channel,
) -> Response<Body> {
    let ctx = Ctx::new(peer, channel);
    if is_transfer(&req) || matches!(*req.method(), Method::GET | Method::HEAD) {
        RequestRead::done(&req);
    }
    if !is_transfer(&req) {
        return whole(serve_page(admin, hub, req, ctx).await);
    }
    transfer::serve(admin, hub, req, ctx).await
}

/// Everything but the two transfers: set-up, sign-in, then the signed-in pages and forms.
async fn serve_page(admin: &Admin, hub: &Rc<Hub>, req: Request<Incoming>, ctx: Ctx) -> Reply {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let route = Route::parse(&path);
    match (&method, &route) {
        (&Method::GET, Some(Route::Css)) => return asset("text/css", CSS),
        (&Method::GET, Some(Route::Js)) => return asset("text/javascript", JS),
        (_, Some(Route::Entry)) => return redirect_to(&Route::Home),
        (&Method::POST, Some(Route::Strength)) => {
            return strength::serve(admin, hub, req, ctx).await
        }
        _ => {}
    }
    let (owner, who) = match Gate::of(admin, req.headers(), ctx) {
        Gate::Unreadable(e) => {
            warn!("admin page: {e}");
            return page(
                admin,
                StatusCode::INTERNAL_SERVER_ERROR,
                "Owner unreadable",
                "",
                None,
                ctx,
                pages::message(&e.to_string(), &Notice::None),
            );
        }
        Gate::Unclaimed => return unclaimed(admin, hub, req, route, ctx).await,
        Gate::SignedOut(owner) => (owner, None),
        Gate::SignedIn(owner, who) => (owner, Some(who)),
    };
    if method == Method::POST && route == Some(Route::SignIn) {
        return sign_in(admin, &owner, req, ctx).await;
    }
    if route == Some(Route::Setup) {
        return page(
            admin,
            StatusCode::CONFLICT,
            "Already claimed",
            "",
            None,
            ctx,
            pages::message(
                &format!(
                    "This gateway already has an owner. Sign in with the passphrase, or take it \
                     back at the box with {}.",
                    crate::hints::command("owner reset")
                ),
                &Notice::None,
            ),
        );
    }
    let query = parse_form(req.uri().query().unwrap_or("").as_bytes()).unwrap_or(Form(vec![]));
    let raw_query = req.uri().query().unwrap_or("").to_owned();
    let Some(who) = who else {
        if method == Method::GET || method == Method::HEAD {
            if route == Some(Route::Home) {
                let n = if query.get("changed") == "passphrase" {
                    Notice::Good("Passphrase changed. Sign in with the new one.")
                } else {
                    Notice::None
                };
                return signin_page(admin, StatusCode::OK, query.get("next"), &n, ctx);
            }
            // Signed in, the owner lands on the page asked for.
            return match safe_next(&path) {
                Some(next) => redirect(&format!("{PREFIX}?next={next}")),
                None => redirect_to(&Route::Home),
            };
        }
        return refused(admin, Refusal::NoSession, ctx);
    };
    let csrf = who.csrf();
    let this_device = session::cookie(req.headers(), pages::THIS_DEVICE_COOKIE).map(str::to_owned);
    let result = match method {
        Method::GET | Method::HEAD => match route {
            None => Err(Refusal::NotFound),
            Some(Route::Backup) => backups::get(admin, &raw_query, &who).await,
            Some(route @ (Route::Log | Route::LogDownload)) => {
                log_page::get(admin, &who, &route, &raw_query)
            }
            Some(route) => get(admin, hub, &who, &route, &query, this_device.as_deref()).await,
        },
        Method::POST => {
            let form = match read_form(admin, req).await {
                Ok(f) => f,
                Err(r) => return refused_page(admin, r, Some(csrf), ctx),
            };
            if !session::same(form.get("csrf"), csrf) {
                let peer = ctx.peer();
                info!(%peer, path, "admin page: CSRF token missing or wrong; nothing done");
                return refused(admin, Refusal::BadCsrf, ctx);
            }
            // An address nobody serves is said so once its form passed the checks every form
            // passes first.
            let Some(route) = route else {
                return refused_page(admin, Refusal::NotFound, Some(csrf), ctx);
            };
            // The backup and log forms answer for themselves; the rest leave their outcome in
            // the session for the page they redirect to.
            if let Some(done) = backups::post(admin, hub, &route, &form, &who).await {
                return done.unwrap_or_else(|r| refused(admin, r, ctx));
            }
            if let Some(done) = log_page::post(admin, &who, &route, &form) {
                return done.unwrap_or_else(|r| refused(admin, r, ctx));
            }
            if let Some(done) = updates::post(admin, hub, &who, &route, &form).await {
                return done.unwrap_or_else(|r| refused(admin, r, ctx));
            }
            let done = match power::post(admin, &who, &route).await {
                Some(r) => r,
                None => post(admin, hub, &owner, &who, &route, &form).await,
            };
            match (done, route.section()) {
                // A form that could not be done says so on its page, as one that was done.
                (
                    Err(
                        r @ (Refusal::BadInput(_) | Refusal::Unavailable(_) | Refusal::Conflict(_)),
                    ),
                    Some(section),
                ) => {
                    let to = redirect_to(&section);
                    let o = Outcome::new(section, Tone::Bad, sentence(&r.to_string()));
                    admin.sessions.borrow_mut().leave(who.key(), o);
                    Ok(to)
                }
                (done, _) => done,
            }
        }
        _ => Err(Refusal::NotFound),
    };
    match result {
        Ok(reply) => reply,
        Err(r) => refused_page(admin, r, Some(csrf), ctx),
    }
}

/// Reads a form body, refusing it past `limits.admin_max_form_bytes` (nothing more is buffered).
/// A `multipart/form-data` body (a form with a file) gives its fields the same way.
async fn read_form(admin: &Admin, req: Request<Incoming>) -> Result<Form, Refusal> {
    let read = req.extensions().get::<RequestRead>().cloned();
    let multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(multipart::boundary);
    let body = Limited::new(req.into_body(), admin.max_form())
        .collect()
        .await
        .map_err(|_| Refusal::TooLarge)?
        .to_bytes();
    if let Some(r) = read {
        r.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    match multipart {
        Some(boundary) => multipart::parse(&body, &boundary)
            .ok_or_else(|| Refusal::BadInput("the form is not a well-formed UTF-8 upload".into())),
        None => parse_form(&body).ok_or_else(|| Refusal::BadInput("the form is not UTF-8".into())),
    }
}

/// The box has no owner: set-up, and nothing else.
async fn unclaimed(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    route: Option<Route>,
    ctx: Ctx,
) -> Reply {
    let peer = ctx.peer();
    match (req.method().clone(), route) {
        (Method::POST, Some(Route::Setup)) => {}
        (Method::GET | Method::HEAD, Some(Route::Home)) => {
            return setup_page(admin, StatusCode::OK, &Notice::None, ctx)
        }
        (Method::GET | Method::HEAD, _) => return redirect_to(&Route::Home),
        _ => return refused(admin, Refusal::NoSession, ctx),
    }
    let pre = session::cookie(req.headers(), session::PRE_COOKIE).map(str::to_owned);
    let form = match read_form(admin, req).await {
        Ok(f) => f,
        Err(r) => return refused(admin, r, ctx),
    };
    // A token the set-up page issued, not only two matching copies: what follows costs an
    // estimate and a hash.
    if !pre.is_some_and(|p| session::same(&p, form.get("pre")) && admin.setup_tokens.issued(&p)) {
        return refused(admin, Refusal::BadCsrf, ctx);
    }
    let (pass, confirm) = (form.get("passphrase"), form.get("confirm"));
    if pass != confirm {
        let n = Notice::Bad("The two passphrases differ.");
        return setup_page(admin, StatusCode::BAD_REQUEST, &n, ctx);
    }
    let rated = strength::rate_for_setup(pass).await;
    if !rated.ok {
        let n = Notice::Bad(&rated.words);
        return setup_page(admin, StatusCode::BAD_REQUEST, &n, ctx);
    }
    // Set-ups sent together wait for the one hash at a time; once one of them has claimed
    // the box, the others are not hashed at all.
    let owner = match hash_new(admin, pass, Hashing::WhileUnclaimed).await {
        Ok(Some(o)) => o,
        Ok(None) => return redirect_to(&Route::Home),
        Err(e) => return refused(admin, Refusal::Unavailable(e), ctx),
    };
    match owner::claim(&admin.data_dir, &owner) {
        Ok(true) => {}
        Ok(false) => return redirect_to(&Route::Home),
        Err(e) => return refused(admin, Refusal::Unavailable(e.to_string()), ctx),
    }
    info!(%peer, "admin page: the gateway was claimed (owner passphrase set)");
    let id = admin
        .sessions
        .borrow_mut()
        .create(owner.stamp(), Instant::now());
    let key = admin
        .sessions
        .borrow_mut()
        .check(&id, owner.stamp(), Instant::now())
        .map(|v| v.key);
    // Right after claiming: pair the phone showing the page (or another one), shown once.
    let mut reply = match (hub.devices().pair(CLAIM_DEVICE_NAME).await, key) {
        (Ok((device, token)), Some(key)) => {
            let paired = Paired {
                device_id: device.device_id,
                token: zeroize::Zeroizing::new(token),
                intro: "The gateway is yours. Now pair this phone:",
            };
            let once = admin.sessions.borrow_mut().keep_paired(&key, paired);
            redirect(&format!("{}?id={once}", Route::Paired))
        }
        (Err(e), Some(key)) => {
            let text = format!(
                "The gateway is yours, but a phone could not be paired ({e}): pair one below."
            );
            let o = Outcome::new(Route::Devices, Tone::Warn, text);
            admin.sessions.borrow_mut().leave(&key, o);
            redirect_to(&Route::Devices)
        }
        (_, None) => redirect_to(&Route::Home),
    };
    set_cookies(
        &mut reply,
        &[
            ctx.cookie(session::COOKIE, &id),
            ctx.cookie(session::PRE_COOKIE, ""),
        ],
    );
    reply
}

/// When a new passphrase is still worth its hash.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hashing {
    /// The owner's change: always.
    Always,
    /// Set-up: only while the box is still unclaimed when its turn comes.
    WhileUnclaimed,
}

/// Hashes a new passphrase on a blocking thread, one at a time (the thread holds the turn);
/// `None` when set-up's turn came after the box was claimed.
async fn hash_new(
    admin: &Admin,
    passphrase: &str,
    when: Hashing,
) -> Result<Option<owner::Owner>, String> {
    let permit = admin
        .hashing
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| e.to_string())?;
    if when == Hashing::WhileUnclaimed && !matches!(owner::load(&admin.data_dir), Ok(None)) {
        return Ok(None);
    }
    let p = zeroize::Zeroizing::new(passphrase.to_owned());
    tokio::task::spawn_blocking(move || {
        let hashed = owner::hash(&p);
        drop(permit);
        hashed
    })
    .await
    .map_err(|e| e.to_string())?
    .map(Some)
    .map_err(|e| e.to_string())
}

/// Checks a passphrase on a blocking thread, one at a time (the thread holds the turn).
async fn verify(admin: &Admin, owner: &owner::Owner, passphrase: &str) -> bool {
    let Ok(permit) = admin.hashing.clone().acquire_owned().await else {
        return false;
    };
    let (o, p) = (
        owner.clone(),
        zeroize::Zeroizing::new(passphrase.to_owned()),
    );
    tokio::task::spawn_blocking(move || {
        let right = owner::verify(&o, &p);
        drop(permit);
        right
    })
    .await
    .unwrap_or(false)
}

/// `POST /admin/signin`: limited before the passphrase is read, then checked off the event loop.
async fn sign_in(admin: &Admin, owner: &owner::Owner, req: Request<Incoming>, ctx: Ctx) -> Reply {
    let peer = ctx.peer();
    // Refused before the passphrase is read, when the limit is already spent.
    if let Err(limited) = admin.signin.borrow().check(peer.ip(), Instant::now()) {
        return signin_limited(admin, limited, ctx);
    }
    let pre = session::cookie(req.headers(), session::PRE_COOKIE).map(str::to_owned);
    let form = match read_form(admin, req).await {
        Ok(f) => f,
        Err(r) => return refused(admin, r, ctx),
    };
    if !pre.is_some_and(|p| session::same(&p, form.get("pre"))) {
        return refused(admin, Refusal::BadCsrf, ctx);
    }
    // Counted now, before the hash: attempts in flight together are counted as they begin,
    // so no more than the limit ever reach `verify` (`guessing.rs`).
    let begun = admin.signin.borrow_mut().begin(peer.ip(), Instant::now());
    let attempt = match begun {
        Ok(a) => a,
        Err(limited) => return signin_limited(admin, limited, ctx),
    };
    let next = safe_next(form.get("next")).unwrap_or(PREFIX);
    if !verify(admin, owner, form.get("passphrase")).await {
        info!(%peer, "admin page: wrong passphrase");
        return signin_page(
            admin,
            StatusCode::UNAUTHORIZED,
            next,
            &Notice::Bad("That passphrase is not right."),
            ctx,
        );
    }
    admin.signin.borrow_mut().succeeded(attempt, Instant::now());
    info!(%peer, "admin page: owner signed in");
    let id = admin
        .sessions
        .borrow_mut()
        .create(owner.stamp(), Instant::now());
    let mut reply = redirect(next);
    set_cookies(
        &mut reply,
        &[
            ctx.cookie(session::COOKIE, &id),
            ctx.cookie(session::PRE_COOKIE, ""),
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
    let unit = if secs == 1 { "second" } else { "seconds" };
    let n = format!("Too many wrong passphrases {whose}: wait {secs} {unit}, then try again.");
    (n, secs)
}

fn signin_limited(admin: &Admin, limited: crate::guessing::Limited, ctx: Ctx) -> Reply {
    let (n, secs) = limited_notice(limited, ctx.peer(), "sign-in");
    let mut reply = signin_page(
        admin,
        StatusCode::TOO_MANY_REQUESTS,
        PREFIX,
        &Notice::Bad(&n),
        ctx,
    );
    retry_after(&mut reply, secs);
    reply
}

fn retry_after(reply: &mut Reply, secs: u64) {
    reply
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
}

/// The signed-in pages (GET): each renders fresh state, nothing is cached, and shows what the
/// form that redirected here did (`outcome.rs`), once.
async fn get(
    admin: &Admin,
    hub: &Rc<Hub>,
    who: &SignedIn,
    route: &Route,
    query: &Form,
    this_device: Option<&str>,
) -> Result<Reply, Refusal> {
    let csrf = who.csrf();
    let ok = |title: &str, current: &Route, body: Markup| {
        Ok(signed_page(
            admin,
            who,
            StatusCode::OK,
            title,
            current,
            body,
        ))
    };
    if let Some(r) = health::get(admin, hub, route).await {
        return r;
    }
    if let Some(r) = power::get(admin, who, route) {
        return r;
    }
    if let Route::Job(kind) = route {
        return job_page(admin, who, *kind);
    }
    if *route == Route::Paired {
        let paired = admin
            .sessions
            .borrow_mut()
            .take_paired(who.key(), query.get("id"));
        let Some(p) = paired else {
            return ok("Already shown", &Route::Devices, pages::already_shown());
        };
        let inv = Invitation::new(&admin.url, &p.token, admin.tls.as_ref());
        let body = pages::invitation(&inv, &p.device_id, p.intro);
        // The browser that opens the app from this page is, most likely, that phone: the
        // Devices page marks it "this device" (a device id is no secret: the page lists it).
        let mut reply = ok("Pair a phone", &Route::Devices, body)?;
        set_cookies(
            &mut reply,
            &[pages::this_device_cookie(&p.device_id, who.ctx())],
        );
        return Ok(reply);
    }
    let outcome = admin.sessions.borrow_mut().take_outcome(who.key(), route);
    let n = Notice::of(outcome.as_ref());
    match route {
        Route::Home => health::home(admin, hub, who, &n).await,
        Route::Devices => ok("Devices", route, devices_body(hub, csrf, this_device, &n)?),
        Route::Agent => {
            let form = outcome.as_ref().and_then(|o| o.typed("form"));
            let (agent, transcription, speech) = match (outcome.as_ref(), form) {
                (Some(o), Some("transcription")) => (None, Some(o), None),
                (Some(o), Some("speech")) => (None, None, Some(o)),
                (o, _) => (o, None, None),
            };
            let body = agent_body(admin, hub, csrf, agent, transcription, speech);
            ok("Agent", route, body)
        }
        Route::Push => ok("Push", route, push_body(admin, hub, csrf, &n)?),
        Route::Owner => ok("Owner", route, pages::owner(csrf, &n)),
        Route::Update => updates::get(admin, hub, who, &n).await,
        _ => Err(Refusal::NotFound),
    }
}

/// `GET /admin/job/<kind>`: the last job of that kind, running (the page reloads itself) or
/// ended. A restore that succeeded goes on to the page that waits for the restart into it.
fn job_page(admin: &Admin, who: &SignedIn, kind: jobs::Kind) -> Result<Reply, Refusal> {
    let view = admin.jobs.view(kind);
    if kind == jobs::Kind::Restore
        && view
            .as_ref()
            .is_some_and(|v| v.phase == jobs::Phase::Succeeded)
    {
        return Ok(power::to_restoring_page());
    }
    let body = jobs::body(kind, view.as_ref());
    Ok(signed_page(
        admin,
        who,
        StatusCode::OK,
        kind.title(),
        &kind.home(),
        body,
    ))
}

/// The https address of the admin page when TLS is on (for what `run` prints).
pub fn address(url: &str, tls: Option<&crate::tls::Advert>) -> String {
    match tls {
        Some(t) => https_of(&t.url),
        None => format!("{}{PREFIX}", url.replacen("ws://", "http://", 1)),
    }
}
