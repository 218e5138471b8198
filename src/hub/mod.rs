//! The hub: the single owner of live state (connected devices, lanes, running turns).
//!
//! It turns decoded requests into store changes and fan-out. Everything that must survive goes
//! through the committer (`commit.rs`) first, which makes it durable and only then publishes it,
//! in cursor order, to every connected device. Ephemeral frames (typing, streaming updates) are
//! fanned out directly. The hub runs on the one event-loop thread, so its state sits in a
//! `RefCell` that is never borrowed across an `.await`.
//!
//! `state.rs` is the base (the `Hub`, the services it owns, fan-out and health, and one accessor
//! for each service the doors above call); `router.rs` dispatches requests; `commit.rs` is the
//! committer. Every other file holds one service with its own state (`Devices`, `Commands`,
//! `Queries`, `Media`, ..., and `turns/`), which reaches back through the core `Port`
//! (`port.rs`) and its own narrow port beside it, implemented for the `Hub` in `hub_port.rs`
//! (`turn_port.rs` for the turns). This file only declares them and names the hub's public face.

mod agent_calls;
mod approvals;
mod automation;
mod budget;
mod choices;
mod commands;
mod commit;
mod devices;
mod directory;
mod errors;
mod fanout;
mod health;
mod hub_port;
mod jobs;
mod media;
mod message_send;
mod port;
mod push;
mod read_marks;
mod router;
mod search;
mod state;
mod status;
mod storage;
mod turn_port;
mod turns;
mod unsettled;
mod update;

/// For the fuzz targets: the webhook body parser is pure.
pub use automation::parse_webhook_body;
pub use automation::{Automation, AutomationError, HookError};
pub use devices::{new_device, Devices, TestPushError, TestTarget};
pub use errors::{CommitError, Refusal};
pub use media::MediaHold;
pub use state::{Hub, Origin};
pub use status::{Status, StatusReport};
