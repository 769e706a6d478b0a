//! Sessions as live objects: the per-session actor that owns a session and drives its runs,
//! the registry of live actors, and the replay-then-live event stream.
//!
//! Only a session's actor mutates it (invariant 1); everything else talks to the actor through
//! its mailbox. Reads that need no owner (lists, pages of events or messages) go straight to
//! the store.

mod actor;
mod coordination;
mod registry;
mod stream;

pub use actor::Compacted;
pub use registry::{
    CancelOutcome, NewSession, RunRequest, RunStarted, SessionContext, Sessions, Subscription,
};
pub use stream::EventStream;

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session not found")]
    NotFound,
    /// The session's state does not allow the request (a run is active, nothing to resume…).
    #[error("{detail}")]
    Conflict { kind: &'static str, detail: String },
    #[error("{0}")]
    BadInput(String),
    /// The model provider failed (a compaction's summary request).
    #[error("{0}")]
    Upstream(String),
    /// The actor stopped before handling the request; the request goes to its successor.
    #[error("the session's actor stopped")]
    Retired,
    /// The process runs as many runs as it may; retry later.
    #[error("{0}")]
    TooBusy(String),
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Store(#[from] StoreError),
}
