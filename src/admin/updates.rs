//! The Update page: the version running, whether a newer one is offered, an upload of a signed
//! bundle, the history of updates and rollbacks, and the operating system's own security
//! updates. A bundle, uploaded or downloaded, is checked in full off the event loop and staged
//! for the root helper (`crate::update`); the page follows the update from there.

use std::path::Path;
use std::rc::Rc;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use maud::{html, Markup};
use tracing::{info, warn};

use super::context::{Ctx, SignedIn};
use super::jobs::{Kind, Ticket};
use super::outcome::{Outcome, Tone};
use super::pages::{self, notice, Notice};
use super::receive::receive;
use super::reply::{page, redirect, redirect_to, refused, sentence, signed_page, Refusal, Reply};
use super::route::{Power, Route};
use super::{Admin, Form};
use crate::hub::Hub;
use crate::settings::Settings;
use crate::update::bundle::MAX_BUNDLE;
use crate::update::checks::{Checked, Finish, Host};
use crate::update::policy::Consent;
use crate::update::source;
use crate::update::version::Step;
use crate::update::{Entry, Outcome as Ended};
use crate::web::csrf_field;

const PAGE: Route = Route::Update;
const CHECK: Route = Route::UpdateCheck;
const INSTALL: Route = Route::UpdateInstall;
const SOURCE: Route = Route::UpdateSource;
const DISMISS: Route = Route::UpdateDismiss;
/// What is read of the system update log: its end, where the last runs are.
const SYSTEM_LOG_TAIL: u64 = 64 * 1024;

/// Refuses a bundle while another is being received, downloaded or checked: the two share
/// `upload.part`.
fn install_ticket(admin: &Admin, what: &str) -> Result<Ticket, Refusal> {
    admin
        .jobs
        .begin(Kind::UpdateInstall, what)
        .map_err(|busy| Refusal::Conflict(busy.to_string()))
}

/// `GET /admin/update`.
pub(super) async fn get(
    admin: &Admin,
    hub: &Rc<Hub>,
    who: &SignedIn,
    n: &Notice<'_>,
) -> Result<Reply, Refusal> {
    let csrf = who.csrf();
    let updates = hub.updates().stage().clone();
    let system = admin.config.read(|c| c.update.clone());
    let (state, os) = tokio::task::spawn_blocking(move || {
        (
            updates.state(),
            SystemUpdates::read(&system.system_log, &system.reboot_required),
        )
    })
    .await
    .map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let (url, automatic) = admin
        .config
        .read(|c| (c.update.url.clone(), c.update.automatic));
    let failure = state.failure.as_ref();
    let installing = state.under_way.as_ref().or(state.staged.as_ref());
    let body = html! {
        (notice(n))
        p id="version" {
            "Running " strong { "iris-gateway " (state.version) } " for "
            (crate::update::policy::this_arch()) "."
        }
        @if let Some(f) = failure {
            div.bad id="update-failure" {
                p { (f.summary()) "." }
                form method="post" action=(DISMISS) {
                    (csrf_field(csrf))
                    input type="hidden" name="id" value=(f.id);
                    button { "Dismiss" }
                }
            }
        }
        @if let Some(to) = installing {
            // The page reloads itself while the update runs (the gateway restarts under it).
            p.warn id="under-way" data-reload="5" {
                "Installing " (to) ": the gateway restarts into it and is checked; if it does \
                 not come up healthy, the version running now comes back by itself. This page \
                 reloads."
            }
        }
        @if !state.helper_installed {
            p.warn id="no-helper" {
                "This system has no update service (it is installed with the gateway's .deb \
                 package and on the Pi image): a bundle uploaded here is checked in full and \
                 the result shown, but it cannot be installed."
            }
        }
        (admin.jobs.under_way(&[Kind::UpdateCheck, Kind::UpdateInstall]))
        (available_section(admin, csrf, &url, automatic))
        (upload_section(csrf))
        (history_section(&state.history))
        (os.html())
    };
    Ok(signed_page(
        admin,
        who,
        StatusCode::OK,
        "Update",
        &PAGE,
        body,
    ))
}

fn available_section(admin: &Admin, csrf: &str, url: &str, automatic: bool) -> Markup {
    let checked = admin.update_checks.last();
    html! {
        h2 { "Newer versions" }
        form method="post" action=(SOURCE) {
            (csrf_field(csrf))
            label for="update-url" { "Release index address" }
            input type="url" id="update-url" name="url" value=(url) maxlength="2048"
                placeholder="empty: updates come only from an upload";
            label.check {
                // With no index nothing is checked, so nothing installs by itself: not shown
                // ticked.
                input type="checkbox" id="automatic" name="automatic" value="1"
                    checked[automatic && !url.is_empty()];
                " "
                span {
                    "Install fixes by itself (checked daily; a new major version always waits \
                     for you)"
                    @if url.is_empty() { ". It needs the release index address above." }
                }
            }
            p { button { "Save" } }
        }
        @if !url.is_empty() {
            form method="post" action=(CHECK) {
                (csrf_field(csrf))
                p { button id="check" { "Check now" } }
            }
            @match checked.as_ref() {
                None => {}
                Some(Checked { found: Err(e), .. }) => p.bad id="checked" { (e) },
                Some(Checked { found: Ok(a), .. }) if matches!(a.step, Step::Same | Step::Older) => {
                    p.good id="checked" { "Up to date: the newest release is " (a.version) "." }
                }
                Some(Checked { found: Ok(a), .. }) if a.bundle_url.is_none() => {
                    p.warn id="checked" {
                        (a.version) " is out, but not for this box ("
                        (crate::update::policy::this_arch()) ")."
                    }
                }
                Some(Checked { found: Ok(a), .. }) => {
                    div id="checked" {
                        p.good { strong { (a.version) " is available." } }
                        p.notes { (a.notes) }
                        form method="post" action=(INSTALL) {
                            (csrf_field(csrf))
                            @if a.step == Step::Major {
                                label.check {
                                    input type="checkbox" name="major" value="1" required;
                                    " This is a new major version: I have read what changes"
                                }
                            }
                            p { button id="install" { "Install " (a.version) } }
                        }
                    }
                }
            }
        }
    }
}

/// The upload is sent by the page's script (the file as the body, the CSRF token in a header,
/// the owner's choices in the query), as the restore upload is.
fn upload_section(csrf: &str) -> Markup {
    html! {
        h2 { "Upload an update" }
        p {
            "A signed update bundle (" code { ".iub" } "). It is checked in full before anything \
             changes: its signature, that it is for this box, and that it is newer."
        }
        form id="update-form" data-csrf=(csrf) {
            label for="update-file" { "Bundle" }
            input type="file" id="update-file" accept=".iub" required;
            label.check {
                input type="checkbox" id="update-major";
                " Allow a new major version"
            }
            label.check {
                input type="checkbox" id="update-downgrade";
                " Go back to an older version"
            }
            p { button id="upload" { "Install this update" } }
        }
        p id="update-result" role="status" {}
    }
}

fn history_section(history: &[Entry]) -> Markup {
    html! {
        h2 { "History" }
        @if history.is_empty() {
            p id="history" { "No updates yet." }
        } @else {
            table.stack id="history" {
                tr { th { "When" } th { "Version" } th { "Result" } th { "Why" } }
                @for e in history {
                    @let (tone, what) = match e.outcome {
                        Ended::Installed => ("good", "installed"),
                        Ended::RolledBack => ("bad", "rolled back"),
                        Ended::Refused => ("bad", "refused"),
                        Ended::Interrupted => ("warn", "interrupted"),
                    };
                    tr {
                        td data-label="When" { (when(e.at)) }
                        td data-label="Version" { (e.from) " → " (e.to) }
                        td class=(tone) data-label="Result" { (what) }
                        td data-label="Why" { (e.reason.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

fn when(secs: u64) -> String {
    chrono::DateTime::from_timestamp(secs as i64, 0)
        .map(|t| {
            t.with_timezone(&chrono::Local)
                .format("%Y-%m-%d %H:%M")
                .to_string()
        })
        .unwrap_or_default()
}

/// The signed-in forms of the page; `None` for another path. A check and an install are jobs
/// (`jobs.rs`): the answer is a `303` to the job's page at once.
pub(super) async fn post(
    admin: &Admin,
    hub: &Rc<Hub>,
    who: &SignedIn,
    route: &Route,
    form: &Form,
) -> Option<Result<Reply, Refusal>> {
    let peer = who.peer();
    let said = match route {
        Route::UpdateSource => save_source(admin, form),
        Route::UpdateCheck => {
            let url = admin.config.read(|c| c.update.url.clone());
            let checks = admin.update_checks.clone();
            let work = async move { checks.check(url).await.map_err(|e| sentence(&e)) };
            let what = "Asking the release index for a newer version.";
            return Some(match admin.jobs.start(Kind::UpdateCheck, what, work) {
                Ok(()) => Ok(redirect(&Kind::UpdateCheck.page())),
                Err(busy) => Err(Refusal::Conflict(busy.to_string())),
            });
        }
        Route::UpdateInstall => {
            let consent = Consent {
                major: form.get("major") == "1",
                downgrade: false,
            };
            info!(%peer, "admin page: install the available update");
            return Some(
                start_install(admin, hub, consent).map(|_| redirect(&Kind::UpdateInstall.page())),
            );
        }
        Route::UpdateDismiss => hub
            .updates()
            .dismiss_failure(form.get("id"))
            .map(|_| Some("Dismissed.".to_owned()))
            .map_err(|e| e.to_string()),
        _ => return None,
    };
    let outcome = match said {
        Ok(None) => None,
        Ok(Some(text)) => Some(Outcome::new(PAGE, Tone::Good, text)),
        Err(text) => Some(Outcome::new(PAGE, Tone::Bad, text)),
    };
    if let Some(o) = outcome {
        admin.sessions.borrow_mut().leave(who.key(), o);
    }
    Some(Ok(redirect_to(&PAGE)))
}

fn save_source(admin: &Admin, form: &Form) -> Result<Option<String>, String> {
    let url = form.get("url").trim().to_owned();
    if !(url.is_empty() || url.starts_with("https://") || url.starts_with("http://")) {
        return Err("the address must start with https:// or http://".into());
    }
    if url.len() > 2048 {
        return Err("the address is longer than 2048 characters".into());
    }
    let automatic = form.get("automatic") == "1";
    let mut saved = Settings::load(&admin.data_dir).map_err(|e| e.to_string())?;
    saved.update.url = Some(url.clone());
    saved.update.automatic = Some(automatic);
    saved
        .save(&admin.data_dir)
        .map_err(|e| format!("cannot save: {e}"))?;
    admin.config.apply(|c| {
        c.update.url = url;
        c.update.automatic = automatic;
    });
    admin.update_checks.forget();
    Ok(Some("Saved.".into()))
}

/// Starts the download of the bundle the last check found as a job.
fn start_install(admin: &Admin, hub: &Rc<Hub>, consent: Consent) -> Result<(), Refusal> {
    let Some(Checked { found: Ok(a), .. }) = admin.update_checks.last() else {
        return Err(Refusal::BadInput("check for updates first".into()));
    };
    let Some(url) = a.bundle_url.clone() else {
        return Err(Refusal::BadInput(format!(
            "{} has no bundle for this box",
            a.version
        )));
    };
    let ticket = install_ticket(admin, &format!("Downloading {}.", a.version))?;
    let (updates, store) = (hub.updates().stage().clone(), hub.store().clone());
    tokio::task::spawn_local(async move {
        ticket.finish(install(updates, store, url, consent).await);
    });
    Ok(())
}

/// Downloads `url`, checks the bundle in full and stages it, all on a blocking thread; the
/// part file is gone whichever way it ends (`source::download`, `Updates::stage`).
async fn install(
    updates: crate::update::stage::Updates,
    store: crate::store::StoreView,
    url: String,
    consent: Consent,
) -> Result<String, String> {
    tokio::task::spawn_blocking(move || {
        store
            .disk_ok(MAX_BUNDLE)
            .map_err(|e| format!("no room for the download: {e}"))?;
        let part = updates.upload_path().map_err(|e| e.to_string())?;
        source::download(&url, &part).map_err(|e| e.to_string())?;
        updates
            .stage(&part, consent)
            .map(|v| {
                format!(
                    "{} downloaded and checked; installing it now.",
                    v.manifest.version
                )
            })
            .map_err(|e| format!("Refused, nothing was changed: {e}"))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| sentence(&e))
}

/// `POST /admin/update/upload`: the body is a bundle. Received bounded (one at a time, the disk
/// checked as it grows), then checked in full and staged off the event loop.
pub(super) async fn upload(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    ctx: Ctx,
) -> Reply {
    let peer = ctx.peer();
    let query = req.uri().query().unwrap_or("").to_owned();
    let flag = |name: &str| query.split('&').any(|p| p == format!("{name}=1"));
    let consent = Consent {
        major: flag("major"),
        downgrade: flag("downgrade"),
    };
    if hyper::body::Body::size_hint(req.body()).lower() > MAX_BUNDLE {
        return refused(admin, Refusal::TooLarge, ctx);
    }
    let ticket = match install_ticket(admin, "Receiving the uploaded bundle.") {
        Ok(t) => t,
        Err(r) => return refused(admin, r, ctx),
    };
    let part = match hub.updates().stage().upload_path() {
        Ok(p) => p,
        Err(e) => return refused(admin, Refusal::Unavailable(e.to_string()), ctx),
    };
    if let Err(r) = receive(hub, req.into_body(), &part, MAX_BUNDLE).await {
        let _ = std::fs::remove_file(&part);
        ticket.finish(Err(sentence(&r.to_string())));
        return refused(admin, r, ctx);
    }
    let updates = hub.updates().stage().clone();
    // The job owns the check: a browser gone mid-way does not free the slot before it ends.
    let job = tokio::task::spawn_local(async move {
        let staged = tokio::task::spawn_blocking(move || updates.stage(&part, consent))
            .await
            .unwrap_or_else(|e| Err(crate::update::Error::Refused(e.to_string())));
        ticket.finish(match &staged {
            Ok(v) => Ok(format!(
                "{} uploaded and checked; installing it now.",
                v.manifest.version
            )),
            Err(e) => Err(sentence(&format!("Refused, nothing was changed: {e}"))),
        });
        staged
    });
    let staged = job.await;
    let (status, text, n) = match staged {
        Ok(Ok(v)) => {
            info!(%peer, version = %v.manifest.version, "admin page: update uploaded, checked and staged");
            (
                StatusCode::OK,
                format!(
                    "iris-gateway {} (signed by {}) is checked and is being installed. The \
                     gateway restarts into it; this page follows it.",
                    v.manifest.version, v.signed_by
                ),
                Notice::Good("Update accepted."),
            )
        }
        Ok(Err(e)) => {
            warn!(%peer, "admin page: update refused: {e}");
            // A disk that cannot be written is the box's trouble, not the bundle's.
            let status = match e {
                crate::update::Error::Io { .. } => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::UNPROCESSABLE_ENTITY,
            };
            (
                status,
                // The notice already says "refused": saying it twice reads as a stutter.
                sentence(&format!("nothing was changed: {e}")),
                Notice::Bad("Update refused."),
            )
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            e.to_string(),
            Notice::Bad("Update refused."),
        ),
    };
    page(
        admin,
        status,
        "Update",
        &PAGE.path(),
        None,
        ctx,
        pages::message(&text, &n),
    )
}

/// What the daily check (`crate::update::checks`) asks of the admin: the address and consent
/// saved on this page, a slot among its jobs (a check from the page waits for it), and the
/// install, which shares the upload's slot.
pub struct CheckHost {
    admin: Rc<Admin>,
    hub: Rc<Hub>,
}

impl CheckHost {
    pub fn new(admin: &Rc<Admin>, hub: Rc<Hub>) -> CheckHost {
        CheckHost {
            admin: admin.clone(),
            hub,
        }
    }
}

impl Host for CheckHost {
    fn source(&self) -> (String, bool) {
        self.admin
            .config
            .read(|c| (c.update.url.clone(), c.update.automatic))
    }

    fn begin_check(&self) -> Option<Finish> {
        let ticket = self
            .admin
            .jobs
            .begin(Kind::UpdateCheck, "The daily check for a newer version.")
            .ok()?;
        Some(Box::new(move |said: Result<String, String>| {
            ticket.finish(said.map_err(|e| sentence(&e)))
        }))
    }

    fn on_trial(&self) -> bool {
        self.hub.updates().on_trial()
    }

    fn install_found(&self) -> Result<(), String> {
        start_install(&self.admin, &self.hub, Consent::default()).map_err(|e| e.to_string())
    }
}

/// The operating system's automatic security updates, as far as their files say.
struct SystemUpdates {
    /// When unattended-upgrades last ran, and what it installed then (empty: nothing).
    last_run: Option<String>,
    last_installed: Option<(String, String)>,
    /// A package asked for a restart: which ones.
    restart_needed: Option<String>,
    /// No log at all: not the Pi image (or the updates are off).
    configured: bool,
}

impl SystemUpdates {
    fn read(log: &Path, flag: &Path) -> SystemUpdates {
        let tail = read_tail(log, SYSTEM_LOG_TAIL);
        let mut last_run = None;
        let mut last_installed = None;
        for line in tail.as_deref().unwrap_or("").lines() {
            let stamp = line.get(..16).unwrap_or("").to_owned();
            if line.contains("Starting unattended upgrades script") {
                last_run = Some(stamp);
            } else if let Some(pkgs) = line.split("Packages that will be upgraded:").nth(1) {
                last_installed = Some((stamp, pkgs.trim().to_owned()));
            }
        }
        let restart_needed = flag.exists().then(|| {
            let mut pkgs = flag.as_os_str().to_owned();
            pkgs.push(".pkgs");
            read_tail(Path::new(&pkgs), 4096)
                .unwrap_or_default()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(", ")
        });
        SystemUpdates {
            configured: tail.is_some(),
            last_run,
            last_installed,
            restart_needed,
        }
    }

    fn html(&self) -> Markup {
        html! {
            h2 { "System security updates" }
            @if !self.configured {
                p id="os-updates" {
                    "No record of automatic system updates on this box (the Pi image installs \
                     Debian's security updates weekly; elsewhere, the system's own package \
                     manager does)."
                }
            } @else {
                p id="os-updates" {
                    "Debian's security updates install by themselves once a week. Last run: "
                    (self.last_run.as_deref().unwrap_or("not yet")) ". Last installed: "
                    @match &self.last_installed {
                        Some((at, pkgs)) => { (pkgs) " (" (at) ")" }
                        None => "nothing yet",
                    }
                    "."
                }
            }
            @if let Some(pkgs) = &self.restart_needed {
                p.warn id="os-restart" {
                    "A restart of the box is needed to finish them"
                    @if !pkgs.is_empty() { " (for " (pkgs) ")" }
                    ". "
                    a href=(Route::Power(Power::Reboot)) { "Restart the box" }
                }
            }
        }
    }
}

/// The last `max` bytes of a file, from the first whole line in them.
fn read_tail(path: &Path, max: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(max))).ok()?;
    let mut bytes = Vec::new();
    f.take(max).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Some(if len > max {
        text.split_once('\n')
            .map_or(String::new(), |(_, rest)| rest.to_owned())
    } else {
        text
    })
}
