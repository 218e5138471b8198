//! The backup file `iris-gateway backup FILE` writes: as `FILE.partial` beside its name, read
//! back end to end (a backup that cannot be restored is not written as `FILE`), then renamed
//! durably.

use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};

use super::make::{io, Error, CHUNK};
use super::restore::{verify, Counts};
use crate::store::backup::Header;

/// A backup written to the file `file` by `fill` (from a running gateway's stream, or from the
/// store), as `FILE.partial` beside it; read back end to end (a backup that cannot be restored
/// is not written as `file`), then renamed to `file` durably. Nothing is left behind when any
/// step fails. Returns what `fill` said, the header and what the file holds.
pub fn write_checked<T>(
    file: &Path,
    fill: impl FnOnce(std::fs::File) -> Result<T, Error>,
) -> Result<(T, Header, Counts), Error> {
    let partial = partial_path(file);
    let result = (|| {
        let out = std::fs::File::create(&partial)
            .map_err(io(format!("cannot create {}", partial.display())))?;
        let filled = fill(out)?;
        let name = file.display().to_string();
        let (header, counts) = verify(&name, &partial)?;
        put_in_place(&partial, file)?;
        Ok((filled, header, counts))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Copies a backup's bytes from `from` (a running gateway's stream) into `out`, synced.
pub fn copy_synced(from: &mut impl Read, out: std::fs::File) -> Result<(), Error> {
    let mut out = BufWriter::with_capacity(CHUNK, out);
    std::io::copy(from, &mut out).map_err(io("reading the backup from the gateway"))?;
    out.into_inner()
        .map_err(|e| Error::Io {
            what: "writing the backup".into(),
            source: e.into_error(),
        })?
        .sync_all()
        .map_err(io("writing the backup"))
}

/// The checked `partial` becomes `file`, durably (the directory entry synced too).
fn put_in_place(partial: &Path, file: &Path) -> Result<(), Error> {
    let name = file.display();
    std::fs::rename(partial, file).map_err(io(format!("cannot rename to {name}")))?;
    if let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(io(format!("cannot sync {}", parent.display())))?;
    }
    Ok(())
}

/// `FILE.partial` beside `FILE`: on the same file system, so the rename is atomic.
fn partial_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    file.with_file_name(name)
}
