//! The backups wing: everything about a backup, whichever door asks for it (the control
//! socket's `backup`, the admin page, the command line, the schedule, a start).
//!
//! - `make.rs`: making one (the store's snapshot on the event loop, then its media from a
//!   worker thread) as a stream, into a writer, or offline.
//! - `command_file.rs`: the file `iris-gateway backup` writes, checked before it is named.
//! - `restore.rs`: putting one back offline, checking one, building an upload for the
//!   restart and the restore at start ([`apply_pending_restore`], before the store opens).
//! - `restore_file.rs`: a file given to restore, plain or sealed, for the command and the
//!   admin page's restore job.
//! - `schedule.rs`: the schedule ([`Backups`]: its one slot, its last outcome, its task),
//!   the folder's checks and keeping N.
//! - `sealed.rs`, `age_v1.rs`: the scheduled backups' file, sealed in the age v1 format.
//!
//! The file format itself is the store's read and write (`store/backup.rs`); this wing is its
//! one caller. The doors only parse their input and call the wing: `control/backup.rs`,
//! `admin/backups.rs`, `admin/transfer.rs`, `admin/restore_job.rs` and `cli/backup.rs`.

pub mod age_v1;
mod command_file;
mod make;
mod restore;
mod restore_file;
mod schedule;
pub mod sealed;

pub use crate::store::backup::{Header, MAGIC};
pub use command_file::{copy_synced, write_checked};
pub use make::{io, store_part, stream, write_offline, Error, StorePart, CHUNK};
pub use restore::{
    apply_pending_restore, confirm_pending, restore, verify, Counts, Probe, Restored, RECEIVED_PART,
};
pub use restore_file::{
    format_of, restore_room, restore_sealed, stage_for_restart, Format, NoRoom, StageError, FOREIGN,
};
pub use schedule::{
    check_folder, is_backup_name, list, Backups, BackupsError, Every, Listed, Outcome, Plan,
    SavePlanError,
};
