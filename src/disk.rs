//! What the file system holding a path has room for: one `statvfs`, read the same way by the
//! store's reserve, the media quota, backups, updates, `/status` and the Health page.
//!
//! `statvfs` on a failing SD card can take seconds: callers on the event loop run it on a
//! blocking thread, as they did before this helper.

use std::io;
use std::path::Path;

/// One look at a file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes an unprivileged writer may still use (`f_bavail`: the root-only reserve excluded).
    pub free: u64,
    /// The file system's size in bytes.
    pub total: u64,
    /// Mounted read-only: no write can succeed whatever the free space says.
    pub read_only: bool,
}

/// The file system holding `path`. A path with a NUL byte is `InvalidInput` (no OS error).
pub fn space(path: &Path) -> io::Result<Space> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a valid C string and `st` a properly sized, writable struct.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // The block counts are in fragments (`f_frsize`), not in `f_bsize` units.
    let fragment = st.f_frsize as u64;
    Ok(Space {
        free: (st.f_bavail as u64).saturating_mul(fragment),
        total: (st.f_blocks as u64).saturating_mul(fragment),
        read_only: st.f_flag & libc::ST_RDONLY != 0,
    })
}

/// Bytes an unprivileged writer may still use on the file system holding `path`.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    space(path).map(|s| s.free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_folder_has_a_size_and_room_within_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = space(dir.path()).unwrap();
        assert!(s.total > 0 && s.free <= s.total);
        assert!(!s.read_only);
        // Others write to the same disk meanwhile: the second look is only bounded.
        assert!(free_bytes(dir.path()).unwrap() <= s.total);
    }

    #[test]
    fn a_missing_path_and_a_nul_byte_are_errors_of_their_kind() {
        let dir = tempfile::tempdir().unwrap();
        let gone = space(&dir.path().join("none")).unwrap_err();
        assert_eq!(gone.raw_os_error(), Some(libc::ENOENT));
        let nul = space(Path::new("a\0b")).unwrap_err();
        assert_eq!(
            (nul.kind(), nul.raw_os_error()),
            (io::ErrorKind::InvalidInput, None)
        );
    }
}
