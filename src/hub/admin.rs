//! What the admin page asks of the hub beyond what the control socket already does: which
//! devices are connected now, renaming one, a test push, and taking note of a new agent.

use std::collections::HashSet;

use tracing::info;

use super::state::Hub;
use crate::config::PushConfig;
use crate::push::{PushJob, Target};
use crate::store::{Change, Record};

use super::errors::CommitError;

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
                    self.push.note_test(Ok(()));
                }
                Ok(place)
            }
            Err(why) => {
                info!("a test push failed ({place}): {why}");
                if running {
                    self.push.note_test(Err(why.clone()));
                }
                Err(TestPushError::Failed { place, why })
            }
        }
    }

    /// The agent behind the hub was replaced (the admin page saved new settings): forget what
    /// was wrong with the old one and check the new one now.
    pub fn agent_switched(&self) {
        self.update_health(|st| st.agent_error = None);
        self.switched_on(crate::settings::Part::Agent);
        self.turns.agent_switched();
    }
}
