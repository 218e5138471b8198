//! Devices: checking a hello's token, attaching and detaching a connection's outlet, pairing
//! and revoking.

use std::net::IpAddr;
use std::rc::Rc;
use std::time::Instant;

use tracing::info;

use crate::ids;
use crate::outlet::{CloseReason, ConnId, Outlet};
use crate::protocol::{ErrorCode, Frame, Hello};
use crate::store::{Change, Device, DeviceOrigin, Record};

use super::errors::CommitError;

use super::errors::Refusal;
use super::state::Hub;

impl Hub {
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
        let limit = self.config.limits.bad_hellos_per_minute;
        if self.is_shutting_down() {
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
                device.name = name
                    .chars()
                    .take(self.config.limits.max_name_chars)
                    .collect();
            }
        }
        if let Some(t) = hello.fcm_token.as_deref().filter(|s| s.len() <= 4096) {
            device.fcm_token = Some(t.to_owned());
        }
        if let Some(t) = hello.ntfy_topic.as_deref().filter(|s| s.len() <= 256) {
            device.ntfy_topic = Some(t.to_owned());
        }
        self.commit_soon(
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
        let channels = self
            .directory
            .for_wire(self.store.channels().unwrap_or_default());
        let device = self.store.device(&outlet.device_id).ok().flatten();
        let last_pushed = device.map(|d| d.last_pushed_cursor).unwrap_or(0);
        let health = self.health();
        let busy = outlet.wants_busy_frames().then(|| self.turns.busy_lanes());
        let read = outlet.wants_read_markers().then(|| self.read_lanes());
        let mut ack = Frame::hello_ack(
            hello_id,
            &self.caps(),
            self.fanout.published_head(),
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
        for (lane, todos) in self.turns.todo_lists() {
            outlet.push_frame(&Frame::todo_update(&todos).in_lane(&lane.chat_id, lane.thread()));
        }
        self.fanout.add(outlet.clone());
        self.push.cancel(&outlet.device_id);
    }

    /// A connection ended: its outlet leaves fan-out, and pushes may start for its device.
    pub fn detach(&self, conn_id: ConnId) {
        let gone = self.fanout.remove(conn_id);
        if let Some(outlet) = gone {
            self.push.device_left(&outlet.device_id);
        }
    }

    /// Mints a device and its token (the `pair` command, through the control socket).
    pub async fn pair(&self, name: &str) -> Result<(Device, String), CommitError> {
        let (device, token) = new_device(name, DeviceOrigin::Pair);
        self.commit(
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
        self.commit(
            vec![Change::Record(Record::RemoveDevice(device_id.to_owned()))],
            None,
        )
        .await?;
        self.push.cancel(device_id);
        for o in self.fanout.of_device(device_id) {
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
