//! The gateway's side of an update: a bundle checked in full and staged in the data dir for the
//! root helper, and what the admin page, `status` and the LED read back of the helper's records.
//!
//! `DATA_DIR/update/` holds the bundle being received (`upload.part`), the staged one
//! (`staged.iub`) and its request (`staged.json`, written last: the helper's path unit waits
//! for it), the store's copy while an update is under way (the helper's), and which rolled-back
//! update the owner has seen (`dismissed`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::bundle::{self, Verified};
use super::journal::{Entry, Journal, Outcome, Phase, Records};
use super::policy::{self, Consent, Space};
use super::{keys, version, Error};
use crate::config::UpdateConfig;

pub const STAGE_DIR: &str = "update";
const STAGED_BUNDLE: &str = "staged.iub";
/// The helper's trigger: systemd's path unit starts the helper when it appears.
pub const STAGED_REQUEST: &str = "staged.json";
pub const UPLOAD_PART: &str = "upload.part";
const DISMISSED: &str = "dismissed";
/// A staged update the helper has not taken after this long is taken to have no helper
/// watching (the path unit starts it within a second) and may be replaced.
const STAGED_UNTAKEN_SECS: u64 = 10 * 60;

pub fn stage_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(STAGE_DIR)
}

/// What the owner asked for with a staged bundle.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Staged {
    pub to: String,
    #[serde(default)]
    pub consent: Consent,
    pub staged_at: u64,
}

/// The gateway's view of updates: its config and data dir.
#[derive(Debug, Clone)]
pub struct Updates {
    config: UpdateConfig,
    data_dir: PathBuf,
}

/// Everything the admin page and `status` show about updates.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UpdateState {
    pub version: String,
    /// The root helper is installed (its directory exists): updates can be applied here.
    pub helper_installed: bool,
    /// An update waiting for the helper, or under way.
    pub staged: Option<String>,
    pub under_way: Option<String>,
    /// Newest first.
    pub history: Vec<Entry>,
    /// The newest rolled-back update, until the owner dismisses it: a cause of `degraded`.
    pub failure: Option<Entry>,
}

impl Updates {
    pub fn new(config: &UpdateConfig, data_dir: &Path) -> Updates {
        Updates {
            config: config.clone(),
            data_dir: data_dir.to_owned(),
        }
    }

    pub fn config(&self) -> &UpdateConfig {
        &self.config
    }

    fn records(&self) -> Records {
        Records::new(&self.config.helper_dir)
    }

    /// Where an upload or a download is written before it is checked.
    pub fn upload_path(&self) -> Result<PathBuf, Error> {
        let dir = stage_dir(&self.data_dir);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        Ok(dir.join(UPLOAD_PART))
    }

    /// At start: a bundle being received or downloaded when the gateway stopped (a crash, a
    /// kill) is removed; nothing of it was checked or staged.
    pub fn remove_cut_part(data_dir: &Path) {
        let part = stage_dir(data_dir).join(UPLOAD_PART);
        if std::fs::remove_file(&part).is_ok() {
            tracing::info!("removed {}: a bundle cut short", part.display());
        }
    }

    /// Checks the received bundle in full and, if it may be installed here, stages it for the
    /// helper. Blocking (it hashes the whole file): run it off the event loop.
    pub fn stage(&self, received: &Path, consent: Consent) -> Result<Verified, Error> {
        let result = self.check_and_stage(received, consent);
        let _ = std::fs::remove_file(received);
        result
    }

    fn check_and_stage(&self, received: &Path, consent: Consent) -> Result<Verified, Error> {
        if let Some(waiting) = self.staged_request() {
            // A second click (a stale page, the daily check) must not swap the file under a
            // helper that is taking it; one the helper never took (no path unit) is replaced.
            if super::now_secs().saturating_sub(waiting.staged_at) < STAGED_UNTAKEN_SECS {
                return Err(Error::Refused(format!(
                    "an update to {} is already waiting for the installer",
                    waiting.to
                )));
            }
            tracing::warn!(
                "the update to {} staged {} s ago was never taken by the installer; replacing it",
                waiting.to,
                super::now_secs().saturating_sub(waiting.staged_at)
            );
        }
        if let Some(j) = self.records().journal()? {
            return Err(Error::Refused(format!(
                "an update to {} is under way",
                j.to
            )));
        }
        let verified = bundle::verify(received, &keys::trusted(&self.config.keys_dir))?;
        let helper_installed = self.config.helper_dir.is_dir();
        let mut space = Space::measure(&self.data_dir, &self.config);
        if !helper_installed {
            // Nothing will be installed here, so the room an install needs is not asked for.
            space.data_free = u64::MAX;
            space.binary_free = u64::MAX;
        }
        policy::check(&verified, consent, space)?;
        // Checked in full first, so a box with no helper still tells a good bundle from a bad
        // one (the Update page says a bundle is checked here).
        if !helper_installed {
            return Err(Error::Refused(format!(
                "iris-gateway {} (signed by {}) is good for this box, but this system has no \
                 update helper to install it ({} is missing): install the gateway's .deb \
                 package, or update it by hand",
                verified.manifest.version,
                verified.signed_by,
                self.config.helper_dir.display()
            )));
        }
        let dir = stage_dir(&self.data_dir);
        let staged = dir.join(STAGED_BUNDLE);
        std::fs::rename(received, &staged).map_err(|e| Error::io("staging", &staged, e))?;
        let request = Staged {
            to: verified.manifest.version.clone(),
            consent,
            staged_at: super::now_secs(),
        };
        let bytes = serde_json::to_vec(&request).expect("a request serializes");
        crate::atomic_file::write(&dir.join(STAGED_REQUEST), &bytes, 0o600)
            .map_err(|e| Error::io("staging", &dir, e))?;
        tracing::info!(
            "update to {} staged (signed by {}); the installer takes it from here",
            verified.manifest.version,
            verified.signed_by
        );
        Ok(verified)
    }

    /// The new version is on trial (or being rolled back): devices wait until the helper
    /// commits it, so nothing a phone sends is acknowledged by a version that may yet be rolled
    /// back.
    pub fn on_trial(&self) -> bool {
        matches!(
            self.records().journal(),
            Ok(Some(Journal { phase: Phase::Switched | Phase::Trial | Phase::RollingBack, ref to, .. }))
                if *to == version::running().to_string()
        )
    }

    pub fn state(&self) -> UpdateState {
        let mut history = self.records().history();
        history.reverse();
        UpdateState {
            version: version::running().to_string(),
            helper_installed: self.config.helper_dir.is_dir(),
            staged: self.staged(),
            under_way: self.records().journal().ok().flatten().map(|j| j.to),
            failure: self.failure_in(&history),
            history,
        }
    }

    /// The version being installed, or staged for the helper: two small files, not the history.
    pub fn under_way(&self) -> Option<String> {
        let journal = self.records().journal().ok().flatten().map(|j| j.to);
        journal.or_else(|| self.staged())
    }

    /// The newest rolled-back update the owner has not dismissed (read from the history).
    pub fn failure(&self) -> Option<Entry> {
        let mut history = self.records().history();
        history.reverse();
        self.failure_in(&history)
    }

    fn failure_in(&self, newest_first: &[Entry]) -> Option<Entry> {
        let dismissed =
            std::fs::read_to_string(stage_dir(&self.data_dir).join(DISMISSED)).unwrap_or_default();
        newest_first
            .iter()
            .find(|e| matches!(e.outcome, Outcome::Installed | Outcome::RolledBack))
            .filter(|e| e.outcome == Outcome::RolledBack && e.id != dismissed.trim())
            .cloned()
    }

    fn staged(&self) -> Option<String> {
        self.staged_request().map(|s| s.to)
    }

    fn staged_request(&self) -> Option<Staged> {
        std::fs::read(stage_dir(&self.data_dir).join(STAGED_REQUEST))
            .ok()
            .and_then(|b| serde_json::from_slice::<Staged>(&b).ok())
    }

    /// The owner has seen the rollback `id`: it stops being a cause of `degraded`.
    pub fn dismiss(&self, id: &str) -> Result<(), Error> {
        let dir = stage_dir(&self.data_dir);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        crate::atomic_file::write(&dir.join(DISMISSED), id.as_bytes(), 0o600)
            .map_err(|e| Error::io("writing", &dir, e))
    }
}

/// The helper's half: moves the staged bundle into `incoming` (the helper's directory, which
/// the gateway's user cannot write) and removes what was staged. Files are opened without
/// following links, so a staged name cannot point the helper at another file.
pub(super) fn take(data_dir: &Path, incoming: &Path) -> Result<Option<Staged>, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = stage_dir(data_dir);
    let request_path = dir.join(STAGED_REQUEST);
    let bundle_path = dir.join(STAGED_BUNDLE);
    let open = |path: &Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
    };
    let mut request = match open(&request_path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("opening", &request_path, e)),
    };
    let mut text = Vec::new();
    (&mut request)
        .take(super::bundle::MAX_MANIFEST as u64)
        .read_to_end(&mut text)
        .map_err(|e| Error::io("reading", &request_path, e))?;
    let staged: Result<Staged, _> = serde_json::from_slice(&text);
    let copied = (|| {
        let staged = staged.map_err(|e| Error::Bundle(format!("the staged request: {e}")))?;
        let mut from = open(&bundle_path).map_err(|e| Error::io("opening", &bundle_path, e))?;
        let _ = std::fs::remove_file(incoming);
        let mut to = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(incoming)
            .map_err(|e| Error::io("creating", incoming, e))?;
        let n = std::io::copy(&mut (&mut from).take(bundle::MAX_BUNDLE + 1), &mut to)
            .map_err(|e| Error::io("copying", &bundle_path, e))?;
        if n > bundle::MAX_BUNDLE {
            return Err(Error::Bundle(
                "the staged file is larger than any bundle".into(),
            ));
        }
        to.flush()
            .and_then(|_| to.sync_all())
            .map_err(|e| Error::io("writing", incoming, e))?;
        Ok(staged)
    })();
    for path in [&request_path, &bundle_path] {
        let _ = std::fs::remove_file(path);
    }
    let _ = crate::atomic_file::sync_dir(&dir);
    copied.map(Some)
}
