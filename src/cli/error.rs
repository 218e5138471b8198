//! What a command can fail with, and the helpers every command shares to reach the store or
//! the running gateway.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::default_data_dir;
use crate::control::ControlResponse;
use crate::store::Store;

/// Why a command failed: printed after `iris-gateway: ` and the exit status is 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("cannot talk to the running gateway: {0}")]
    Control(#[from] std::io::Error),
    #[error("the gateway refused: {0}")]
    Refused(String),
    #[error("no device `{0}`")]
    NoSuchDevice(String),
    #[error("the pairing page is served by the running gateway, and none runs from this data dir (start it, or pair here without --page)")]
    PageNeedsGateway,
    /// A read-only command pointed at a directory without a store: it makes none, and says
    /// where the gateway's store probably is.
    #[error("there is no gateway store in {} (nothing was created there). {elsewhere}", .dir.display())]
    NoStore { dir: PathBuf, elsewhere: String },
}

/// An answer that is not the one asked for: the gateway's own refusal, or a mismatch (a gateway
/// of another version on the same data dir).
pub fn refusal(answer: ControlResponse) -> CliError {
    match answer {
        ControlResponse::Error { message } => CliError::Refused(message),
        other => CliError::Refused(format!("unexpected answer {other:?}")),
    }
}

/// The data dir a command works on (its `--data-dir`, else the default), recorded so the
/// commands it prints carry it too.
pub fn data_dir(flag: Option<PathBuf>) -> PathBuf {
    let dir = flag.unwrap_or_else(default_data_dir);
    crate::hints::Invocation::new(&dir, None, None).install();
    dir
}

/// Refuses a directory that holds no store, for the commands that only read one: opening it
/// would make an empty store there, and the command would answer about that instead of the
/// gateway the owner meant.
pub fn require_store(dir: &Path) -> Result<(), CliError> {
    if crate::store::exists_in(dir) {
        return Ok(());
    }
    // Where a gateway of this machine keeps its store when not told otherwise: the user's
    // default, then the service's.
    let probable = [default_data_dir(), PathBuf::from(SERVICE_DATA_DIR)]
        .into_iter()
        .find(|d| d != dir && crate::store::exists_in(d));
    let elsewhere = match probable {
        Some(other) => format!(
            "A gateway store is in {0}: add --data-dir {0} (the data dir the gateway runs with).",
            other.display()
        ),
        None => "Give the --data-dir the gateway runs with, or start the gateway there first."
            .to_owned(),
    };
    Err(CliError::NoStore {
        dir: dir.to_owned(),
        elsewhere,
    })
}

/// The data dir of the packaged service (systemd's `StateDirectory`).
const SERVICE_DATA_DIR: &str = "/var/lib/iris-gateway";

/// The store, opened by the command itself because no gateway runs (it holds sled's lock).
pub fn open_offline(data_dir: &Path) -> Result<Store, CliError> {
    Ok(Store::open(data_dir, 1 << 20, Duration::from_secs(5))?)
}
