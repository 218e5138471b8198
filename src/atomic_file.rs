//! Small files written whole or not at all. Several parts of the gateway keep a file that a
//! power cut must never leave half-written (the store's witness, the TLS key and certificate,
//! the admin owner and saved settings); they all write it the one way below.

use std::io::Write;
use std::path::Path;

/// Writes `path` so that after a crash it holds either its old or its new content: a
/// temporary file beside it (made afresh with `mode`), fsynced, renamed over it, and the directory
/// fsynced so the rename itself survives. The temporary file is removed on failure.
pub fn write(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    // A leftover from a crash could carry another mode, which opening it would keep.
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// fsyncs a directory: what makes a new name or a rename in it durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_the_content_with_the_mode_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner.json");
        write(&path, b"old", 0o600).unwrap();
        write(&path, b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!dir.path().join("owner.json.tmp").exists());
    }
}
