//! Scheduled backups: daily or weekly, to a folder or a mounted USB stick, the newest `keep`
//! kept, each sealed with the owner's backup passphrase (`sealed.rs`).
//!
//! One backup is made the way the admin page's download makes one ([`super::stream`]): the
//! store's records are copied on the event loop to a spool file in the data dir, because every
//! store write happens there and so nothing changes half-way (the same short pause a download
//! makes); the media files, the encryption and every write to the folder then happen on a
//! blocking thread, so a device's request never waits for the folder (a slow USB stick). One at
//! a time: the schedule and "Back up now" share [`Backups`]' one slot.
//!
//! A file is written as `.NAME.partial` beside its final name, fsynced, renamed and the folder
//! fsynced: a power cut leaves either the whole backup or a partial file that the next backup
//! deletes. Only then are the oldest beyond `keep` deleted, so a failed backup never costs one
//! that was good.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use crate::config::{ConfigError, Limits};
use crate::hub::Hub;
use crate::settings::{BackupSettings, Settings};

use super::sealed::{self, Extras, SealError, Sealer};

/// The backups' names: `iris-backup-20261202T192000.123Z.age`, so that names sort by age.
const PREFIX: &str = "iris-backup-";
const SUFFIX: &str = ".age";
/// How many are kept when the owner has not said.
pub const DEFAULT_KEEP: u32 = 7;
/// Free space kept on the folder's disk beyond the backup's estimated size.
const FOLDER_RESERVE_BYTES: u64 = 16 << 20;
/// Folders under these are meant to be a USB stick: one that is not mounted is refused
/// rather than filling the SD card beneath the mount point.
const REMOVABLE_ROOTS: [&str; 3] = ["/media/", "/mnt/", "/run/media/"];

/// Why a scheduled backup was not made.
#[derive(Debug, thiserror::Error)]
pub enum BackupsError {
    #[error("the backup folder {0} does not exist (is the USB stick plugged in and mounted?)")]
    Missing(PathBuf),
    #[error("{0} is not a folder")]
    NotAFolder(PathBuf),
    #[error("no USB stick is mounted at {0}: it is a folder on the SD card")]
    NotMounted(PathBuf),
    #[error("the backup folder {0} cannot be written: {1}")]
    NotWritable(PathBuf, std::io::Error),
    #[error("not enough room in {folder}: {free} free, about {need} needed")]
    NoRoom {
        folder: PathBuf,
        free: String,
        need: String,
    },
    #[error("a backup is already being made")]
    Busy,
    #[error("no backup folder is set")]
    NoFolder,
    #[error("cannot make the backup: {0}")]
    Source(String),
    #[error(transparent)]
    Seal(#[from] SealError),
}

/// How often one is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Every {
    Day,
    Week,
}

/// The owner's schedule, from the saved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub every: Option<Every>,
    pub folder: Option<PathBuf>,
    pub keep: u32,
}

impl Plan {
    pub fn from_settings(b: &BackupSettings, limits: &Limits) -> Plan {
        Plan {
            every: match b.schedule.as_deref() {
                Some("daily") => Some(Every::Day),
                Some("weekly") => Some(Every::Week),
                _ => None,
            },
            folder: b
                .folder
                .as_deref()
                .filter(|f| !f.is_empty())
                .map(PathBuf::from),
            keep: b
                .keep
                .unwrap_or(DEFAULT_KEEP)
                .clamp(1, limits.backup_keep_max),
        }
    }

    /// The plan saved in `data_dir`'s settings.
    pub fn load(data_dir: &Path, limits: &Limits) -> Result<Plan, ConfigError> {
        Ok(Plan::from_settings(
            &Settings::load(data_dir)?.backup,
            limits,
        ))
    }

    /// Saves this plan into `data_dir`'s settings, the rest of them as they were.
    pub fn save(&self, data_dir: &Path) -> Result<(), SavePlanError> {
        let mut saved = Settings::load(data_dir)?;
        saved.backup.schedule = self.every.map(|e| {
            match e {
                Every::Day => "daily",
                Every::Week => "weekly",
            }
            .to_owned()
        });
        saved.backup.folder = self.folder.as_ref().map(|f| f.display().to_string());
        saved.backup.keep = Some(self.keep);
        saved.save(data_dir).map_err(SavePlanError::Save)
    }

    /// Time between two scheduled backups (`limits.backup_day_secs` a day).
    pub fn interval(&self, limits: &Limits) -> Option<Duration> {
        let day = limits.backup_day_secs;
        self.every.map(|e| {
            Duration::from_secs(match e {
                Every::Day => day,
                Every::Week => day.saturating_mul(7),
            })
        })
    }
}

/// Why a plan was not saved.
#[derive(Debug, thiserror::Error)]
pub enum SavePlanError {
    #[error(transparent)]
    Load(#[from] ConfigError),
    #[error("The schedule could not be saved: {0}.")]
    Save(std::io::Error),
}

/// One backup in the folder.
#[derive(Debug, Clone)]
pub struct Listed {
    pub name: String,
    pub bytes: u64,
    pub made: SystemTime,
}

/// How the last backup (scheduled or asked for) went, for the page.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub at: SystemTime,
    pub result: Result<Listed, String>,
}

/// The backups wing while the gateway runs: one backup at a time (the schedule's and "Back up
/// now" share the slot), how the last one went, and what a backup reads besides the store.
pub struct Backups {
    sources: Sources,
    running: Cell<bool>,
    last: RefCell<Option<Outcome>>,
    failed_at: Cell<Option<Instant>>,
}

impl Backups {
    /// The wing for the data dir `data_dir`, whose owner file (carried in every scheduled
    /// backup) is `owner_file`: the admin page owns its name.
    pub fn new(data_dir: PathBuf, owner_file: PathBuf) -> Backups {
        Backups {
            sources: Sources {
                data_dir,
                owner_file,
            },
            running: Cell::new(false),
            last: RefCell::new(None),
            failed_at: Cell::new(None),
        }
    }

    /// Whether a backup is being made now.
    pub fn running(&self) -> bool {
        self.running.get()
    }

    /// How the last backup since the start went.
    pub fn last(&self) -> Option<Outcome> {
        self.last.borrow().clone()
    }

    /// Starts the schedule for this run of the gateway; it ends when `stop` fires.
    pub fn start_schedule(self: &Rc<Self>, hub: Rc<Hub>, stop: crate::shutdown::Listener) {
        tokio::task::spawn_local(schedule(self.clone(), hub, stop));
    }

    /// Makes one backup into `plan.folder` now and prunes beyond `plan.keep`; records the
    /// outcome.
    pub async fn back_up_now(&self, hub: &Rc<Hub>, plan: &Plan) -> Result<Listed, BackupsError> {
        if self.running.replace(true) {
            return Err(BackupsError::Busy);
        }
        let _slot = Slot(&self.running);
        let result = make(hub, &self.sources, plan).await;
        match &result {
            Ok(l) => {
                tracing::info!(file = %l.name, bytes = l.bytes, "scheduled backup written");
                self.failed_at.set(None);
            }
            Err(e) => {
                tracing::warn!("scheduled backup not made: {e}");
                self.failed_at.set(Some(Instant::now()));
            }
        }
        *self.last.borrow_mut() = Some(Outcome {
            at: SystemTime::now(),
            result: result
                .as_ref()
                .map(Listed::clone)
                .map_err(|e| e.to_string()),
        });
        result
    }
}

/// Frees the one slot when a backup ends, whichever way.
struct Slot<'a>(&'a Cell<bool>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// What a backup reads besides the store: the data dir, and the owner file's path (the admin
/// page owns its name).
struct Sources {
    data_dir: PathBuf,
    owner_file: PathBuf,
}

impl Sources {
    fn extras(&self) -> Result<Extras, BackupsError> {
        let read = |p: &Path| match std::fs::read(p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BackupsError::Source(format!(
                "cannot read {}: {e}",
                p.display()
            ))),
        };
        Ok(Extras {
            settings: read(&crate::settings::path(&self.data_dir))?,
            owner: read(&self.owner_file)?,
        })
    }
}

async fn make(hub: &Rc<Hub>, sources: &Sources, plan: &Plan) -> Result<Listed, BackupsError> {
    let folder = plan.folder.clone().ok_or(BackupsError::NoFolder)?;
    let key = sealed::key(&sources.data_dir)?.ok_or(SealError::NoKey)?;
    let extras = sources.extras()?;
    let store_bytes = hub
        .store()
        .size_on_disk()
        .map_err(|e| BackupsError::Source(e.to_string()))?;
    let media_dir = hub.store().dir().join("media");
    {
        let folder = folder.clone();
        tokio::task::spawn_blocking(move || {
            check_folder(&folder, store_bytes + dir_bytes(&media_dir))
        })
        .await
        .map_err(|e| BackupsError::Source(e.to_string()))??;
    }
    let mut rx = super::stream(hub).map_err(|e| BackupsError::Source(e.to_string()))?;
    let keep = plan.keep;
    tokio::task::spawn_blocking(move || {
        let name = format!(
            "{PREFIX}{}{SUFFIX}",
            chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ")
        );
        let partial = folder.join(format!(".{name}.partial"));
        let path = folder.join(&name);
        let written = (|| {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&partial)
                .map_err(|e| BackupsError::NotWritable(folder.clone(), e))?;
            let out = std::io::BufWriter::with_capacity(super::CHUNK, file);
            let mut sealer = Sealer::new(out, &key, &extras)?;
            while let Some(chunk) = rx.blocking_recv() {
                let chunk = chunk.map_err(|e| BackupsError::Source(e.to_string()))?;
                sealer
                    .write_all(&chunk)
                    .map_err(|e| BackupsError::NotWritable(folder.clone(), e))?;
            }
            let synced = sealer
                .finish()?
                .into_inner()
                .map_err(|e| e.into_error())
                .and_then(|f| f.sync_all());
            synced.map_err(|e| BackupsError::NotWritable(folder.clone(), e))?;
            std::fs::rename(&partial, &path)
                .and_then(|_| crate::atomic_file::sync_dir(&folder))
                .map_err(|e| BackupsError::NotWritable(folder.clone(), e))
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        prune(&folder, keep);
        let meta = std::fs::metadata(&path).map_err(|e| BackupsError::NotWritable(folder, e))?;
        Ok(Listed {
            name,
            bytes: meta.len(),
            made: meta.modified().unwrap_or_else(|_| SystemTime::now()),
        })
    })
    .await
    .map_err(|e| BackupsError::Source(e.to_string()))?
}

/// Bytes of the files directly in `dir` (the media files: the backup's other part).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Whether a backup of about `need` bytes can go to `folder`: it exists, is a folder, is the
/// USB stick (not the mount point beneath it) when it is meant to be one, and has room.
/// Writability is found when the file is created.
pub fn check_folder(folder: &Path, need: u64) -> Result<(), BackupsError> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::metadata(folder) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(BackupsError::Missing(folder.to_owned()))
        }
        Err(e) => return Err(BackupsError::NotWritable(folder.to_owned(), e)),
    };
    if !meta.is_dir() {
        return Err(BackupsError::NotAFolder(folder.to_owned()));
    }
    let text = folder.to_string_lossy();
    if REMOVABLE_ROOTS.iter().any(|r| text.starts_with(r)) {
        let root = std::fs::metadata("/").map(|m| m.dev()).ok();
        if root == Some(meta.dev()) {
            return Err(BackupsError::NotMounted(folder.to_owned()));
        }
    }
    let free = crate::disk::free_bytes(folder)
        .map_err(|e| BackupsError::NotWritable(folder.to_owned(), e))?;
    let need = need + FOLDER_RESERVE_BYTES;
    if free < need {
        return Err(BackupsError::NoRoom {
            folder: folder.to_owned(),
            free: crate::store::human_bytes(free),
            need: crate::store::human_bytes(need),
        });
    }
    Ok(())
}

/// The backups in `folder`, newest first.
pub fn list(folder: &Path) -> std::io::Result<Vec<Listed>> {
    let mut out: Vec<Listed> = std::fs::read_dir(folder)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            if !is_backup_name(&name) {
                return None;
            }
            let meta = e.metadata().ok()?;
            Some(Listed {
                name,
                bytes: meta.len(),
                made: meta.modified().ok()?,
            })
        })
        .collect();
    out.sort_by(|a, b| b.name.cmp(&a.name));
    Ok(out)
}

/// A name this module writes (and nothing with a path in it).
pub fn is_backup_name(name: &str) -> bool {
    name.starts_with(PREFIX)
        && name.ends_with(SUFFIX)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
}

/// Deletes the oldest backups beyond `keep`, and partial files a power cut left.
fn prune(folder: &Path, keep: u32) {
    if let Ok(listed) = list(folder) {
        for old in listed.iter().skip(keep as usize) {
            if let Err(e) = std::fs::remove_file(folder.join(&old.name)) {
                tracing::warn!("cannot delete the old backup {}: {e}", old.name);
            }
        }
    }
    remove_partials(folder);
}

/// Deletes the partial files a power cut or a kill left mid-backup (never listed or restored).
fn remove_partials(folder: &Path) {
    if let Ok(entries) = std::fs::read_dir(folder) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!(".{PREFIX}")) && name.ends_with(".partial") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = crate::atomic_file::sync_dir(folder);
}

/// Whether a scheduled backup is due: the newest in the folder is older than the interval,
/// and the last failure (if any) is older than `limits.backup_retry_secs`.
fn due(state: &Backups, plan: &Plan, limits: &Limits) -> bool {
    let (Some(interval), Some(folder)) = (plan.interval(limits), &plan.folder) else {
        return false;
    };
    if let Some(failed) = state.failed_at.get() {
        if failed.elapsed() < Duration::from_secs(limits.backup_retry_secs) {
            return false;
        }
    }
    let newest = list(folder).ok().and_then(|l| l.first().map(|b| b.made));
    match newest {
        None => true,
        Some(made) => SystemTime::now()
            .duration_since(made)
            .map(|age| age >= interval)
            .unwrap_or(true),
    }
}

/// The schedule: every `limits.backup_check_secs`, reads the saved plan and makes a backup
/// when one is due, until the gateway stops.
async fn schedule(state: Rc<Backups>, hub: Rc<Hub>, mut stop: crate::shutdown::Listener) {
    let sources = &state.sources;
    let limits = hub.limits().clone();
    let check = Duration::from_secs(limits.backup_check_secs);
    // What a backup cut by the last stop left in the folder goes at start, not at the next
    // backup; on a blocking thread, which a hung stick may hold, never the loop.
    let folder = Plan::load(&sources.data_dir, &limits)
        .ok()
        .and_then(|p| p.folder);
    if let Some(folder) = folder {
        drop(tokio::task::spawn_blocking(move || {
            remove_partials(&folder)
        }));
    }
    loop {
        tokio::select! {
            _ = tokio::time::sleep(check) => {}
            _ = stop.recv() => return,
        }
        let plan = match Plan::load(&sources.data_dir, &limits) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("scheduled backups: {e}");
                continue;
            }
        };
        if state.running() || !due(&state, &plan, &limits) {
            continue;
        }
        tokio::select! {
            _ = state.back_up_now(&hub, &plan) => {}
            _ = stop.recv() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_names_are_listed_and_pruned_newest_kept() {
        let dir = tempfile::tempdir().unwrap();
        for n in 1..=4 {
            let name = format!("{PREFIX}2026120{n}T000000.000Z{SUFFIX}");
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        std::fs::write(dir.path().join("holiday.jpg"), b"x").unwrap();
        std::fs::write(dir.path().join(format!(".{PREFIX}x.age.partial")), b"x").unwrap();
        prune(dir.path(), 2);
        let left: Vec<_> = list(dir.path())
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(
            left,
            [
                format!("{PREFIX}20261204T000000.000Z{SUFFIX}"),
                format!("{PREFIX}20261203T000000.000Z{SUFFIX}")
            ]
        );
        assert!(dir.path().join("holiday.jpg").exists());
        assert!(!is_backup_name("iris-backup-../../x.age"));
    }
}
