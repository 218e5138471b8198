//! The port: the narrow way a service of the hub reaches back to the hub for what it does not
//! own (the committer, the health, the lanes). The services take it as a parameter instead of
//! being `impl Hub` blocks, so each one's state stays private and what it may ask of the rest
//! is this core plus its own port beside it (`trait CommandsPort: Port`, ...), which names only
//! what that service asks. `hub_port.rs` implements them all for `Hub`.

use std::rc::{Rc, Weak};

use super::errors::{CommitError, Refusal};
use super::health::Causes;
use crate::outlet::ConnId;
use crate::protocol::{Channel, Frame, HealthState, Lane};
use crate::store::Change;

/// How a commit answers the device that asked for it: `frame` (the broadcast frame carrying the
/// request's `id`) instead of the broadcast frame at index `at`.
pub struct Reply {
    pub(super) conn: ConnId,
    pub(super) at: usize,
    pub(super) frame: Frame,
}

/// What most of the hub's services ask of it: the committer, the health, and the lanes. Each
/// service that needs more is bounded by its own port extending this one (`CommandsPort`,
/// `DevicesPort`, ... beside the service), which lists only what that service asks. Public only
/// so that the services the doors above the hub call (`Devices`, `Status`, `Automation`) may be
/// bounded by it; it is named nowhere outside the hub, and only the hub implements it, on the
/// one event-loop thread (so its futures need no `Send` bound, which is what
/// `async_fn_in_trait` warns about).
#[allow(async_fn_in_trait)]
pub trait Port {
    /// Makes `changes` durable and publishes their outbox frames (the committer), answering the
    /// requester with `reply` if there is one.
    async fn commit(&self, changes: Vec<Change>, reply: Option<Reply>) -> Result<(), CommitError>;

    /// Queues `changes` for the committer without waiting (`what`: for the log).
    fn commit_soon(&self, changes: Vec<Change>, what: &'static str);

    /// Where live fan-out is.
    fn published_head(&self) -> u64;

    /// Changes a cause of `degraded` (media full, push failing, an update rolled back, the
    /// disk): the hub owns the health and tells the devices when the state moves.
    fn update_health(&self, change: impl FnOnce(&mut Causes));

    /// Reads the causes of `degraded` (whether storage is the one failing).
    fn health_causes<T>(&self, read: impl FnOnce(&Causes) -> T) -> T;

    /// The gateway's health state, as the `status` frame says it.
    fn health_state(&self) -> HealthState;

    /// The lane's channel (and thread) still exist.
    fn lane_exists(&self, lane: &Lane) -> bool;

    /// A frame's `chat_id`/`thread_id` as a lane and its root channel (the directory's rule).
    fn resolve_lane(
        &self,
        chat_id: Option<&str>,
        thread_id: Option<&str>,
    ) -> Result<(Lane, Channel), Refusal>;

    /// Removes the media files that no message refers to any more (after a deletion).
    async fn collect_media(&self, media_ids: &[String]);
}

/// How a service the hub owns and the doors above call (`Devices`, `Media`, ...) holds the hub:
/// weakly, since the hub owns the service (a strong handle would keep both alive for ever), and
/// upgraded for one call at a time.
pub struct Back<P>(Weak<P>);

impl<P> Back<P> {
    pub fn new(hub: Weak<P>) -> Back<P> {
        Back(hub)
    }

    /// The hub, for one call: it owns the service, so it is alive whenever the service is called.
    pub fn hub(&self) -> Rc<P> {
        self.0
            .upgrade()
            .expect("the hub outlives every call into the services it owns")
    }

    /// The weak handle, for a task that must not keep the hub alive.
    pub fn weak(&self) -> Weak<P> {
        self.0.clone()
    }
}
