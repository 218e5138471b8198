//! What the admin page asks of the hub beyond what the control socket already does: which
//! devices are connected now, renaming one, a test push, and taking note of a new agent.

use std::collections::HashSet;

use tracing::info;

use super::state::Hub;
use crate::push::{PushJob, Target};
use crate::store::{Change, Record};

use super::errors::CommitError;

/// Why a test push was not queued.
#[derive(Debug, thiserror::Error)]
pub enum TestPushError {
    #[error("push is off (push.backend = \"none\")")]
    Off,
    #[error("no device `{0}`")]
    NoSuchDevice(String),
    #[error("this device has not told the gateway where to push it yet (it registers when the app connects with push on)")]
    NoTarget,
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

impl Hub {
    /// Device ids with a socket open past the hello gate.
    pub fn connected_devices(&self) -> HashSet<String> {
        self.fanout.device_ids()
    }

    /// Renames a device (cut to `limits.max_name_chars`); `Ok(false)` if there is none.
    pub async fn rename_device(&self, device_id: &str, name: &str) -> Result<bool, CommitError> {
        let Some(mut device) = self.store.device(device_id)? else {
            return Ok(false);
        };
        device.name = name
            .chars()
            .filter(|c| !c.is_control())
            .take(self.config.limits.max_name_chars)
            .collect();
        self.commit(vec![Change::Record(Record::PutDevice(device))], None)
            .await?;
        info!(device = %device_id, "renamed a device");
        Ok(true)
    }

    /// Queues one push to a device, as a real one would be sent; returns where it goes.
    pub fn test_push(&self, device_id: &str) -> Result<String, TestPushError> {
        if !self.pusher.is_enabled() {
            return Err(TestPushError::Off);
        }
        let device = self
            .store
            .device(device_id)?
            .ok_or_else(|| TestPushError::NoSuchDevice(device_id.to_owned()))?;
        let target = self
            .pusher
            .target_for(device.ntfy_topic.as_deref(), device.fcm_token.as_deref())
            .ok_or(TestPushError::NoTarget)?;
        let place = match &target {
            Target::Ntfy { .. } => format!("ntfy at {}", self.pusher.ntfy_server()),
            Target::Fcm { .. } => "Firebase Cloud Messaging".to_owned(),
        };
        // Cursor 0: delivering it records nothing about what the device was pushed.
        self.pusher.enqueue(PushJob {
            device_id: device.device_id.clone(),
            target,
            cursor: 0,
            chat_id: "admin-test".into(),
            thread_id: None,
            message_id: "admin-test".into(),
            title: "Iris".into(),
            body: "A test push from the gateway's admin page".into(),
            count: 1,
        });
        info!(device = %device_id, "queued a test push");
        Ok(place)
    }

    /// The agent behind the hub was replaced (the admin page saved new settings): forget what
    /// was wrong with the old one and check the new one now.
    pub fn agent_switched(&self) {
        self.update_health(|st| st.agent_error = None);
        self.agent_watch.back.notify_waiters();
        self.agent_watch.check.notify_one();
    }
}
