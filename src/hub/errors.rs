//! The hub's two error types: a `Refusal` is what a request gets back as an `error` frame, a
//! `CommitError` is why changes did not become durable. Both keep their kind, so the reply's
//! code is chosen from it rather than from a message.

use std::rc::Rc;

use crate::protocol::ErrorCode;
use crate::store::StoreError;

/// A refusal to send back as an `error` frame: the kind of mistake (`error.code`) and what to
/// tell the user about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }

    /// The token is unknown or revoked, or the hello is otherwise not acceptable.
    pub fn auth(message: impl Into<String>) -> Refusal {
        Refusal::new(ErrorCode::Auth, message)
    }

    /// What the request names does not exist (or not where it says).
    pub fn not_found(message: impl Into<String>) -> Refusal {
        Refusal::new(ErrorCode::NotFound, message)
    }

    /// Over a limit the app can wait out.
    pub fn rate_limited(message: impl Into<String>) -> Refusal {
        Refusal::new(ErrorCode::RateLimited, message)
    }

    /// A request the gateway does not accept as sent (bad value, over a size limit).
    pub fn unsupported(message: impl Into<String>) -> Refusal {
        Refusal::new(ErrorCode::Unsupported, message)
    }

    /// The store failed while answering; the request itself may be fine.
    pub fn internal(e: impl std::fmt::Display) -> Refusal {
        Refusal::new(ErrorCode::Internal, format!("storage error: {e}"))
    }
}

/// A commit that failed is the gateway's fault whatever its kind: the wire has one code for it
/// (`internal`), and the message says which (a storage failure, or the gateway stopping).
impl From<CommitError> for Refusal {
    fn from(e: CommitError) -> Refusal {
        let code = match &e {
            CommitError::Store(_) | CommitError::ShuttingDown => ErrorCode::Internal,
        };
        Refusal::new(code, e.to_string())
    }
}

/// Why a commit did not happen, keeping the store's own error (its kind, not only its text).
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The store refused the changes, or could not make them durable. Shared: one failed
    /// flush fails every job of its group.
    #[error("storage error: {0}")]
    Store(Rc<StoreError>),
    /// The committer is gone: the gateway is stopping.
    #[error("the gateway is shutting down")]
    ShuttingDown,
}

impl From<StoreError> for CommitError {
    fn from(e: StoreError) -> CommitError {
        CommitError::Store(Rc::new(e))
    }
}
