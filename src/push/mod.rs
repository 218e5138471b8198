//! Push notifications for devices that are away: ntfy or FCM, from a worker thread.
//!
//! The hub decides *what* to push (final assistant messages, notifications, automation
//! messages, for devices with no open connection) and hands jobs to `Pusher::enqueue`. HTTP is
//! blocking (ureq), so it runs on one worker thread with a bounded queue: a dead push server can
//! never delay the event loop or live WebSocket traffic. Jobs for the same device and chat
//! collapse into one push ("3 new messages"). Deliveries are retried with exponential backoff
//! and jitter until `give_up_secs`; each outcome goes back to the hub, which advances the
//! device's `last_pushed_cursor` durably on success and reports `degraded` while the push
//! server stays unreachable.

mod fcm;
mod ntfy;

pub use fcm::{
    check_key, key_summary, read_key_file, KeySummary, MAX_KEY_BYTES as MAX_FCM_KEY_BYTES,
};

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::config::PushConfig;

/// Jobs waiting for the worker; beyond it the oldest is dropped (push is best effort: `sync`
/// is the source of truth, and the app catches up when opened).
const QUEUE_CAPACITY: usize = 256;
/// Longest body preview in a push.
pub const PREVIEW_CHARS: usize = 140;
/// One HTTP attempt's time limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("push backend must be none, ntfy or fcm (got `{0}`)")]
    Backend(String),
    #[error("push content must be full, preview, title or none (got `{0}`)")]
    Content(String),
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the FCM credentials are not usable: {0}")]
    Credentials(String),
    #[error("the FCM backend needs fcm_credentials (a service-account key file)")]
    NoCredentials,
}

/// Where a device receives pushes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Ntfy { topic: String },
    Fcm { token: String },
}

/// One notification to deliver.
#[derive(Debug, Clone, PartialEq)]
pub struct PushJob {
    pub device_id: String,
    pub target: Target,
    /// The highest outbox cursor this push covers.
    pub cursor: u64,
    pub chat_id: String,
    pub thread_id: Option<String>,
    pub message_id: String,
    /// Channel or thread name.
    pub title: String,
    pub body: String,
    /// How many frames were collapsed into this push.
    pub count: u32,
}

/// What the worker reports back to the hub.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Delivered {
        device_id: String,
        cursor: u64,
    },
    /// The push server is failing (the job is still being retried).
    Failing {
        reason: String,
    },
    GaveUp {
        device_id: String,
        reason: String,
    },
}

/// What a push carries, from the `content` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    Full,
    Preview,
    Title,
    None,
}

impl Content {
    fn parse(s: &str) -> Result<Content, PushError> {
        match s {
            "full" => Ok(Content::Full),
            "preview" => Ok(Content::Preview),
            "title" => Ok(Content::Title),
            "none" => Ok(Content::None),
            other => Err(PushError::Content(other.to_owned())),
        }
    }

    /// Title and body as this setting allows them.
    pub fn shape(self, job: &PushJob) -> (String, String) {
        let cut = |s: &str, n: usize| -> String {
            let mut out: String = s.chars().take(n).collect();
            if s.chars().count() > n {
                out.push('\u{2026}');
            }
            out
        };
        let body = if job.count > 1 {
            format!("{} new messages", job.count)
        } else {
            job.body.clone()
        };
        match self {
            Content::Full => (job.title.clone(), cut(&body, PREVIEW_CHARS)),
            Content::Preview => (job.title.clone(), cut(&body, 60)),
            Content::Title => (job.title.clone(), "New message".into()),
            Content::None => ("Iris".into(), "New activity".into()),
        }
    }
}

/// Why a delivery failed, and whether trying again can help.
#[derive(Debug)]
pub struct Failure {
    pub reason: String,
    /// The server refused this push for good (a bad target or request): no retry.
    pub permanent: bool,
}

impl Failure {
    fn retry(reason: String) -> Failure {
        Failure {
            reason,
            permanent: false,
        }
    }

    /// Failure for an HTTP status. 5xx, 408 and 429 are passing trouble; 401 and 403 are the
    /// server's credentials, which an admin fixes for every device at once; any other 4xx is
    /// about this push or this device's target, and retrying it would only hold up the others.
    fn from_status(service: &str, status: u16, extra: &str) -> Failure {
        Failure {
            reason: format!("{service} answered HTTP {status}{extra}"),
            permanent: (400..500).contains(&status) && ![401, 403, 408, 429].contains(&status),
        }
    }
}

/// A backend that can deliver one push (blocking; runs on the worker thread).
trait Deliver: Send {
    fn deliver(&mut self, job: &PushJob, content: Content) -> Result<(), Failure>;
}

/// Which push service delivers, chosen once by `push.backend`: decisions are made on this, not
/// on the config string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// No push: nothing is queued, and `server_caps.push` says `none`.
    None,
    Ntfy,
    Fcm,
}

impl Backend {
    /// As `push.backend` and `server_caps.push` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::None => "none",
            Backend::Ntfy => "ntfy",
            Backend::Fcm => "fcm",
        }
    }
}

/// The hub's handle on the push worker.
pub struct Pusher {
    backend: Backend,
    ntfy_server: String,
    shared: Option<Arc<Shared>>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<PushJob>,
    /// Devices that came back: drop their pending pushes, stop retrying them.
    cancelled: Vec<String>,
    stop: bool,
}

impl Pusher {
    /// A pusher that pushes nothing (`push.backend = "none"`, or push switched off at start).
    pub fn off() -> Pusher {
        Pusher {
            backend: Backend::None,
            ntfy_server: String::new(),
            shared: None,
        }
    }

    /// Starts the worker for the configured backend (none: a pusher that pushes nothing).
    pub fn start(
        config: &PushConfig,
        outcomes: mpsc::UnboundedSender<Outcome>,
    ) -> Result<Pusher, PushError> {
        let content = Content::parse(&config.content)?;
        let (backend, deliver): (Backend, Box<dyn Deliver>) = match config.backend.as_str() {
            "none" => return Ok(Pusher::off()),
            "ntfy" => (
                Backend::Ntfy,
                Box::new(ntfy::Ntfy::new(config, http_agent())?),
            ),
            "fcm" => (Backend::Fcm, Box::new(fcm::Fcm::new(config, http_agent())?)),
            other => return Err(PushError::Backend(other.to_owned())),
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let worker = Worker {
            shared: shared.clone(),
            deliver,
            content,
            outcomes,
            give_up: Duration::from_secs(config.give_up_secs),
            backoff: Duration::from_millis(config.backoff_ms.max(1)),
            max_backoff: Duration::from_secs(config.max_backoff_secs.max(1)),
        };
        std::thread::Builder::new()
            .name("push".into())
            .spawn(move || worker.run())
            .map_err(|e| PushError::Credentials(format!("cannot start the push worker: {e}")))?;
        info!(backend = backend.as_str(), "push worker started");
        Ok(Pusher {
            backend,
            ntfy_server: if backend == Backend::Ntfy {
                config.ntfy_server.trim_end_matches('/').to_owned()
            } else {
                String::new()
            },
            shared: Some(shared),
        })
    }

    /// `server_caps.push`.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether any push service is configured (with none, nothing is worth working out).
    pub fn is_enabled(&self) -> bool {
        self.backend != Backend::None
    }

    /// `server_caps.push_ntfy_server`: empty unless the backend is ntfy.
    pub fn ntfy_server(&self) -> &str {
        &self.ntfy_server
    }

    /// Which target a device has for this backend, if any.
    pub fn target_for(&self, ntfy_topic: Option<&str>, fcm_token: Option<&str>) -> Option<Target> {
        match self.backend {
            Backend::Ntfy => ntfy_topic.filter(|t| !t.is_empty()).map(|t| Target::Ntfy {
                topic: t.to_owned(),
            }),
            Backend::Fcm => fcm_token.filter(|t| !t.is_empty()).map(|t| Target::Fcm {
                token: t.to_owned(),
            }),
            Backend::None => None,
        }
    }

    /// Queues a push; one already waiting for the same device and chat absorbs it.
    pub fn enqueue(&self, job: PushJob) {
        let Some(shared) = &self.shared else { return };
        let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.cancelled.retain(|d| d != &job.device_id);
        if let Some(pending) = q.jobs.iter_mut().find(|p| {
            p.device_id == job.device_id && p.chat_id == job.chat_id && p.thread_id == job.thread_id
        }) {
            let count = pending.count + job.count;
            *pending = PushJob { count, ..job };
        } else {
            if q.jobs.len() >= QUEUE_CAPACITY {
                let dropped = q.jobs.pop_front();
                warn!(device = ?dropped.map(|d| d.device_id), "push queue full; dropped the oldest push");
            }
            q.jobs.push_back(job);
        }
        drop(q);
        shared.wake.notify_one();
    }

    /// The device is connected again: what it has not been pushed it will see by itself.
    pub fn cancel(&self, device_id: &str) {
        let Some(shared) = &self.shared else { return };
        let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.jobs.retain(|j| j.device_id != device_id);
        if !q.cancelled.iter().any(|d| d == device_id) {
            q.cancelled.push(device_id.to_owned());
        }
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.queue.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
            shared.wake.notify_all();
        }
    }
}

struct Worker {
    shared: Arc<Shared>,
    deliver: Box<dyn Deliver>,
    content: Content,
    outcomes: mpsc::UnboundedSender<Outcome>,
    give_up: Duration,
    backoff: Duration,
    max_backoff: Duration,
}

impl Worker {
    fn run(mut self) {
        loop {
            let job = {
                let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if q.stop {
                        return;
                    }
                    if let Some(job) = q.jobs.pop_front() {
                        break job;
                    }
                    q = self.shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            self.deliver_with_retries(job);
        }
    }

    fn cancelled(&self, device_id: &str) -> bool {
        let q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.stop || q.cancelled.iter().any(|d| d == device_id)
    }

    fn deliver_with_retries(&mut self, job: PushJob) {
        let started = Instant::now();
        let mut delay = self.backoff;
        loop {
            match self.deliver.deliver(&job, self.content) {
                Ok(()) => {
                    let _ = self.outcomes.send(Outcome::Delivered {
                        device_id: job.device_id.clone(),
                        cursor: job.cursor,
                    });
                    return;
                }
                Err(Failure { reason, permanent }) => {
                    warn!(device = %job.device_id, "push failed: {reason}");
                    if permanent || started.elapsed() + delay > self.give_up {
                        let _ = self.outcomes.send(Outcome::GaveUp {
                            device_id: job.device_id.clone(),
                            reason,
                        });
                        return;
                    }
                    let _ = self.outcomes.send(Outcome::Failing { reason });
                }
            }
            // Sleep in short steps so a returning device or shutdown ends the wait early.
            let wake_at = Instant::now() + jitter(delay);
            while Instant::now() < wake_at {
                if self.cancelled(&job.device_id) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50).min(wake_at - Instant::now()));
            }
            delay = (delay * 2).min(self.max_backoff);
        }
    }
}

/// ±25 % so devices failing together do not retry in lockstep.
fn jitter(d: Duration) -> Duration {
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    let r = u16::from_le_bytes(b) as f64 / u16::MAX as f64; // 0..1
    d.mul_f64(0.75 + r * 0.5)
}

/// One HTTP client for the worker: rustls with ring, the system CA file when present.
fn http_agent() -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(REQUEST_TIMEOUT))
        .http_status_as_error(false)
        .tls_config(crate::http_client::system_tls())
        .build();
    config.into()
}

/// Sends one push now, on the calling thread (blocking, at most one request's time limit), with
/// `config`'s backend and credentials: the admin page's test, whose answer must be the push
/// server's, not "queued". No retry.
pub fn send_now(config: &PushConfig, job: &PushJob) -> Result<(), String> {
    let content = Content::parse(&config.content).map_err(|e| e.to_string())?;
    let mut deliver: Box<dyn Deliver> = match config.backend.as_str() {
        "ntfy" => Box::new(ntfy::Ntfy::new(config, http_agent()).map_err(|e| e.to_string())?),
        "fcm" => Box::new(fcm::Fcm::new(config, http_agent()).map_err(|e| e.to_string())?),
        other => return Err(PushError::Backend(other.to_owned()).to_string()),
    };
    deliver.deliver(job, content).map_err(|f| f.reason)
}

/// Whether `config` can start: what [`Pusher::start`] checks before its worker runs (the
/// content setting, the ntfy token file, a usable FCM key), with no worker and no request.
pub fn check_config(config: &PushConfig) -> Result<(), PushError> {
    Content::parse(&config.content)?;
    match config.backend.as_str() {
        "none" => Ok(()),
        "ntfy" => match (&config.ntfy_token, &config.ntfy_token_file) {
            (None, Some(path)) => read_secret("the ntfy token file", path).map(|_| ()),
            _ => Ok(()),
        },
        "fcm" => {
            let path = config
                .fcm_credentials
                .as_ref()
                .ok_or(PushError::NoCredentials)?;
            check_key(&read_key_file(path)?).map(|_| ())
        }
        other => Err(PushError::Backend(other.to_owned())),
    }
}

/// Reads a secret from a file, trimmed (so `echo TOKEN > file` works).
fn read_secret(what: &'static str, path: &std::path::Path) -> Result<String, PushError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| PushError::Read {
            what,
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(chat: &str, cursor: u64) -> PushJob {
        PushJob {
            device_id: "dev_1".into(),
            target: Target::Ntfy { topic: "t".into() },
            cursor,
            chat_id: chat.into(),
            thread_id: None,
            message_id: format!("m{cursor}"),
            title: "General".into(),
            body: "x".repeat(200),
            count: 1,
        }
    }

    #[test]
    fn content_settings_shape_the_push() {
        let j = job("default", 1);
        assert_eq!(Content::Full.shape(&j).1.chars().count(), PREVIEW_CHARS + 1);
        assert_eq!(Content::Preview.shape(&j).1.chars().count(), 61);
        assert_eq!(Content::Title.shape(&j).1, "New message");
        assert_eq!(Content::None.shape(&j).0, "Iris");
        let many = PushJob { count: 3, ..j };
        assert_eq!(Content::Full.shape(&many).1, "3 new messages");
    }

    #[test]
    fn only_passing_trouble_is_retried() {
        for status in [500, 502, 503, 408, 429, 401, 403] {
            assert!(!Failure::from_status("x", status, "").permanent, "{status}");
        }
        for status in [400, 404, 410, 413] {
            assert!(Failure::from_status("x", status, "").permanent, "{status}");
        }
    }

    #[test]
    fn jobs_collapse_per_device_and_chat() {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let p = Pusher {
            backend: Backend::Ntfy,
            ntfy_server: String::new(),
            shared: Some(shared.clone()),
        };
        p.enqueue(job("default", 1));
        p.enqueue(job("default", 2));
        p.enqueue(job("chan_x", 3));
        {
            let q = shared.queue.lock().unwrap();
            assert_eq!(q.jobs.len(), 2);
            assert_eq!((q.jobs[0].cursor, q.jobs[0].count), (2, 2));
        }
        p.cancel("dev_1");
        assert!(shared.queue.lock().unwrap().jobs.is_empty());
        std::mem::forget(p);
    }
}
