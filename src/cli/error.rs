//! What a command can fail with, and the helpers every command shares to reach the store or
//! the running gateway.

use std::path::Path;
use std::time::Duration;

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
}

/// An answer that is not the one asked for: the gateway's own refusal, or a mismatch (a gateway
/// of another version on the same data dir).
pub fn refusal(answer: ControlResponse) -> CliError {
    match answer {
        ControlResponse::Error { message } => CliError::Refused(message),
        other => CliError::Refused(format!("unexpected answer {other:?}")),
    }
}

/// The store, opened by the command itself because no gateway runs (it holds sled's lock).
pub fn open_offline(data_dir: &Path) -> Result<Store, CliError> {
    Ok(Store::open(data_dir, 1 << 20, Duration::from_secs(5))?)
}
