//! Which `MEDIA:` paths may be read, and the reading itself: the checks run on the resolved
//! path, and again on the file that was opened (a path can change between the two).

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use super::file_kind::kind_of;
use super::{OutFile, Refusal};

/// System places never read, whatever `media_dirs` says, unless an allowed folder itself lies
/// inside one (the owner chose it). Hermes' `_MEDIA_DELIVERY_DENIED_PREFIXES`, plus `/run`.
const DENIED_PREFIXES: &[&str] = &[
    "/etc", "/proc", "/sys", "/dev", "/root", "/boot", "/var/log", "/var/lib", "/var/run", "/run",
];
/// Credential folders: never read wherever they are (Hermes' `_MEDIA_DELIVERY_DENIED_HOME_SUBPATHS`
/// and `_ROOT_CREDENTIAL_DIRS`).
const DENIED_DIRS: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".kube",
    ".docker",
    ".azure",
    ".gcloud",
    ".password-store",
    "mcp-tokens",
];
/// Credential files: never read wherever they are (Hermes' `_ROOT_CREDENTIAL_FILES`, and the
/// usual key files).
const DENIED_FILES: &[&str] = &[
    ".env",
    "auth.json",
    "auth.lock",
    "credentials",
    ".anthropic_oauth.json",
    "google_token.json",
    "google_oauth_pending.json",
    "google_oauth.json",
    "webhook_subscriptions.json",
    "bws_cache.json",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    "id_rsa",
    "id_ecdsa",
    "id_ed25519",
    "id_dsa",
];

/// The folders under `HERMES_HOME` where Hermes 0.19.0 writes what it makes
/// (`MEDIA_DELIVERY_SAFE_ROOTS` in `gateway/platforms/base.py`, through `get_hermes_dir`): image
/// generation (`agent/image_gen_provider.py`), text to speech (`tools/tts_tool.py`), browser
/// screenshots (`tools/browser_tool.py`), MCP images and audio (`tools/mcp_tool.py`) and cached
/// documents, in the current layout and the legacy one.
pub const HERMES_OUTPUT_DIRS: &[&str] = &[
    "cache/images",
    "cache/audio",
    "cache/videos",
    "cache/documents",
    "cache/screenshots",
    "image_cache",
    "audio_cache",
    "video_cache",
    "document_cache",
    "browser_screenshots",
];

/// The folders Hermes' text-to-speech tool writes its audio to (`tools/tts_tool.py`,
/// `DEFAULT_OUTPUT_DIR`), in the current layout and the legacy one.
const HERMES_SPEECH_DIRS: &[&str] = &["cache/audio", "audio_cache"];

/// Whether `real` is audio Hermes' text-to-speech tool made (`tts_<time>.mp3|ogg` in its
/// speech folder): the agent speaking, so a voice. Hermes marks it `[[audio_as_voice]]` only
/// for Telegram; every phone of the gateway plays a voice as one.
fn is_hermes_speech(real: &Path) -> bool {
    let named = real
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("tts_"));
    let folder = real.parent().is_some_and(|dir| {
        HERMES_SPEECH_DIRS
            .iter()
            .any(|speech| dir.ends_with(Path::new(speech)))
    });
    named && folder
}

/// Where `MEDIA:` files may be read from, and how much.
#[derive(Debug, Clone, Default)]
pub struct FilePolicy {
    /// Allowed folders (resolved when a file is read: they may appear later).
    pub dirs: Vec<PathBuf>,
    /// The agent runs on another machine and no folders were configured: its paths are not
    /// on this one.
    pub remote: bool,
    /// The largest file taken: `limits.agent_file_bytes`, and never over `max_media_bytes`.
    pub max_bytes: u64,
    /// Hermes' home: its credential files there are never read.
    pub hermes_home: Option<PathBuf>,
    /// The gateway's own data (store, keys): never read.
    pub data_dir: Option<PathBuf>,
    /// The gateway user's home, for `~/` paths.
    pub home: Option<PathBuf>,
}

/// `$HERMES_HOME`, else `~/.hermes` of the user the gateway runs as.
pub fn default_hermes_home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HERMES_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".hermes"))
}

/// Whether the agent URL names this machine (loopback): only then are its paths ours.
pub fn url_is_local(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    let host = host.to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

impl FilePolicy {
    pub fn from_config(config: &crate::config::Config) -> FilePolicy {
        let a = &config.agent;
        let hermes_home = a.hermes_home.clone().or_else(default_hermes_home);
        let explicit = a.media_dirs.clone();
        let remote = explicit.is_none() && !url_is_local(&a.base_url());
        let dirs = match explicit {
            Some(dirs) => dirs,
            None if remote => Vec::new(),
            None => hermes_home
                .iter()
                .flat_map(|h| HERMES_OUTPUT_DIRS.iter().map(move |d| h.join(d)))
                .collect(),
        };
        FilePolicy {
            dirs,
            remote,
            max_bytes: config
                .limits
                .agent_file_bytes
                .min(config.limits.max_media_bytes),
            hermes_home,
            data_dir: Some(
                config
                    .data_dir
                    .clone()
                    .unwrap_or_else(crate::config::default_data_dir),
            ),
            home: std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from),
        }
    }

    /// One line for the admin page: what of the agent's files reaches the phone.
    pub fn describe(&self) -> String {
        if self.remote {
            return "The agent runs on another machine: only images it puts inline in its \
                    answer reach the phone; files it names with MEDIA: are on its machine and \
                    are left out with a note (set agent.media_dirs to a folder of its files \
                    mounted here to change that)."
                .to_owned();
        }
        if self.dirs.is_empty() {
            return "Files the agent names with MEDIA: are not read (agent.media_dirs is \
                    empty); images it puts inline in its answer reach the phone."
                .to_owned();
        }
        let dirs: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        format!(
            "Files the agent names with MEDIA: (up to {} bytes) reach the phone from: {}; \
             images it puts inline in its answer always do.",
            self.max_bytes,
            dirs.join(", ")
        )
    }

    /// Reads the file a `MEDIA:` tag names, or says why not. Blocking: worker threads only.
    pub fn read(&self, raw: &str, voice: bool) -> Result<OutFile, Refusal> {
        let shown = shown_path(raw);
        if self.remote {
            return Err(Refusal::Remote(shown));
        }
        let expanded = match (raw.strip_prefix("~/"), &self.home) {
            (Some(rest), Some(home)) => home.join(rest),
            _ => PathBuf::from(raw),
        };
        if !expanded.is_absolute() || raw.contains('\0') {
            return Err(Refusal::NotAbsolute(shown));
        }
        // Resolves every symlink: what is checked is where the bytes really are.
        let real = std::fs::canonicalize(&expanded).map_err(|_| Refusal::Missing(shown.clone()))?;
        let Some(root) = self.allowed_root(&real) else {
            return Err(Refusal::Outside(shown));
        };
        if self.denied(&real, &root) {
            return Err(Refusal::Denied(shown));
        }
        let file = open_beneath(&root, &real).map_err(|e| e.refusal(&shown))?;
        let bytes = self.read_opened(file, &real, &shown)?;
        let filename = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "file".into());
        let (mime, kind) = kind_of(&filename, &bytes, voice || is_hermes_speech(&real));
        Ok(OutFile {
            filename,
            mime,
            kind,
            bytes,
        })
    }

    /// The allowed folder (resolved) that holds `real`.
    fn allowed_root(&self, real: &Path) -> Option<PathBuf> {
        self.dirs
            .iter()
            .filter_map(|d| std::fs::canonicalize(d).ok())
            .find(|root| real.starts_with(root) && real != root)
    }

    fn denied(&self, real: &Path, root: &Path) -> bool {
        let prefix = DENIED_PREFIXES
            .iter()
            .map(Path::new)
            .any(|p| real.starts_with(p) && !root.starts_with(p));
        let component = real.components().any(|c| match c {
            Component::Normal(name) => {
                let name = name.to_string_lossy();
                DENIED_DIRS.contains(&name.as_ref())
            }
            _ => false,
        });
        let name = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let file = DENIED_FILES.contains(&name.as_str());
        // Hermes' own settings at the top of its home (config.yaml holds its model keys).
        let hermes_config = self.hermes_home.as_ref().is_some_and(|h| {
            std::fs::canonicalize(h).is_ok_and(|h| {
                real.parent() == Some(h.as_path())
                    || real.starts_with(h.join("pairing"))
                    || real.starts_with(h.join("auth"))
            })
        });
        let own_data = self
            .data_dir
            .as_ref()
            .and_then(|d| std::fs::canonicalize(d).ok())
            .is_some_and(|d| real.starts_with(d));
        prefix || component || file || hermes_config || own_data
    }

    /// Checks what was really opened, then reads it within the limit. The checks before the
    /// open were made on a path; a folder on it may have been swapped (for a symlink, or by a
    /// rename) since, so the whole policy (allowed folder and deny list) runs again on where the
    /// open file really is, as the kernel names it.
    fn read_opened(
        &self,
        file: std::fs::File,
        real: &Path,
        shown: &str,
    ) -> Result<Vec<u8>, Refusal> {
        let unreadable = |e: std::io::Error| Refusal::Unreadable(shown.to_owned(), e.to_string());
        let meta = file.metadata().map_err(unreadable)?;
        if !meta.is_file() {
            return Err(Refusal::NotRegular(shown.to_owned()));
        }
        let opened =
            std::fs::read_link(format!("/proc/self/fd/{}", raw_fd(&file))).map_err(unreadable)?;
        let Some(root) = self.allowed_root(&opened) else {
            return Err(Refusal::Outside(shown.to_owned()));
        };
        if self.denied(&opened, &root) {
            return Err(Refusal::Denied(shown.to_owned()));
        }
        let name = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let too_large = |size| Refusal::TooLarge {
            name: name.clone(),
            size,
            max: self.max_bytes,
        };
        if meta.len() > self.max_bytes {
            return Err(too_large(meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.take(self.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(too_large(bytes.len() as u64));
        }
        Ok(bytes)
    }
}

/// Why a file could not be opened beneath its allowed folder.
#[derive(Debug, thiserror::Error)]
pub(super) enum OpenError {
    /// A symlink (or a non-folder) where the checked path had a folder: the path changed
    /// since it was checked.
    #[error("a symlink on the way")]
    Symlink,
    #[error("no such file")]
    Missing,
    #[error(transparent)]
    Io(std::io::Error),
}

impl OpenError {
    fn from_errno(e: std::io::Error) -> OpenError {
        match e.raw_os_error() {
            // ELOOP: a symlink met with symlinks refused; EXDEV: a way out of the folder;
            // ENOTDIR: a symlink (not followed) or a file where a folder was.
            Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR) => OpenError::Symlink,
            Some(libc::ENOENT) => OpenError::Missing,
            _ => OpenError::Io(e),
        }
    }

    fn refusal(self, shown: &str) -> Refusal {
        match self {
            OpenError::Symlink => Refusal::Outside(shown.to_owned()),
            OpenError::Missing => Refusal::Missing(shown.to_owned()),
            OpenError::Io(e) => Refusal::Unreadable(shown.to_owned(), e.to_string()),
        }
    }
}

/// Flags of the file's own open. `O_NONBLOCK`: a FIFO put there must not hang the worker.
const FILE_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

/// Opens `real` (a resolved path inside `root`) from `root` down, following no symlink at all:
/// the path was resolved when it was checked, so a symlink met now is one swapped in since.
/// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` where the kernel has it (Linux 5.6),
/// else one `openat(O_NOFOLLOW)` per component.
pub(super) fn open_beneath(root: &Path, real: &Path) -> Result<std::fs::File, OpenError> {
    let rel = real.strip_prefix(root).map_err(|_| OpenError::Symlink)?;
    let root_fd = open_at(
        libc::AT_FDCWD,
        root.as_os_str(),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )?;
    match openat2_beneath(&root_fd, rel) {
        // No `openat2`: an older kernel (ENOSYS), or a container's seccomp filter that refuses
        // system calls it does not know (EPERM, as older Docker profiles do).
        Err(OpenError::Io(e)) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
            walk_beneath(root_fd, rel)
        }
        other => other,
    }
}

fn openat2_beneath(root: &std::os::fd::OwnedFd, rel: &Path) -> Result<std::fs::File, OpenError> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let path = c_path(rel.as_os_str())?;
    // SAFETY: `open_how` is plain integers; zero is "no flags" for each.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = FILE_FLAGS as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: a valid directory fd, a NUL-terminated path and a live `open_how` of the size
    // passed; the kernel returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(OpenError::from_errno(std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just gave us this fd, owned by nothing else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd as i32) })
}

/// The walk for kernels without `openat2`: each folder opened from the one before with
/// `O_NOFOLLOW | O_DIRECTORY` (a symlink there fails with `ENOTDIR`), then the file.
pub(super) fn walk_beneath(
    root: std::os::fd::OwnedFd,
    rel: &Path,
) -> Result<std::fs::File, OpenError> {
    use std::os::fd::AsRawFd;
    let names: Vec<&std::ffi::OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(OpenError::Symlink),
        })
        .collect::<Result<_, _>>()?;
    let Some((last, folders)) = names.split_last() else {
        return Err(OpenError::Missing);
    };
    let mut dir = root;
    for name in folders {
        dir = open_at(
            dir.as_raw_fd(),
            name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )?;
    }
    open_at(dir.as_raw_fd(), last, FILE_FLAGS).map(std::fs::File::from)
}

fn open_at(
    dir: libc::c_int,
    name: &std::ffi::OsStr,
    flags: libc::c_int,
) -> Result<std::os::fd::OwnedFd, OpenError> {
    use std::os::fd::FromRawFd;
    let path = c_path(name)?;
    // SAFETY: a NUL-terminated path; `dir` is a live fd or AT_FDCWD.
    let fd = unsafe { libc::openat(dir, path.as_ptr(), flags) };
    if fd < 0 {
        return Err(OpenError::from_errno(std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just gave us this fd, owned by nothing else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

fn c_path(p: &std::ffi::OsStr) -> Result<std::ffi::CString, OpenError> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_bytes()).map_err(|_| OpenError::Missing)
}

fn raw_fd(file: &std::fs::File) -> i32 {
    use std::os::fd::AsRawFd;
    file.as_raw_fd()
}

/// A path as shown in a note: no control characters, bounded.
fn shown_path(raw: &str) -> String {
    raw.chars().filter(|c| !c.is_control()).take(300).collect()
}
