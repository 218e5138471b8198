//! Real file systems for the disk tests: a small tmpfs mounted for a test (needs root; see
//! [`super::proc::lacks_privilege`]), unmounted on drop, and the commands that set them up.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `cmd` to its end: its stdout, or what it said when it failed.
pub fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A mount point that is unmounted (lazily, so a leftover process cannot block it) on drop.
pub struct Mounted {
    pub at: PathBuf,
    pub _dir: tempfile::TempDir,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Mounts a tmpfs of `size` (e.g. `48m`), mode 0700, on a fresh temporary directory.
pub fn mount_tmpfs(size: &str) -> Result<Mounted, String> {
    let dir = tempfile::Builder::new()
        .prefix("iris-gw-tmpfs-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let at = dir.path().join("mnt");
    std::fs::create_dir(&at).map_err(|e| e.to_string())?;
    run(Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tmpfs",
        ])
        .arg(&at))?;
    Ok(Mounted { at, _dir: dir })
}

/// The bytes free for an unprivileged user on the file system holding `dir` (`u64::MAX` when
/// `df` cannot tell).
pub fn free_bytes(dir: &Path) -> u64 {
    let out = run(Command::new("df").args(["--output=avail", "-B1"]).arg(dir)).unwrap_or_default();
    out.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(u64::MAX)
}
