//! Devices as a service: [`Devices`] checks a hello's token (owning the failed-hello limiter),
//! attaches and detaches a connection's outlet, pairs, renames and revokes devices, and sends the
//! admin page's test push. It reaches the rest of the hub only through its port ([`Port`]):
//! commits, fan-out, health and the greeting's pieces other owners give.

use std::cell::RefCell;
use std::collections::HashSet;
use std::net::IpAddr;
use std::rc::{Rc, Weak};
use std::time::Instant;

use tracing::info;

use crate::config::{Limits, PushConfig};
use crate::guessing::GuessLimiter;
use crate::ids;
use crate::outlet::{CloseReason, ConnId, Outlet};
use crate::protocol::{
    Channel, ErrorCode, Frame, Hello, Lane, LaneRead, LaneRef, ServerCaps, TodoItem,
};
use crate::push::{PushJob, Target};
use crate::store::{Change, Device, DeviceOrigin, Record, Store};

use super::errors::CommitError;
use super::port::Back;

use super::errors::Refusal;
use super::push::PushPort;

/// Source addresses whose failed hellos are counted one by one; past them, addresses share one
/// count (`guessing.rs`). A household's phones fit many times over.
const BAD_HELLO_TABLE: usize = 32;

/// Why a test push was not queued.
#[derive(Debug, thiserror::Error)]
pub enum TestPushError {
    #[error("push is off: choose ntfy or Firebase below and save first")]
    Off,
    #[error("no device `{0}`")]
    NoSuchDevice(String),
    #[error("this device has not told the gateway where to push it yet (it registers when the app connects with push on)")]
    NoTarget,
    #[error("Firebase needs a phone's registration to push to: pair a phone and open the app with push on first")]
    NoDevice,
    #[error("the test push to {place} failed: {why}")]
    Failed { place: String, why: String },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Where the admin page's test push goes.
#[derive(Debug, Clone, Copy)]
pub enum TestTarget<'a> {
    /// A paired device, at what it registered.
    Device(&'a str),
    /// An ntfy topic typed on the page: a test before any phone has registered.
    Topic(&'a str),
}

/// What devices ask of the hub beyond push's port: the outlets in fan-out, the greeting's
/// pieces other owners give, and push's bookkeeping of who is connected.
pub trait DevicesPort: PushPort {
    /// Set once the gateway is stopping: no new hellos.
    fn is_shutting_down(&self) -> bool;

    /// What this gateway offers, as `hello.ack` says it.
    fn caps(&self) -> ServerCaps;

    /// The directory's channels as a device is given them (`Directory::for_wire`).
    fn channels_for_wire(&self, channels: Vec<Channel>) -> Vec<Channel>;

    /// The lanes with a turn running, for `hello.ack.agent_busy`.
    fn busy_lanes(&self) -> Vec<LaneRef>;

    /// Every lane's todo list, for a device's hello.
    fn todo_lists(&self) -> Vec<(Lane, Vec<TodoItem>)>;

    /// Every existing lane's read marker, for `hello.ack.read`.
    fn read_lanes(&self) -> Vec<LaneRead>;

    /// Puts a greeted connection's outlet into fan-out.
    fn add_outlet(&self, outlet: Rc<Outlet>);

    /// Takes a closed connection's outlet out of fan-out, if it was there.
    fn remove_outlet(&self, conn_id: ConnId) -> Option<Rc<Outlet>>;

    /// The outlets of `device_id`'s open connections.
    fn outlets_of_device(&self, device_id: &str) -> Vec<Rc<Outlet>>;

    /// No pushes for this device while it is connected.
    fn cancel_pushes(&self, device_id: &str);

    /// A device's connection closed: pushes may start for it.
    fn device_left(&self, device_id: &str);
}

/// The paired devices and their connections' comings and goings. Built inside the hub (it holds
/// the hub weakly: the hub owns it); the doors above the hub reach it through `Hub::devices`.
pub struct Devices<P> {
    port: Back<P>,
    store: Store,
    limits: Limits,
    /// Failed hellos per source address (`guessing.rs`).
    bad_hellos: RefCell<GuessLimiter<BAD_HELLO_TABLE>>,
}

impl<P: DevicesPort> Devices<P> {
    /// `port`: the hub being built around this service.
    pub(super) fn new(port: Weak<P>, store: Store, limits: &Limits) -> Devices<P> {
        Devices {
            port: Back::new(port),
            store,
            bad_hellos: RefCell::new(GuessLimiter::new(
                limits.bad_hellos_per_minute,
                Instant::now(),
            )),
            limits: limits.clone(),
        }
    }

    /// Checks a hello's token. Repeated failures from one address (IPv6: one /64), or from a
    /// rotation through more addresses than are counted one by one, are refused before the
    /// token is even looked at, so guessing tokens is slow (`guessing.rs`).
    ///
    /// The token is found by its SHA-256 (the `tokens` tree's key), never compared itself: how
    /// long the lookup takes depends only on the hash of what was presented, and learning how
    /// many leading bytes of that hash match a stored one tells nothing about any token (it
    /// would take a SHA-256 preimage to use it), so the check is constant-time in the secret.
    /// `user_agent`: the upgrade request's, already cut (`session::user_agent`).
    pub fn authenticate(
        &self,
        hello: &Hello,
        ip: IpAddr,
        user_agent: Option<&str>,
    ) -> Result<Device, Refusal> {
        let limit = self.limits.bad_hellos_per_minute;
        let hub = self.port.hub();
        if hub.is_shutting_down() {
            return Err(Refusal::new(
                ErrorCode::Internal,
                "the gateway is restarting",
            ));
        }
        // Counted as it begins (`guessing.rs`), so the count holds even if a wait ever comes
        // between here and the answer; given back below if the token was good.
        let begun = self.bad_hellos.borrow_mut().begin(ip, Instant::now());
        let attempt = match begun {
            Ok(a) => a,
            Err(limited) => {
                let wait = limited.retry_after.as_secs().max(1);
                let whose = if limited.shared {
                    "from too many addresses at once"
                } else {
                    "from this address"
                };
                return Err(Refusal::rate_limited(format!("too many failed hellos {whose} ({limit} per minute, limits.bad_hellos_per_minute); wait {wait} s")));
            }
        };
        let found = if hello.token.len() <= 256 {
            match self
                .store
                .device_by_token_hash(&ids::token_hash(&hello.token))
            {
                Ok(found) => found,
                Err(e) => {
                    // Not an answer about the token: the attempt is given back.
                    self.bad_hellos.borrow_mut().cancel(attempt);
                    return Err(Refusal::new(ErrorCode::Internal, e.to_string()));
                }
            }
        } else {
            None
        };
        let Some(mut device) = found else {
            return Err(Refusal::auth(format!(
                "unknown or revoked token: pair this device again ({})",
                crate::hints::command("pair --name NAME")
            )));
        };
        device.last_seen_ms = Some(ids::now_ms());
        device.last_address = Some(ip.to_string());
        device.push_via = hello.caps.push.clone();
        device.user_agent = user_agent.map(str::to_owned);
        if let Some(app_id) = hello.device_id.as_deref().filter(|s| s.len() <= 128) {
            device.app_device_id = Some(app_id.to_owned());
        }
        if device.name.is_empty() {
            if let Some(name) = hello.device_name.as_deref() {
                device.name = name.chars().take(self.limits.max_name_chars).collect();
            }
        }
        if let Some(t) = hello.fcm_token.as_deref().filter(|s| s.len() <= 4096) {
            device.fcm_token = Some(t.to_owned());
        }
        if let Some(t) = hello.ntfy_topic.as_deref().filter(|s| s.len() <= 256) {
            device.ntfy_topic = Some(t.to_owned());
        }
        hub.commit_soon(
            vec![Change::Record(Record::PutDevice(device.clone()))],
            "the device's hello",
        );
        // Not a reset: see `guessing.rs` for why a success keeps the count.
        self.bad_hellos
            .borrow_mut()
            .succeeded(attempt, Instant::now());
        Ok(device)
    }

    /// Registers an authenticated connection and queues its greeting: `hello.ack`, `status`,
    /// then the todo snapshot of every lane that has one. Done without an await, so the
    /// `sync_cursor` it reports is exactly where live delivery to this device starts.
    pub fn attach(&self, outlet: &Rc<Outlet>, hello_id: Option<i64>) {
        let hub = self.port.hub();
        let channels = hub.channels_for_wire(self.store.channels().unwrap_or_default());
        let device = self.store.device(&outlet.device_id).ok().flatten();
        let last_pushed = device.map(|d| d.last_pushed_cursor).unwrap_or(0);
        let health = hub.health_state();
        let busy = outlet.wants_busy_frames().then(|| hub.busy_lanes());
        let read = outlet.wants_read_markers().then(|| hub.read_lanes());
        let mut ack = Frame::hello_ack(
            hello_id,
            &hub.caps(),
            hub.published_head(),
            last_pushed,
            &channels,
        );
        if let Some(lanes) = busy {
            ack = ack.with_busy_lanes(lanes);
        }
        if let Some(lanes) = read {
            ack = ack.with_read_lanes(lanes);
        }
        outlet.push_frame(&ack);
        outlet.push_frame(&Frame::status(health));
        for (lane, todos) in hub.todo_lists() {
            outlet.push_frame(&Frame::todo_update(&todos).in_lane(&lane.chat_id, lane.thread()));
        }
        hub.add_outlet(outlet.clone());
        hub.cancel_pushes(&outlet.device_id);
    }

    /// A connection ended: its outlet leaves fan-out, and pushes may start for its device.
    pub fn detach(&self, conn_id: ConnId) {
        let hub = self.port.hub();
        let gone = hub.remove_outlet(conn_id);
        if let Some(outlet) = gone {
            hub.device_left(&outlet.device_id);
        }
    }

    /// Mints a device and its token (the `pair` command, through the control socket).
    pub async fn pair(&self, name: &str) -> Result<(Device, String), CommitError> {
        let (device, token) = new_device(name, DeviceOrigin::Pair);
        self.port
            .hub()
            .commit(
                vec![Change::Record(Record::PutDevice(device.clone()))],
                None,
            )
            .await?;
        info!(device = %device.device_id, name = %device.name, "paired a new device");
        Ok((device, token))
    }

    /// Removes a device and closes its open sockets; its next hello gets `error{auth}`.
    pub async fn revoke(&self, device_id: &str) -> Result<bool, CommitError> {
        let existed = self.store.device(device_id)?.is_some();
        let hub = self.port.hub();
        hub.commit(
            vec![Change::Record(Record::RemoveDevice(device_id.to_owned()))],
            None,
        )
        .await?;
        hub.cancel_pushes(device_id);
        for o in hub.outlets_of_device(device_id) {
            o.push_frame(&Frame::error(
                None,
                ErrorCode::Auth,
                "this device was revoked",
            ));
            o.close(CloseReason::Revoked);
        }
        if existed {
            info!(device = %device_id, "revoked a device");
        }
        Ok(existed)
    }

    /// Device ids with a socket open past the hello gate.
    pub fn connected(&self) -> HashSet<String> {
        self.port.hub().connected_devices()
    }

    /// Renames a device (cut to `limits.max_name_chars`); `Ok(false)` if there is none.
    pub async fn rename(&self, device_id: &str, name: &str) -> Result<bool, CommitError> {
        let Some(mut device) = self.store.device(device_id)? else {
            return Ok(false);
        };
        device.name = name
            .chars()
            .filter(|c| !c.is_control())
            .take(self.limits.max_name_chars)
            .collect();
        self.port
            .hub()
            .commit(vec![Change::Record(Record::PutDevice(device))], None)
            .await?;
        info!(device = %device_id, "renamed a device");
        Ok(true)
    }

    /// Sends one test push now with `config` (the push settings the page shows) and waits for
    /// the push server's answer, off the event loop; returns where it went. With the settings
    /// running now (`running`), the answer is also push's health: a success is the first proof
    /// push works, a failure is why it does not.
    pub async fn test_push(
        &self,
        config: &PushConfig,
        running: bool,
        to: TestTarget<'_>,
    ) -> Result<String, TestPushError> {
        let target = match (config.backend.as_str(), to) {
            ("none", _) => return Err(TestPushError::Off),
            (backend, TestTarget::Device(device_id)) => {
                let device = self
                    .store
                    .device(device_id)?
                    .ok_or_else(|| TestPushError::NoSuchDevice(device_id.to_owned()))?;
                let registered = |t: Option<String>| t.filter(|t| !t.is_empty());
                match backend {
                    "ntfy" => registered(device.ntfy_topic).map(|topic| Target::Ntfy { topic }),
                    _ => registered(device.fcm_token).map(|token| Target::Fcm { token }),
                }
                .ok_or(TestPushError::NoTarget)?
            }
            ("ntfy", TestTarget::Topic(topic)) => Target::Ntfy {
                topic: topic.to_owned(),
            },
            (_, TestTarget::Topic(_)) => return Err(TestPushError::NoDevice),
        };
        let place = match &target {
            Target::Ntfy { topic } => format!(
                "topic {topic} on ntfy at {}",
                config.ntfy_server.trim_end_matches('/')
            ),
            Target::Fcm { .. } => "Firebase Cloud Messaging".to_owned(),
        };
        // Cursor 0: delivering it records nothing about what the device was pushed.
        let job = PushJob {
            device_id: "admin-test".into(),
            target,
            cursor: 0,
            chat_id: "admin-test".into(),
            thread_id: None,
            message_id: "admin-test".into(),
            title: "Iris".into(),
            body: "A test push from the gateway's admin page".into(),
            count: 1,
        };
        let config = config.clone();
        let sent = tokio::task::spawn_blocking(move || crate::push::send_now(&config, &job))
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        match sent {
            Ok(()) => {
                info!("a test push reached the push server ({place})");
                if running {
                    let hub = self.port.hub();
                    hub.confirm_push();
                    hub.update_health(|st| st.push_error = None);
                }
                Ok(place)
            }
            Err(why) => {
                info!("a test push failed ({place}): {why}");
                if running {
                    let reason = why.clone();
                    self.port
                        .hub()
                        .update_health(|st| st.push_error = Some(reason));
                }
                Err(TestPushError::Failed { place, why })
            }
        }
    }
}

/// A new device record and the token that authenticates it (returned once, never stored).
pub fn new_device(name: &str, origin: DeviceOrigin) -> (Device, String) {
    let token = ids::pairing_token();
    let device = Device {
        device_id: ids::time_ordered("dev"),
        name: name.chars().take(100).collect(),
        origin,
        created_ms: ids::now_ms(),
        last_seen_ms: None,
        app_device_id: None,
        last_pushed_cursor: 0,
        fcm_token: None,
        ntfy_topic: None,
        token_hash: ids::token_hash(&token),
        seen_cursor: 0,
        last_address: None,
        push_via: None,
        user_agent: None,
    };
    (device, token)
}
