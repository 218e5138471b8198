//! Which `MEDIA:` paths may be read, and the reading itself.

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
        let bytes = self.read_checked(&real, &shown)?;
        let filename = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "file".into());
        let (mime, kind) = kind_of(&filename, &bytes, voice);
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

    /// Opens without following a symlink swapped in since the check, and reads a regular file
    /// within the limit.
    fn read_checked(&self, real: &Path, shown: &str) -> Result<Vec<u8>, Refusal> {
        use std::os::unix::fs::OpenOptionsExt;
        let unreadable = |e: std::io::Error| Refusal::Unreadable(shown.to_owned(), e.to_string());
        let file = std::fs::OpenOptions::new()
            .read(true)
            // O_NONBLOCK: a FIFO put there must not hang the worker on open.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(real)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => Refusal::Outside(shown.to_owned()),
                _ => unreadable(e),
            })?;
        let meta = file.metadata().map_err(unreadable)?;
        if !meta.is_file() {
            return Err(Refusal::NotRegular(shown.to_owned()));
        }
        // Where the open file really is: a folder on the way swapped for a symlink after the
        // check would show here.
        if let Ok(now) = std::fs::read_link(format!("/proc/self/fd/{}", raw_fd(&file))) {
            if self.allowed_root(&now).is_none() {
                return Err(Refusal::Outside(shown.to_owned()));
            }
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

fn raw_fd(file: &std::fs::File) -> i32 {
    use std::os::fd::AsRawFd;
    file.as_raw_fd()
}

/// A path as shown in a note: no control characters, bounded.
fn shown_path(raw: &str) -> String {
    raw.chars().filter(|c| !c.is_control()).take(300).collect()
}
