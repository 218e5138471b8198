//! The root side of an update: `iris-gateway update apply`, run by systemd when the gateway has
//! staged a bundle, and `iris-gateway update recover`, run at every boot before the gateway.
//!
//! Every step is recorded in the journal before the step's effect can be seen (the binary is
//! switched only once the journal says `switched`), so [`Helper::recover`] can always tell from
//! the journal alone whether the box may run the new binary, must get the old one back, or has
//! nothing to undo. The helper trusts nothing the gateway decided: it copies the staged bundle
//! into its own directory, where the gateway's user cannot write, and checks that copy again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::bundle::{self, Verified};
use super::journal::{Entry, Journal, Outcome, Phase, Records};
use super::policy::{self, Space, STORE_PARTS};
use super::stage::{self, Staged};
use super::{keys, kill_point, now_secs, version, Error};
use crate::config::UpdateConfig;

const INCOMING: &str = "incoming.iub";
const NEW_BINARY: &str = "new-binary";
/// The binary that was running before the update. While it exists an update is under way, and
/// the boot-time recovery runs from it (the unit's condition), never from the new binary.
pub const PREVIOUS_BINARY: &str = "previous-binary";
/// The store's copy, in the gateway's update directory (the data disk, where the store is).
const BACKUP_DIR: &str = "store-backup";
/// Written last into the copy: the parts it holds (a part absent from the store is absent here).
const BACKUP_COMPLETE: &str = ".complete";
/// How often the new version is asked whether it is healthy.
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// A migration's allowance in the health window: the whole store rewritten at this rate, well
/// under the slowest SD card's sequential writes (about 10 MB/s).
const MIGRATION_BYTES_PER_SEC: u64 = 2 * 1024 * 1024;
/// Longest a stop or start command may take.
const SERVICE_COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// What the new version answered when asked for its health.
pub enum Probe {
    /// It answers on its control socket with this version, its store open and writable.
    Healthy { version: String },
    /// Not (yet): why, in words.
    NotYet(String),
}

/// The root helper, over the `[update]` section of the config file and the gateway's data dir.
pub struct Helper {
    config: UpdateConfig,
    data_dir: PathBuf,
    records: Records,
    probe: Box<dyn Fn(&Path) -> Probe>,
}

impl Helper {
    /// `probe` asks the gateway on `data_dir` for its health (the control socket's `status`).
    pub fn new(
        config: UpdateConfig,
        data_dir: PathBuf,
        probe: Box<dyn Fn(&Path) -> Probe>,
    ) -> Helper {
        let records = Records::new(&config.helper_dir);
        Helper {
            config,
            data_dir,
            records,
            probe,
        }
    }

    fn helper_file(&self, name: &str) -> PathBuf {
        self.config.helper_dir.join(name)
    }

    fn backup_dir(&self) -> PathBuf {
        stage::stage_dir(&self.data_dir).join(BACKUP_DIR)
    }

    /// Installs what the gateway staged, if anything: the whole update, from the copy to the
    /// commit or the rollback. Returns how it ended.
    pub fn apply(&self) -> Result<Option<Entry>, Error> {
        std::fs::create_dir_all(&self.config.helper_dir)
            .map_err(|e| Error::io("creating", &self.config.helper_dir, e))?;
        // Whatever an earlier helper left (killed, or the power cut before this boot's recovery
        // ran) is finished first; the gateway is running again afterwards.
        if self.records.journal()?.is_some() {
            self.recover(true)?;
        }
        let id = format!("{}-{}", now_secs(), std::process::id());
        let from = version::running().to_string();
        let staged = match stage::take(&self.data_dir, &self.helper_file(INCOMING)) {
            Ok(Some(staged)) => staged,
            Ok(None) => return Ok(None),
            Err(e) => return self.refuse(&id, &from, "an unreadable bundle", e).map(Some),
        };
        let verified = match self.check(&staged) {
            Ok(v) => v,
            Err(e) => {
                let _ = std::fs::remove_file(self.helper_file(INCOMING));
                return self.refuse(&id, &from, &staged.to, e).map(Some);
            }
        };
        let mut journal = Journal {
            id,
            phase: Phase::Copied,
            from,
            to: verified.manifest.version.clone(),
            signed_by: verified.signed_by.clone(),
            reason: None,
            started_at: now_secs(),
        };
        self.records.write_journal(&journal)?;
        kill_point("update-copied");
        match self.install(&verified, &mut journal) {
            Ok(entry) => Ok(Some(entry)),
            Err(e) => {
                // A step failed (a stop command that failed, a full disk): undo at once what
                // the journal says was done, as a boot would, rather than leave it for one.
                tracing::error!("update to {} failed: {e}; undoing it", journal.to);
                let journal = self.records.journal()?.unwrap_or(journal);
                self.recover_from(journal, true, Some(format!("the installer failed: {e}")))
                    .map(Some)
            }
        }
    }

    /// The steps from the prepared binaries to the commit or the rollback.
    fn install(&self, verified: &Verified, journal: &mut Journal) -> Result<Entry, Error> {
        self.prepare(verified)?;
        self.advance(journal, Phase::Prepared)?;
        kill_point("update-prepared");

        self.advance(journal, Phase::Stopped)?;
        self.service(&self.config.stop, "stop")?;
        kill_point("update-stopped");

        let store_bytes = self.back_up_store()?;
        self.advance(journal, Phase::BackedUp)?;
        kill_point("update-backed-up");

        self.advance(journal, Phase::Switched)?;
        install_binary(&self.helper_file(NEW_BINARY), &self.config.binary)?;
        kill_point("update-switched");

        self.advance(journal, Phase::Trial)?;
        self.service(&self.config.start, "start")?;
        kill_point("update-trial");

        match self.wait_healthy(&journal.to, store_bytes) {
            Ok(()) => {
                self.advance(journal, Phase::Committed)?;
                kill_point("update-committing");
                self.finish_commit(journal)
            }
            Err(reason) => self.roll_back(journal.clone(), reason, true),
        }
    }

    /// Records a bundle refused before anything changed.
    fn refuse(&self, id: &str, from: &str, to: &str, why: Error) -> Result<Entry, Error> {
        let entry = Entry::new(id, from, to, Outcome::Refused, Some(why.to_string()));
        self.records.append(entry.clone())?;
        tracing::warn!("{}", entry.summary());
        Ok(entry)
    }

    /// The staged bundle, copied into the helper's directory, checked again in full there.
    fn check(&self, staged: &Staged) -> Result<Verified, Error> {
        let incoming = self.helper_file(INCOMING);
        let verified = bundle::verify(&incoming, &keys::trusted(&self.config.keys_dir))?;
        let space = Space::measure(&self.data_dir, &self.config);
        policy::check(&verified, staged.consent, space)?;
        Ok(verified)
    }

    /// The new binary out of the bundle, and a copy of the running one to go back to.
    fn prepare(&self, verified: &Verified) -> Result<(), Error> {
        let incoming = self.helper_file(INCOMING);
        bundle::extract(&incoming, verified, &self.helper_file(NEW_BINARY))?;
        copy_file(
            &self.config.binary,
            &self.helper_file(PREVIOUS_BINARY),
            0o755,
        )?;
        let _ = std::fs::remove_file(&incoming);
        sync(&self.config.helper_dir)
    }

    fn advance(&self, journal: &mut Journal, phase: Phase) -> Result<(), Error> {
        journal.phase = phase;
        self.records.write_journal(journal)
    }

    /// Copies the store's files (the gateway is stopped) beside it; returns their size.
    fn back_up_store(&self) -> Result<u64, Error> {
        let backup = self.backup_dir();
        remove_tree(&backup)?;
        std::fs::create_dir_all(&backup).map_err(|e| Error::io("creating", &backup, e))?;
        let mut held = Vec::new();
        let mut bytes = 0;
        for part in STORE_PARTS {
            let from = self.data_dir.join(part);
            if std::fs::symlink_metadata(&from).is_ok() {
                bytes += copy_tree(&from, &backup.join(part))?;
                held.push(part);
            }
        }
        sync(&backup)?;
        crate::atomic_file::write(
            &backup.join(BACKUP_COMPLETE),
            held.join("\n").as_bytes(),
            0o600,
        )
        .map_err(|e| Error::io("writing", &backup, e))?;
        Ok(bytes)
    }

    /// Waits for the new version to answer healthy, for the window: at least the configured
    /// seconds, plus the time a migration of a store this size may take, and longer while the
    /// store is still being opened (a migration under way is progress, not a hang), up to the
    /// configured maximum. An unreachable agent is not a failure: the probe does not ask.
    fn wait_healthy(&self, want: &str, store_bytes: u64) -> Result<(), String> {
        let started = Instant::now();
        let base = Duration::from_secs(self.config.window_secs)
            + Duration::from_secs(store_bytes / MIGRATION_BYTES_PER_SEC);
        let max = Duration::from_secs(self.config.max_window_secs.max(self.config.window_secs));
        let opening = self.data_dir.join(crate::store::SAFETY_DIR);
        loop {
            let last = match (self.probe)(&self.data_dir) {
                Probe::Healthy { version } if version == want => return Ok(()),
                Probe::Healthy { version } => {
                    format!("it says it is version {version}, the bundle said {want}")
                }
                Probe::NotYet(why) => why,
            };
            let waited = started.elapsed();
            let still_opening = opening.exists();
            if (waited >= base && !still_opening) || waited >= max {
                return Err(format!(
                    "{want} was not healthy within {} s ({last})",
                    waited.as_secs()
                ));
            }
            std::thread::sleep(PROBE_EVERY);
        }
    }

    fn finish_commit(&self, journal: &Journal) -> Result<Entry, Error> {
        let entry = self.end(journal, Outcome::Installed, None)?;
        tracing::info!("{}", entry.summary());
        Ok(entry)
    }

    /// Puts the previous binary and the store as it was before the update back; with
    /// `restart`, stops the new version first and starts the old one after (at boot systemd
    /// starts it). Every step may be repeated after a power cut.
    fn roll_back(
        &self,
        mut journal: Journal,
        reason: String,
        restart: bool,
    ) -> Result<Entry, Error> {
        tracing::warn!("update to {} failed: {reason}; rolling back", journal.to);
        journal.reason = Some(reason.clone());
        self.advance(&mut journal, Phase::RollingBack)?;
        kill_point("update-rolling-back");
        // The new version may be crash-looping: a failed stop is not a reason to leave it.
        if restart {
            if let Err(e) = self.service(&self.config.stop, "stop") {
                tracing::warn!("{e}");
            }
        }
        self.put_back()?;
        kill_point("update-restored");
        let entry = self.end(&journal, Outcome::RolledBack, Some(reason))?;
        if restart {
            self.service(&self.config.start, "start")?;
        }
        Ok(entry)
    }

    /// Records how `journal`'s update ended and forgets it: the history entry first, so a
    /// power cut in between leaves the journal to finish it again (the entry is written once).
    fn end(
        &self,
        journal: &Journal,
        outcome: Outcome,
        reason: Option<String>,
    ) -> Result<Entry, Error> {
        let entry = Entry::new(&journal.id, &journal.from, &journal.to, outcome, reason);
        self.records.append(entry.clone())?;
        if outcome == Outcome::Installed {
            remove_tree(&self.backup_dir())?;
        }
        self.forget_binaries()?;
        self.records.clear_journal()?;
        Ok(entry)
    }

    /// The previous binary and the store's copy back in place; both steps may be repeated.
    fn put_back(&self) -> Result<(), Error> {
        let previous = self.helper_file(PREVIOUS_BINARY);
        if previous.exists() {
            install_binary(&previous, &self.config.binary)?;
        }
        let backup = self.backup_dir();
        let Ok(held) = std::fs::read_to_string(backup.join(BACKUP_COMPLETE)) else {
            // No complete copy: the store was never handed to the new version (the journal
            // says `switched` only once the copy is whole), so there is nothing to undo.
            return Ok(());
        };
        let held: Vec<&str> = held.lines().collect();
        for part in STORE_PARTS {
            let live = self.data_dir.join(part);
            let copy = backup.join(part);
            if !held.contains(&part) {
                // The store had no such part before: what the new version made goes.
                remove_tree(&live)?;
            } else if std::fs::symlink_metadata(&copy).is_ok() {
                remove_tree(&live)?;
                std::fs::rename(&copy, &live).map_err(|e| Error::io("restoring", &live, e))?;
            }
        }
        sync(&self.data_dir)?;
        remove_tree(&backup)
    }

    fn forget_binaries(&self) -> Result<(), Error> {
        for name in [INCOMING, NEW_BINARY, PREVIOUS_BINARY] {
            let path = self.helper_file(name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("removing", &path, e)),
            }
        }
        sync(&self.config.helper_dir)
    }

    /// Finishes or undoes what the journal says was under way. At boot (`start` false) the
    /// gateway is not started here: systemd starts it after this, with whichever binary this
    /// left in place.
    pub fn recover(&self, start: bool) -> Result<Option<Entry>, Error> {
        let journal = match self.records.journal() {
            Ok(Some(j)) => j,
            Ok(None) => {
                // Killed between copying the bundle and the first journal entry.
                let _ = std::fs::remove_file(self.helper_file(INCOMING));
                return Ok(None);
            }
            Err(e) => {
                // An unreadable journal cannot say whether the new binary was committed: the
                // previous one, if any, is the one known to have worked.
                tracing::error!("{e}; putting the previous version back");
                let journal = Journal {
                    id: format!("{}-unreadable", now_secs()),
                    phase: Phase::RollingBack,
                    from: "the previous version".into(),
                    to: "a new version".into(),
                    signed_by: String::new(),
                    reason: Some(format!("the update's journal was unreadable ({e})")),
                    started_at: now_secs(),
                };
                return self.recover_from(journal, start, None).map(Some);
            }
        };
        self.recover_from(journal, start, None).map(Some)
    }

    /// Finishes or undoes `journal`'s update; `why` says what cut it short, when known.
    fn recover_from(
        &self,
        journal: Journal,
        start: bool,
        why: Option<String>,
    ) -> Result<Entry, Error> {
        tracing::warn!(
            "an update to {} was cut short after `{:?}`; finishing it",
            journal.to,
            journal.phase
        );
        match journal.phase {
            Phase::Copied | Phase::Prepared | Phase::Stopped | Phase::BackedUp => {
                // The store was not handed to the new version: its copy (whole or half-made)
                // is only removed, and the old binary is still in place.
                remove_tree(&self.backup_dir())?;
                let reason = why.unwrap_or_else(|| {
                    format!(
                        "cut short (power lost or the installer stopped) after {:?}, before the \
                         new version was put in place",
                        journal.phase
                    )
                });
                let entry = self.end(&journal, Outcome::Interrupted, Some(reason))?;
                if start {
                    self.service(&self.config.start, "start")?;
                }
                Ok(entry)
            }
            Phase::Switched | Phase::Trial | Phase::RollingBack => {
                let reason = journal.reason.clone().or(why).unwrap_or_else(|| {
                    format!(
                        "power lost (or the installer stopped) while {} was on trial",
                        journal.to
                    )
                });
                self.roll_back(journal, reason, start)
            }
            // A gateway on trial opens to devices once the journal is gone; nothing to start.
            Phase::Committed => self.finish_commit(&journal),
        }
    }

    /// Runs a configured stop or start command, bounded in time; none configured: nothing.
    fn service(&self, command: &[String], what: &str) -> Result<(), Error> {
        if command.is_empty() {
            return Ok(());
        }
        crate::command::run(command, SERVICE_COMMAND_TIMEOUT)
            .map_err(|e| Error::Helper(format!("the gateway's {what} command failed: {e}")))
    }
}

/// Puts `from` in place of the binary at `to` in one rename: a power cut leaves the old binary
/// or the new one, never a part of either.
fn install_binary(from: &Path, to: &Path) -> Result<(), Error> {
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(to.file_name().unwrap_or_default());
    tmp_name.push(".update");
    let tmp = to.with_file_name(tmp_name);
    copy_file(from, &tmp, 0o755)?;
    std::fs::rename(&tmp, to).map_err(|e| Error::io("replacing", to, e))?;
    sync(to.parent().unwrap_or(Path::new("/")))
}

fn copy_file(from: &Path, to: &Path, mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(to);
    std::fs::copy(from, to).map_err(|e| Error::io("copying to", to, e))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("setting the mode of", to, e))?;
    std::fs::File::open(to)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io("syncing", to, e))
}

/// Copies a file or a directory tree, keeping modes and owners (the store stays the gateway
/// user's), every file fsynced; returns the bytes copied.
fn copy_tree(from: &Path, to: &Path) -> Result<u64, Error> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(from).map_err(|e| Error::io("reading", from, e))?;
    let mut bytes = 0;
    if meta.is_dir() {
        std::fs::create_dir(to).map_err(|e| Error::io("creating", to, e))?;
        let entries = std::fs::read_dir(from).map_err(|e| Error::io("reading", from, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("reading", from, e))?;
            bytes += copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        // The store's directories are the gateway user's alone (0700): not the helper's umask.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(|e| Error::io("setting the mode of", to, e))?;
        sync(to)?;
    } else if meta.is_file() {
        copy_file(from, to, meta.mode() & 0o7777)?;
        bytes = meta.len();
    } else {
        // Sockets and the like are not part of a store.
        return Ok(0);
    }
    std::os::unix::fs::chown(to, Some(meta.uid()), Some(meta.gid()))
        .map_err(|e| Error::io("setting the owner of", to, e))?;
    Ok(bytes)
}

fn remove_tree(path: &Path) -> Result<(), Error> {
    let result = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    };
    result.map_err(|e| Error::io("removing", path, e))
}

fn sync(dir: &Path) -> Result<(), Error> {
    crate::atomic_file::sync_dir(dir).map_err(|e| Error::io("syncing", dir, e))
}
