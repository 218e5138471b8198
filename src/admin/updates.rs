//! The Update page: the version running, whether a newer one is offered, an upload of a signed
//! bundle, the history of updates and rollbacks, and the operating system's own security
//! updates. A bundle, uploaded or downloaded, is checked in full off the event loop and staged
//! for the root helper (`crate::update`); the page follows the update from there.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use tracing::{info, warn};

use super::context::{Ctx, SignedIn};
use super::jobs::{Kind, Ticket};
use super::outcome::{Outcome, Tone};
use super::pages::{self, csrf_field, notice, Notice};
use super::receive::receive;
use super::reply::{page, redirect, redirect_to, refused, signed_page, Refusal, Reply};
use super::route::{Power, Route};
use super::{Admin, Form};
use crate::hub::Hub;
use crate::pairing::page::escape;
use crate::settings::Settings;
use crate::update::bundle::MAX_BUNDLE;
use crate::update::policy::Consent;
use crate::update::source::{self, Available};
use crate::update::version::Step;
use crate::update::{Entry, Outcome as Ended};

const PAGE: Route = Route::Update;
const CHECK: Route = Route::UpdateCheck;
const INSTALL: Route = Route::UpdateInstall;
const SOURCE: Route = Route::UpdateSource;
const DISMISS: Route = Route::UpdateDismiss;
/// The automatic check: once a day, the first a few minutes after start (not at once: a box
/// that restarts in a loop must not hammer the release server).
const CHECK_EVERY: Duration = Duration::from_secs(24 * 3600);
const FIRST_CHECK_AFTER: Duration = Duration::from_secs(10 * 60);
/// What is read of the system update log: its end, where the last runs are.
const SYSTEM_LOG_TAIL: u64 = 64 * 1024;

/// The page's live state: the last check's answer. Checks, downloads and uploads take their
/// slots in the admin jobs (`jobs.rs`).
#[derive(Default)]
pub(super) struct State {
    checked: RefCell<Option<(SystemTime, Result<Available, String>)>>,
}

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
    let mut body = notice(n);
    body += &format!(
        "<p id=\"version\">Running <strong>iris-gateway {}</strong> for {}.</p>",
        escape(&state.version),
        crate::update::policy::this_arch()
    );
    if let Some(f) = &state.failure {
        body += &format!(
            "<div class=\"bad\" id=\"update-failure\"><p>{}.</p>\
             <form method=\"post\" action=\"{DISMISS}\">{}<input type=\"hidden\" name=\"id\" \
             value=\"{}\"><button>Dismiss</button></form></div>",
            escape(&f.summary()),
            csrf_field(csrf),
            escape(&f.id)
        );
    }
    if let Some(to) = state.under_way.as_ref().or(state.staged.as_ref()) {
        // The page reloads itself while the update runs (the gateway restarts under it).
        body += &format!(
            "<p class=\"warn\" id=\"under-way\" data-reload=\"5\">Installing {}: the gateway \
             restarts into it and is checked; if it does not come up healthy, the version \
             running now comes back by itself. This page reloads.</p>",
            escape(to)
        );
    }
    if !state.helper_installed {
        body += "<p class=\"warn\" id=\"no-helper\">This system has no update service (it is \
                 installed with the gateway's .deb package and on the Pi image): a bundle \
                 uploaded here is checked in full and the result shown, but it cannot be \
                 installed.</p>";
    }
    body += &admin
        .jobs
        .under_way(&[Kind::UpdateCheck, Kind::UpdateInstall]);
    body += &available_section(admin, csrf, &url, automatic);
    body += &upload_section(csrf);
    body += &history_section(&state.history);
    body += &os.html();
    Ok(signed_page(
        admin,
        who,
        StatusCode::OK,
        "Update",
        &PAGE,
        &body,
    ))
}

fn available_section(admin: &Admin, csrf: &str, url: &str, automatic: bool) -> String {
    let mut out = "<h2>Newer versions</h2>".to_owned();
    out += &format!(
        "<form method=\"post\" action=\"{SOURCE}\">{}<label for=\"update-url\">Release index \
         address</label><input type=\"url\" id=\"update-url\" name=\"url\" value=\"{}\" \
         maxlength=\"2048\" placeholder=\"empty: updates come only from an upload\">\
         <label class=\"check\"><input type=\"checkbox\" id=\"automatic\" name=\"automatic\" \
         value=\"1\"{}> <span>Install fixes by itself (checked daily; a new major version \
         always waits for you){}</span></label><p><button>Save</button></p></form>",
        csrf_field(csrf),
        escape(url),
        // With no index nothing is checked, so nothing installs by itself: not shown ticked.
        if automatic && !url.is_empty() {
            " checked"
        } else {
            ""
        },
        if url.is_empty() {
            ". It needs the release index address above."
        } else {
            ""
        }
    );
    if url.is_empty() {
        return out;
    }
    out += &format!(
        "<form method=\"post\" action=\"{CHECK}\">{}<p><button id=\"check\">Check now</button>\
         </p></form>",
        csrf_field(csrf)
    );
    let checked = admin.update_state.checked.borrow();
    match checked.as_ref() {
        None => {}
        Some((_, Err(e))) => out += &format!("<p class=\"bad\" id=\"checked\">{}</p>", escape(e)),
        Some((_, Ok(a))) if matches!(a.step, Step::Same | Step::Older) => {
            out += &format!(
                "<p class=\"good\" id=\"checked\">Up to date: the newest release is {}.</p>",
                escape(&a.version)
            )
        }
        Some((_, Ok(a))) if a.bundle_url.is_none() => {
            out += &format!(
                "<p class=\"warn\" id=\"checked\">{} is out, but not for this box ({}).</p>",
                escape(&a.version),
                crate::update::policy::this_arch()
            )
        }
        Some((_, Ok(a))) => {
            let major = a.step == Step::Major;
            out += &format!(
                "<div id=\"checked\"><p class=\"good\"><strong>{} is available.</strong></p>\
                 <p class=\"notes\">{}</p><form method=\"post\" action=\"{INSTALL}\">{}{}\
                 <p><button id=\"install\">Install {}</button></p></form></div>",
                escape(&a.version),
                escape(&a.notes),
                csrf_field(csrf),
                if major {
                    "<label class=\"check\"><input type=\"checkbox\" name=\"major\" value=\"1\" \
                     required> This is a new major version: I have read what changes</label>"
                } else {
                    ""
                },
                escape(&a.version)
            )
        }
    }
    out
}

/// The upload is sent by the page's script (the file as the body, the CSRF token in a header,
/// the owner's choices in the query), as the restore upload is.
fn upload_section(csrf: &str) -> String {
    format!(
        "<h2>Upload an update</h2><p>A signed update bundle (<code>.iub</code>). It is checked \
         in full before anything changes: its signature, that it is for this box, and that it \
         is newer.</p><form id=\"update-form\" data-csrf=\"{}\">\
         <label for=\"update-file\">Bundle</label><input type=\"file\" id=\"update-file\" \
         accept=\".iub\" required>\
         <label class=\"check\"><input type=\"checkbox\" id=\"update-major\"> Allow a new major \
         version</label>\
         <label class=\"check\"><input type=\"checkbox\" id=\"update-downgrade\"> Go back to an \
         older version</label>\
         <p><button id=\"upload\">Install this update</button></p></form>\
         <p id=\"update-result\" role=\"status\"></p>",
        escape(csrf)
    )
}

fn history_section(history: &[Entry]) -> String {
    if history.is_empty() {
        return "<h2>History</h2><p id=\"history\">No updates yet.</p>".into();
    }
    let rows: String = history
        .iter()
        .map(|e| {
            let (tone, what) = match e.outcome {
                Ended::Installed => ("good", "installed"),
                Ended::RolledBack => ("bad", "rolled back"),
                Ended::Refused => ("bad", "refused"),
                Ended::Interrupted => ("warn", "interrupted"),
            };
            format!(
                "<tr><td data-label=\"When\">{}</td><td data-label=\"Version\">{} → {}</td>\
                 <td class=\"{tone}\" data-label=\"Result\">{what}</td><td data-label=\"Why\">{}</td></tr>",
                escape(&when(e.at)),
                escape(&e.from),
                escape(&e.to),
                escape(e.reason.as_deref().unwrap_or(""))
            )
        })
        .collect();
    format!(
        "<h2>History</h2><table id=\"history\" class=\"stack\"><tr><th>When</th><th>Version</th>\
         <th>Result</th><th>Why</th></tr>{rows}</table>"
    )
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
            let work = check_index(url, admin.update_state.clone());
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
    *admin.update_state.checked.borrow_mut() = None;
    Ok(Some("Saved.".into()))
}

/// Asks the release index (on a blocking thread, within the index's own time limit) and keeps
/// its answer for the page; returns it in words, for the job's page.
async fn check_index(url: String, state: Rc<State>) -> Result<String, String> {
    let answer = tokio::task::spawn_blocking(move || source::check(&url))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    let said = match &answer {
        Err(e) => Err(super::reply::sentence(e)),
        Ok(a) if matches!(a.step, Step::Same | Step::Older) => {
            Ok(format!("Up to date: the newest release is {}.", a.version))
        }
        Ok(a) if a.bundle_url.is_none() => Ok(format!(
            "{} is out, but not for this box ({}).",
            a.version,
            crate::update::policy::this_arch()
        )),
        Ok(a) => Ok(format!(
            "{} is available: install it from the Update page.",
            a.version
        )),
    };
    *state.checked.borrow_mut() = Some((SystemTime::now(), answer));
    said
}

/// Starts the download of the bundle the last check found as a job.
fn start_install(admin: &Admin, hub: &Rc<Hub>, consent: Consent) -> Result<(), Refusal> {
    let Some((_, Ok(a))) = admin.update_state.checked.borrow().clone() else {
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
    .map_err(|e| super::reply::sentence(&e))
}

/// `POST /admin/update/upload`: the body is a bundle. Received bounded (one at a time, the disk
/// checked as it grows), then checked in full and staged off the event loop.
pub(super) async fn upload(
    admin: &Admin,
    hub: &Rc<Hub>,
    req: Request<Incoming>,
    ctx: Ctx,
) -> Reply {
    let (peer, secure) = (ctx.peer(), ctx.secure());
    let query = req.uri().query().unwrap_or("").to_owned();
    let flag = |name: &str| query.split('&').any(|p| p == format!("{name}=1"));
    let consent = Consent {
        major: flag("major"),
        downgrade: flag("downgrade"),
    };
    if hyper::body::Body::size_hint(req.body()).lower() > MAX_BUNDLE {
        return refused(admin, Refusal::TooLarge, secure);
    }
    let ticket = match install_ticket(admin, "Receiving the uploaded bundle.") {
        Ok(t) => t,
        Err(r) => return refused(admin, r, secure),
    };
    let part = match hub.updates().stage().upload_path() {
        Ok(p) => p,
        Err(e) => return refused(admin, Refusal::Unavailable(e.to_string()), secure),
    };
    if let Err(r) = receive(hub, req.into_body(), &part, MAX_BUNDLE).await {
        let _ = std::fs::remove_file(&part);
        ticket.finish(Err(super::reply::sentence(&r.to_string())));
        return refused(admin, r, secure);
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
            Err(e) => Err(super::reply::sentence(&format!(
                "Refused, nothing was changed: {e}"
            ))),
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
                super::reply::sentence(&format!("nothing was changed: {e}")),
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
        secure,
        &pages::message(&text, &n),
    )
}

/// Once a day, when an address is set and the owner allowed it: a newer version with the same
/// major part is downloaded, checked and staged by itself. A major one waits for the owner.
pub fn start_checks(admin: &Rc<Admin>, hub: Rc<Hub>, mut stop: crate::shutdown::Listener) {
    let admin = admin.clone();
    tokio::task::spawn_local(async move {
        let mut wait = FIRST_CHECK_AFTER;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.recv() => return,
            }
            wait = CHECK_EVERY;
            let (url, automatic) = admin
                .config
                .read(|c| (c.update.url.clone(), c.update.automatic));
            if url.is_empty() {
                continue;
            }
            let check = admin
                .jobs
                .begin(Kind::UpdateCheck, "The daily check for a newer version.");
            let Ok(ticket) = check else {
                continue;
            };
            let said = check_index(url, admin.update_state.clone()).await;
            if let Err(e) = &said {
                warn!("automatic update check: {e}");
            }
            ticket.finish(said);
            let minor = matches!(
                admin.update_state.checked.borrow().as_ref(),
                Some((_, Ok(a))) if a.step == Step::Minor && a.bundle_url.is_some()
            );
            if automatic && minor && !hub.updates().on_trial() {
                match start_install(&admin, &hub, Consent::default()) {
                    Ok(()) => info!("automatic update: downloading the newer version"),
                    Err(e) => warn!("automatic update: {e}"),
                }
            }
        }
    });
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

    fn html(&self) -> String {
        let mut out = "<h2>System security updates</h2>".to_owned();
        if !self.configured {
            out += "<p id=\"os-updates\">No record of automatic system updates on this box \
                    (the Pi image installs Debian's security updates weekly; elsewhere, the \
                    system's own package manager does).</p>";
        } else {
            out += &format!(
                "<p id=\"os-updates\">Debian's security updates install by themselves once a \
                 week. Last run: {}. Last installed: {}.</p>",
                escape(self.last_run.as_deref().unwrap_or("not yet")),
                match &self.last_installed {
                    Some((at, pkgs)) => format!("{} ({})", escape(pkgs), escape(at)),
                    None => "nothing yet".into(),
                }
            );
        }
        if let Some(pkgs) = &self.restart_needed {
            out += &format!(
                "<p class=\"warn\" id=\"os-restart\">A restart of the box is needed to finish \
                 them{}. <a href=\"{}\">Restart the box</a></p>",
                if pkgs.is_empty() {
                    String::new()
                } else {
                    format!(" (for {})", escape(pkgs))
                },
                Route::Power(Power::Reboot),
            );
        }
        out
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
