//! `iris-gateway backup FILE` and `iris-gateway restore FILE`: the command's half.
//!
//! `backup` asks the running gateway for the backup over the control socket, or has the backups
//! wing write it from the store itself when none runs; either way the wing writes `FILE.partial`,
//! checks it end to end, fsyncs it and only then renames it to `FILE` (`backups/make.rs`).
//! `restore` is the wing's (`backups/restore.rs`), reported here.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use super::args::{BackupArgs, RestoreArgs};
use crate::backups::{self, io, Counts, Error, Header, Restored, CHUNK, MAGIC};
use crate::control::backup::STALLED_READER;
use crate::control::{client, socket_path, ControlRequest, ControlResponse};
use crate::store::human_bytes;

/// Writes the backup to `FILE.partial`, checks it and renames it to `FILE`; nothing is left
/// behind when any step fails.
pub fn run_backup(args: BackupArgs) -> Result<(), Error> {
    let dir = super::error::data_dir(args.data_dir);
    let file = args.file;
    let (from_gateway, header, counts) =
        backups::write_checked(&file, |out| match fetch_from_gateway(&dir)? {
            Some(mut stream) => {
                backups::copy_synced(&mut stream, out)?;
                Ok(true)
            }
            None => {
                backups::write_offline(&dir, out)?;
                Ok(false)
            }
        })?;
    report_backup(&dir, &file, from_gateway, &header, &counts);
    Ok(())
}

/// What was backed up, and how to restore it.
fn report_backup(dir: &Path, file: &Path, from_gateway: bool, header: &Header, counts: &Counts) {
    let name = file.display();
    let size = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    println!(
        "Backed up {} ({}) to {name}: {} records, cursor {}, {} media file(s) ({}){}.",
        dir.display(),
        if from_gateway {
            "from the running gateway"
        } else {
            "the gateway was not running"
        },
        counts.entries,
        header.cursor_head,
        counts.media,
        human_bytes(counts.media_bytes),
        if counts.media < header.media_files {
            format!(
                "; {} media file(s) were missing from {} and are not in it",
                header.media_files - counts.media,
                dir.join("media").display()
            )
        } else {
            String::new()
        }
    );
    println!(
        "{} in all. Restore it with: {}",
        human_bytes(size),
        crate::hints::command(&format!("restore {name}"))
    );
}

/// Asks a running gateway for a backup: the byte stream, or `None` when none runs.
fn fetch_from_gateway(dir: &Path) -> Result<Option<impl Read>, Error> {
    let reach = |e| {
        io(format!(
            "cannot reach the gateway at {}",
            socket_path(dir).display()
        ))(e)
    };
    let Some(mut stream) = client::connect(dir).map_err(reach)? else {
        return Ok(None);
    };
    stream
        .set_read_timeout(Some(STALLED_READER * 6))
        .map_err(io("control socket"))?;
    client::send(&mut stream, &ControlRequest::Backup)
        .map_err(io("asking the gateway for a backup"))?;
    let mut reader = BufReader::with_capacity(CHUNK, stream);
    let first = reader
        .fill_buf()
        .map_err(io("reading the gateway's answer"))?
        .first()
        .copied();
    match first {
        Some(b) if b == MAGIC[0] => Ok(Some(reader)),
        Some(b'{') => {
            let mut line = String::new();
            reader
                .read_line(&mut line)
                .map_err(io("reading the gateway's answer"))?;
            let message = match serde_json::from_str(&line) {
                Ok(ControlResponse::Error { message }) => message,
                _ => format!("unexpected answer: {line}"),
            };
            Err(Error::Refused(format!("the gateway refused: {message}")))
        }
        _ => Err(Error::Refused(
            "the gateway closed the control socket without sending a backup (see its log)".into(),
        )),
    }
}

/// Restores the backup and says what became of the store that was there.
pub fn run_restore(args: RestoreArgs) -> Result<(), Error> {
    let dir = super::error::data_dir(args.data_dir);
    let done = if backups::sealed::is_sealed(&args.file) {
        super::restore_sealed::restore_sealed(&dir, &args.file, args.passphrase_file.as_deref())?
    } else {
        backups::restore(&dir, &args.file, crate::control::answering)?
    };
    report_restore(&args.file, &dir, &done);
    Ok(())
}

/// What was restored, and where the previous store went.
fn report_restore(file: &Path, dir: &Path, done: &Restored) {
    let header = &done.header;
    let made = chrono::DateTime::from_timestamp_millis(header.created_ms)
        .map(|t| {
            t.with_timezone(&chrono::Local)
                .format("%Y-%m-%d %H:%M")
                .to_string()
        })
        .unwrap_or_default();
    println!(
        "Restored {} (made {made} by iris-gateway {}) into {}: cursor {}, {} media file(s) ({}).",
        file.display(),
        header.gateway_version,
        dir.display(),
        header.cursor_head,
        done.counts.media - done.bad_media.len() as u64,
        human_bytes(done.counts.media_bytes),
    );
    if !done.bad_media.is_empty() {
        println!(
            "{} media file(s) in the backup did not match their checksum and were left out: {}",
            done.bad_media.len(),
            done.bad_media.join(", ")
        );
    }
    if done.moved.is_empty() {
        println!("There was no store there before.");
    } else {
        println!(
            "The previous {} was moved to {} (delete it once you are happy with the restore).",
            done.moved.join(", "),
            done.aside.display()
        );
    }
    println!("Start the gateway to use it.");
}
