//! The check for a newer version: asking the release index (`source::check`, on a blocking
//! thread), keeping what it found for the admin page, and the daily check that runs by itself
//! and may install a fix. The admin page only shows [`Checks::last`] and asks for a check; what
//! the daily check needs of the gateway above this wing (the address and consent the owner
//! saved, a slot among the page's jobs, the install) it asks through [`Host`].

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use super::source::{self, Available};
use super::version::Step;

/// The daily check: once a day, the first a few minutes after start (not at once: a box that
/// restarts in a loop must not hammer the release server).
const CHECK_EVERY: Duration = Duration::from_secs(24 * 3600);
const FIRST_CHECK_AFTER: Duration = Duration::from_secs(10 * 60);

/// One check's answer: what the index offers, or why it could not be asked.
#[derive(Clone, Debug)]
pub struct Checked {
    pub at: SystemTime,
    pub found: Result<Available, String>,
}

impl Checked {
    /// A newer version with the same major part, with a bundle for this box: what the daily
    /// check may install by itself.
    pub fn offers_fix(&self) -> bool {
        matches!(&self.found, Ok(a) if a.step == Step::Minor && a.bundle_url.is_some())
    }
}

/// The last check's answer, shared by the daily check and the admin page (one event loop).
#[derive(Clone, Default)]
pub struct Checks {
    last: Rc<RefCell<Option<Checked>>>,
}

impl Checks {
    /// What the last check found, if one ran since the start or the last [`Checks::forget`].
    pub fn last(&self) -> Option<Checked> {
        self.last.borrow().clone()
    }

    /// Drops the last answer: the owner saved another index, so it no longer says anything.
    pub fn forget(&self) {
        *self.last.borrow_mut() = None;
    }

    /// Asks the index at `url` (on a blocking thread, within the index's own time limit) and
    /// keeps its answer; returns it in words, for the job's page.
    pub async fn check(&self, url: String) -> Result<String, String> {
        let answer = tokio::task::spawn_blocking(move || source::check(&url))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        let said = match &answer {
            Err(e) => Err(e.clone()),
            Ok(a) if matches!(a.step, Step::Same | Step::Older) => {
                Ok(format!("Up to date: the newest release is {}.", a.version))
            }
            Ok(a) if a.bundle_url.is_none() => Ok(format!(
                "{} is out, but not for this box ({}).",
                a.version,
                super::policy::this_arch()
            )),
            Ok(a) => Ok(format!(
                "{} is available: install it from the Update page.",
                a.version
            )),
        };
        *self.last.borrow_mut() = Some(Checked {
            at: SystemTime::now(),
            found: answer,
        });
        said
    }
}

/// What the daily check asks of the gateway above the update wing.
pub trait Host {
    /// The release index address the owner saved (empty: none) and whether a fix may install
    /// by itself.
    fn source(&self) -> (String, bool);
    /// A slot for one check among the page's jobs, to be finished with what it found; `None`
    /// while a check or an install is under way.
    fn begin_check(&self) -> Option<Box<dyn FnOnce(Result<String, String>)>>;
    /// This version is on trial after an update: nothing else installs until it ends.
    fn on_trial(&self) -> bool;
    /// Starts downloading and installing what the last check found.
    fn install_found(&self) -> Result<(), String>;
}

/// Once a day, when an address is set: asks the index, and when the owner allowed it, a newer
/// version with the same major part is downloaded, checked and staged by itself. A major one
/// waits for the owner.
pub fn start(checks: Checks, host: impl Host + 'static, mut stop: crate::shutdown::Listener) {
    tokio::task::spawn_local(async move {
        let mut wait = FIRST_CHECK_AFTER;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.recv() => return,
            }
            wait = CHECK_EVERY;
            let (url, automatic) = host.source();
            if url.is_empty() {
                continue;
            }
            let Some(finish) = host.begin_check() else {
                continue;
            };
            let said = checks.check(url).await;
            if let Err(e) = &said {
                warn!("automatic update check: {e}");
            }
            finish(said);
            let fix = checks.last().is_some_and(|c| c.offers_fix());
            if automatic && fix && !host.on_trial() {
                match host.install_found() {
                    Ok(()) => info!("automatic update: downloading the newer version"),
                    Err(e) => warn!("automatic update: {e}"),
                }
            }
        }
    });
}
