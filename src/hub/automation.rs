//! Automation channels: scheduled prompts (cron) and webhooks post gateway output into them.
//!
//! At start ([`Automation::start`]) every channel a `[[cron]]` or `[[webhook]]` names is
//! looked up by its exact name among the root channels: created as an automation channel if
//! missing, marked as one if it is not (announced like `channel.set_automation`), and refused if
//! it is the default channel. The same lookup runs again before each post, so a channel a user
//! deleted comes back on the next post.
//!
//! A webhook's text becomes a stored message (role `cron`) with its `message` frame and a
//! `notification{kind:cron}`, committed together: durable before any device sees them, and
//! pushed to away devices like any other message. A cron job's prompt is queued as an agent
//! turn in its channel's lane (through the port: the turns store the answer).
//!
//! The cron task sleeps until the earliest due job, never more than [`MAX_CRON_SLEEP`], and
//! checks the wall clock at each wake-up. A Pi has no real-time clock: its clock jumps when NTP
//! syncs after boot. A jump (the wall clock moving more than [`CLOCK_STEP`] away from the
//! monotonic clock) reschedules every job from the new time without firing, so no backlog of
//! missed runs is ever replayed; a job due in normal time fires once, and its next run is
//! computed from then.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use chrono::{DateTime, Local, TimeDelta};
use tracing::{info, warn};

use super::errors::CommitError;
use super::port::Back;
use super::port::Port;
use crate::config::{CronJob as CronConfig, Limits, WebhookConfig};
use crate::guessing::GuessLimiter;
use crate::ids;
use crate::protocol::{Channel, ChannelKind, Frame, HistoryMessage, Lane, Role};
use crate::shutdown::{Listener, Shutdown};
use crate::store::{Change, Store, StoreError};

/// Why a webhook request was not posted; each kind maps to one HTTP status (the HTTP front
/// picks it), and the automation that refuses it owns the type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub enum HookError {
    /// 404: no `[[webhook]]` has this name.
    NotFound,
    /// 401: the `Authorization: Bearer` token is missing or wrong.
    Unauthorized,
    /// 413: the body (or its text) is over its limit.
    TooLarge(String),
    /// 429: over `limits.webhooks_per_minute`; retry after this many seconds.
    RateLimited { retry_after_secs: u64 },
    /// 429: over [`WEBHOOK_FAILURES_PER_MINUTE`] wrong tokens from this address (or, `shared`,
    /// from too many addresses at once); refused before the token is looked at.
    Guessing { retry_after_secs: u64, shared: bool },
    /// 400: the body is not usable (not UTF-8, bad JSON, empty text).
    BadRequest(String),
    /// 503: the gateway cannot post it now (storage failing, the channel unusable).
    Unavailable(String),
}

/// Why an automation entry cannot be served. At start this stops the gateway (the config names
/// a channel it cannot use); for a webhook it is a 503; for a cron run it skips the run.
#[derive(Debug, thiserror::Error)]
pub enum AutomationError {
    /// The entry asks for what cannot be: a bad name, the default channel, a channel with
    /// threads, a full directory, an unreadable token or schedule. The message names the entry.
    #[error("{0}")]
    Entry(String),
    #[error("cannot read the channel directory: {0}")]
    Directory(#[source] StoreError),
    #[error("{origin}: could not save the channel `{name}`: {source}")]
    Save {
        origin: String,
        name: String,
        #[source]
        source: CommitError,
    },
}

impl HookError {
    /// The plain-text body of the refusal.
    pub fn message(&self) -> String {
        match self {
            HookError::NotFound => "no such webhook".into(),
            HookError::Unauthorized => {
                "missing or wrong token: send Authorization: Bearer <the webhook's token>".into()
            }
            HookError::RateLimited { retry_after_secs } => format!(
                "too many webhook requests (limits.webhooks_per_minute); retry in {retry_after_secs} s"
            ),
            HookError::Guessing {
                retry_after_secs,
                shared,
            } => {
                let whose = if *shared {
                    "from too many addresses at once"
                } else {
                    "from this address"
                };
                format!(
                    "too many wrong webhook tokens {whose} ({WEBHOOK_FAILURES_PER_MINUTE} a minute); retry in {retry_after_secs} s"
                )
            }
            HookError::TooLarge(m) | HookError::BadRequest(m) | HookError::Unavailable(m) => {
                m.clone()
            }
        }
    }
}

/// Shortest webhook token accepted (config validation checks inline tokens; files are checked
/// when they are read, at start).
const MIN_TOKEN_CHARS: usize = 16;
/// The longest the cron task sleeps before looking at the wall clock again.
pub const MAX_CRON_SLEEP: Duration = Duration::from_secs(30);
/// A difference between wall-clock and monotonic time this large is a clock step, not drift.
pub const CLOCK_STEP: Duration = Duration::from_secs(60);
/// A notification carries this much of a webhook's text.
const NOTIFICATION_BODY_CHARS: usize = 200;
/// Longest notification title taken from a webhook's JSON `title`.
const MAX_TITLE_CHARS: usize = 200;
/// The rate window of `limits.webhooks_per_minute`.
const RATE_WINDOW: Duration = Duration::from_secs(60);

/// Wrong (or missing) webhook tokens accepted from one address (IPv6: one /64) a minute; past
/// it, that address's webhook requests get 429 before their token is looked at. A token has at
/// least 16 characters, but the owner may choose a weak one.
pub const WEBHOOK_FAILURES_PER_MINUTE: u32 = 5;
/// Addresses whose wrong webhook tokens are counted one by one; past them, the rest share one
/// count, so at most 33 × [`WEBHOOK_FAILURES_PER_MINUTE`] guesses a minute from any number of
/// addresses.
pub const WEBHOOK_FAILURE_TABLE: usize = 32;

/// What automation asks of the hub beyond the core: its settings, the lanes' turns for cron
/// prompts, and the task that delivers the agent's job results into its channels.
pub trait AutomationPort: Port {
    /// The `[[cron]]` entries as this start read them.
    fn cron_settings(&self) -> &[CronConfig];

    /// The `[[webhook]]` entries as this start read them.
    fn webhook_settings(&self) -> &[WebhookConfig];

    /// Nothing is running or queued in `lane`.
    fn lane_idle(&self, lane: &Lane) -> bool;

    /// Queues a scheduled prompt as an agent turn in `lane`; its answer is posted as `title`.
    fn enqueue_automation(self: &Rc<Self>, lane: Lane, prompt: String, title: String);

    /// Starts the task that delivers the agent's job results into their lanes and automation's
    /// channels (`AgentJobs::follow`), until `stop`.
    fn follow_jobs(self: &Rc<Self>, stop: Listener);
}

/// The hub's automation: the webhooks and their rate windows, and the automation channels it
/// posts into. The cron task and the webhook posts reach the hub through the port. Built inside
/// the hub (it holds the hub weakly: the hub owns it); the server and the HTTP front reach it
/// through `Hub::automation`.
pub struct Automation<P> {
    port: Back<P>,
    store: Store,
    limits: Limits,
    webhooks: RefCell<Webhooks>,
    /// Held while an automation channel is looked up and maybe created, so two posts arriving
    /// together cannot both create it.
    finding_channel: tokio::sync::Mutex<()>,
}

/// The webhooks read at start and what admitting them remembers.
struct Webhooks {
    hooks: Vec<Hook>,
    /// When the webhook requests admitted within the last minute arrived, oldest first.
    admitted: VecDeque<Instant>,
    /// Wrong webhook tokens per source address (`guessing.rs`).
    bad_tokens: GuessLimiter<{ WEBHOOK_FAILURE_TABLE }>,
}

/// A configured webhook, with its token kept only as a SHA-256 digest.
struct Hook {
    name: String,
    channel: String,
    digest: Vec<u8>,
}

/// A scheduled prompt, parsed.
pub(super) struct CronJob {
    /// How logs and errors name it: `[[cron]] #1 (0 30 7 * * *)`.
    label: String,
    channel: String,
    schedule: cron::Schedule,
    prompt: String,
}

impl<P: AutomationPort> Automation<P> {
    /// `port`: the hub being built around this service.
    pub(super) fn new(port: Weak<P>, store: Store, limits: Limits) -> Automation<P> {
        Automation {
            port: Back::new(port),
            store,
            limits,
            webhooks: RefCell::new(Webhooks {
                hooks: Vec::new(),
                admitted: VecDeque::new(),
                bad_tokens: GuessLimiter::new(WEBHOOK_FAILURES_PER_MINUTE, Instant::now()),
            }),
            finding_channel: tokio::sync::Mutex::new(()),
        }
    }

    /// Prepares automation before the gateway listens ([`Automation::prepare`]) and starts the
    /// cron task and the task that delivers the agent's job results (`AgentJobs::follow`: they
    /// are posted into automation's channels), which stop with `shutdown`. An error names the
    /// config entry; the gateway must not start with it.
    pub async fn start(self: &Rc<Self>, shutdown: &Shutdown) -> Result<(), AutomationError>
    where
        P: 'static,
    {
        let hub = self.port.hub();
        let jobs = self
            .prepare(&*hub, hub.webhook_settings(), hub.cron_settings())
            .await?;
        if !jobs.is_empty() {
            let (automation, port, stop) = (self.clone(), hub.clone(), shutdown.listener());
            tokio::task::spawn_local(async move { automation.cron_loop(&port, jobs, stop).await });
        }
        hub.follow_jobs(shutdown.listener());
        Ok(())
    }

    /// Reads the webhook tokens and makes sure every channel a `[[cron]]` or `[[webhook]]`
    /// names exists as an automation channel. Returns the cron jobs for
    /// [`Automation::cron_loop`].
    async fn prepare(
        &self,
        port: &impl Port,
        webhooks: &[WebhookConfig],
        crons: &[CronConfig],
    ) -> Result<Vec<CronJob>, AutomationError> {
        let mut hooks = Vec::new();
        for hook in webhooks {
            let label = format!("[[webhook]] `{}`", hook.name);
            let token = match &hook.token_file {
                Some(path) => std::fs::read_to_string(path)
                    .map(|t| t.lines().next().unwrap_or("").trim().to_owned())
                    .map_err(|e| {
                        AutomationError::Entry(format!(
                            "{label}: cannot read token_file {}: {e}",
                            path.display()
                        ))
                    })?,
                None => hook.token.expose().to_owned(),
            };
            if token.chars().count() < MIN_TOKEN_CHARS {
                return Err(AutomationError::Entry(format!(
                    "{label}: the token must be at least {MIN_TOKEN_CHARS} characters"
                )));
            }
            hooks.push(Hook {
                name: hook.name.clone(),
                channel: hook.channel.trim().to_owned(),
                digest: ids::token_hash(&token),
            });
        }
        let mut jobs = Vec::new();
        for (i, job) in crons.iter().enumerate() {
            let label = format!("[[cron]] #{} ({})", i + 1, job.schedule);
            let schedule = job
                .schedule
                .parse::<cron::Schedule>()
                .map_err(|e| AutomationError::Entry(format!("{label}: {e}")))?;
            jobs.push(CronJob {
                label,
                channel: job.channel.trim().to_owned(),
                schedule,
                prompt: job.prompt.clone(),
            });
        }
        let wanted: Vec<(&str, String)> = jobs
            .iter()
            .map(|j| (j.channel.as_str(), j.label.clone()))
            .chain(
                hooks
                    .iter()
                    .map(|h| (h.channel.as_str(), format!("[[webhook]] `{}`", h.name))),
            )
            .collect();
        for (channel, origin) in &wanted {
            self.channel(port, channel, origin).await?;
        }
        let (hook_count, job_count) = (hooks.len(), jobs.len());
        self.webhooks.borrow_mut().hooks = hooks;
        if hook_count + job_count > 0 {
            info!(
                webhooks = hook_count,
                cron_jobs = job_count,
                "automation ready"
            );
        }
        Ok(jobs)
    }
}

// Asks only the core: the agent's jobs post into automation's channels through their own port.
impl<P> Automation<P> {
    /// The root channel named `name`, made an automation channel: created if missing (announced
    /// with `channel.created`), marked if not yet (announced with `channel.renamed`, as
    /// `channel.set_automation` does). The default channel is refused. `origin` names the config
    /// entry in logs and errors.
    pub(super) async fn channel(
        &self,
        port: &impl Port,
        name: &str,
        origin: &str,
    ) -> Result<Channel, AutomationError> {
        let max_chars = self.limits.max_name_chars;
        if name.is_empty() || name.chars().count() > max_chars || name.chars().any(char::is_control)
        {
            return Err(AutomationError::Entry(format!(
                "{origin}: the channel name `{name}` must be 1 to {max_chars} characters (limits.max_name_chars), without control characters"
            )));
        }
        let _held = self.finding_channel.lock().await;
        let all = self.store.channels().map_err(AutomationError::Directory)?;
        let found = all
            .iter()
            .find(|c| !c.is_thread() && c.name == name)
            .cloned();
        let (entry, frame) = match found {
            Some(c) if c.is_default => {
                return Err(AutomationError::Entry(format!(
                    "{origin} posts into `{name}`, which is the default channel; automation channels only receive gateway output, so name another channel (or make another channel the default first)"
                )))
            }
            Some(c) if c.automation => return Ok(c),
            // The same rule as `channel.set_automation`: an automation channel has no threads
            // (its composer is hidden, so they could never be written to again).
            Some(c) if all.iter().any(|t| t.parent_chat_id.as_deref() == Some(c.chat_id.as_str())) => {
                return Err(AutomationError::Entry(format!(
                    "{origin} posts into `{name}`, which has threads; an automation channel has none, so name another channel (or delete its threads first)"
                )))
            }
            Some(mut c) => {
                c.automation = true;
                info!(channel = %c.chat_id, "marked `{name}` as an automation channel for {origin}");
                (c, "channel.renamed")
            }
            None => {
                let max = self.limits.max_channels;
                if all.len() >= max {
                    return Err(AutomationError::Entry(format!(
                        "{origin}: cannot create the channel `{name}`: the directory is full ({max} channels and threads, limits.max_channels)"
                    )));
                }
                let mut c = Channel::new(
                    ids::time_ordered("chan"),
                    name.to_owned(),
                    ChannelKind::Channel,
                    None,
                );
                c.automation = true;
                info!(channel = %c.chat_id, "created the automation channel `{name}` for {origin}");
                (c, "channel.created")
            }
        };
        let changes = vec![
            Change::PutChannel(entry.clone()),
            Change::Outbox(Frame::channel_entry(frame, &entry).outboxed()),
        ];
        port.commit(changes, None)
            .await
            .map_err(|source| AutomationError::Save {
                origin: origin.to_owned(),
                name: name.to_owned(),
                source,
            })?;
        Ok(entry)
    }
}

impl<P: AutomationPort> Automation<P> {
    /// Admits a webhook request before its body is read: the hook exists (404), `ip` is under
    /// [`WEBHOOK_FAILURES_PER_MINUTE`] wrong tokens (429, before the token is looked at), the
    /// bearer token matches (401, compared as SHA-256 digests in constant time; counted as it
    /// begins, `guessing.rs`), the announced length fits `limits.max_webhook_bytes` (413), and
    /// the rate is under `limits.webhooks_per_minute` over all hooks (429; only authorised
    /// requests count). Returns the channel name the hook posts into.
    pub fn webhook_admit(
        &self,
        name: &str,
        authorization: Option<&str>,
        announced_bytes: u64,
        ip: IpAddr,
    ) -> Result<String, HookError> {
        let limits = &self.limits;
        {
            let mut a = self.webhooks.borrow_mut();
            let a = &mut *a;
            let hook = a
                .hooks
                .iter()
                .find(|h| h.name == name)
                .ok_or(HookError::NotFound)?;
            let now = Instant::now();
            let attempt = a
                .bad_tokens
                .begin(ip, now)
                .map_err(|limited| HookError::Guessing {
                    retry_after_secs: limited.retry_after.as_secs().max(1),
                    shared: limited.shared,
                })?;
            let presented = authorization
                .and_then(bearer_token)
                .ok_or(HookError::Unauthorized)?;
            if !same_bytes(&ids::token_hash(presented), &hook.digest) {
                return Err(HookError::Unauthorized);
            }
            a.bad_tokens.succeeded(attempt, now);
            let channel = hook.channel.clone();
            if announced_bytes > limits.max_webhook_bytes as u64 {
                return Err(HookError::TooLarge(format!(
                    "the body is {announced_bytes} bytes; the limit is {} (limits.max_webhook_bytes)",
                    limits.max_webhook_bytes
                )));
            }
            let now = Instant::now();
            while a
                .admitted
                .front()
                .is_some_and(|t| now.duration_since(*t) >= RATE_WINDOW)
            {
                a.admitted.pop_front();
            }
            if a.admitted.len() >= limits.webhooks_per_minute as usize {
                let wait = a
                    .admitted
                    .front()
                    .map_or(RATE_WINDOW, |t| RATE_WINDOW - now.duration_since(*t));
                return Err(HookError::RateLimited {
                    retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
                });
            }
            a.admitted.push_back(now);
            Ok(channel)
        }
    }

    /// Posts an admitted webhook's body into its channel: JSON `{"text", "title"?}` when the
    /// content type is `application/json`, else the body as UTF-8 text. Returns the message id
    /// once the message and its notification are durable (and published).
    pub async fn post_webhook(
        &self,
        hook: &str,
        channel: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Result<String, HookError> {
        let (title, text) = parse_webhook_body(content_type, body)?;
        if text.trim().is_empty() {
            return Err(HookError::BadRequest(
                "the text is empty: nothing to post".into(),
            ));
        }
        let max = self.limits.max_text_bytes;
        if text.len() > max {
            return Err(HookError::TooLarge(format!(
                "the text is {} bytes; the limit is {max} (limits.max_text_bytes)",
                text.len()
            )));
        }
        let port = &*self.port.hub();
        let entry = self
            .channel(port, channel, &format!("[[webhook]] `{hook}`"))
            .await
            .map_err(|e| HookError::Unavailable(e.to_string()))?;
        let title = title
            .as_deref()
            .map(|t| t.lines().next().unwrap_or("").trim())
            .filter(|t| !t.is_empty())
            .map(|t| t.chars().take(MAX_TITLE_CHARS).collect::<String>())
            .unwrap_or_else(|| entry.name.clone());
        self.post(port, &entry, &title, text)
            .await
            .map_err(|e| HookError::Unavailable(format!("could not store the message: {e}")))
    }

    /// Stores `text` as a message with role `cron` in `channel`'s lane, with its `message`
    /// frame and a `notification{kind:cron, title}`, in one commit (deleting the message later
    /// withdraws both frames). Returns the message id.
    async fn post(
        &self,
        port: &impl Port,
        channel: &Channel,
        title: &str,
        text: String,
    ) -> Result<String, CommitError> {
        let lane = Lane::new(&channel.chat_id, None);
        let message = HistoryMessage::text_only(ids::message_id(), Role::Cron, text, ids::now_ms());
        let changes = cron_message_changes(&lane, title, &message);
        port.commit(changes, None).await?;
        Ok(message.message_id)
    }
}

/// A `cron` message in `lane` as the changes that store it: the message, its `message` frame
/// and its `notification{kind:cron, title}` (pushed to away devices), both withdrawn if the
/// message is deleted. The caller commits them, with anything that must change with them.
pub(super) fn cron_message_changes(
    lane: &Lane,
    title: &str,
    message: &crate::protocol::HistoryMessage,
) -> Vec<Change> {
    let body: String = message.text.chars().take(NOTIFICATION_BODY_CHARS).collect();
    let notification = Frame::notification("cron", title, &body, message.ts)
        .in_lane(&lane.chat_id, lane.thread())
        .outboxed();
    vec![
        Change::PutMessage(lane.clone(), message.clone()),
        Change::OutboxOf {
            message_id: message.message_id.clone(),
            frame: Frame::message(message)
                .in_lane(&lane.chat_id, lane.thread())
                .outboxed(),
        },
        Change::OutboxOf {
            message_id: message.message_id.clone(),
            frame: notification,
        },
    ]
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Equal lengths and bytes, in time independent of where they differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A webhook body as (title, text). Public for fuzz/fuzz_targets/webhook_body.rs.
pub fn parse_webhook_body(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<(Option<String>, String), HookError> {
    let is_json = content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("application/json")
    });
    if is_json {
        #[derive(serde::Deserialize)]
        struct Posted {
            text: String,
            #[serde(default)]
            title: Option<String>,
        }
        let shape = "a JSON body must be {\"text\": \"…\", \"title\": \"… (optional)\"}";
        // serde reads a struct from an array too (`["hi","T"]` as text and title); only the
        // documented object is accepted (found by fuzz/webhook_body).
        if !body.trim_ascii_start().starts_with(b"{") {
            return Err(HookError::BadRequest(format!("{shape}: not an object")));
        }
        let posted: Posted = serde_json::from_slice(body)
            .map_err(|e| HookError::BadRequest(format!("{shape}: {e}")))?;
        Ok((posted.title, posted.text))
    } else {
        let text = std::str::from_utf8(body).map_err(|_| {
            HookError::BadRequest(
                "the body is not UTF-8 text (send text, or JSON with Content-Type: application/json)"
                    .into(),
            )
        })?;
        Ok((None, text.to_owned()))
    }
}

/// The next run of `schedule` strictly after `now`.
fn next_run(schedule: &cron::Schedule, now: &DateTime<Local>) -> Option<DateTime<Local>> {
    schedule.after(now).next()
}

/// Whether the wall clock moved by more than [`CLOCK_STEP`] beyond the monotonic time elapsed.
fn clock_stepped(wall: TimeDelta, monotonic: Duration) -> bool {
    let monotonic = TimeDelta::from_std(monotonic).unwrap_or(TimeDelta::MAX);
    let step = TimeDelta::from_std(CLOCK_STEP).unwrap_or(TimeDelta::MAX);
    (wall - monotonic).abs() > step
}

impl<P: AutomationPort> Automation<P> {
    /// The one cron task: fires due jobs, skips a job whose previous run is still queued or
    /// running, and stops when the gateway shuts down.
    pub(super) async fn cron_loop(
        &self,
        port: &Rc<impl AutomationPort>,
        jobs: Vec<CronJob>,
        mut stop: Listener,
    ) {
        let mut last = (Local::now(), Instant::now());
        let mut next: Vec<Option<DateTime<Local>>> = jobs
            .iter()
            .map(|j| next_run(&j.schedule, &last.0))
            .collect();
        // The lane of each job's last run, until that lane has been seen idle. Only cron runs turns
        // in automation lanes, so a job whose lane is busy may still have its run queued; a job
        // sharing a busy channel with another job is skipped too (conservatively).
        let mut pending: Vec<Option<Lane>> = vec![None; jobs.len()];
        loop {
            if stop.is_shutdown() {
                return;
            }
            let now = (Local::now(), Instant::now());
            if clock_stepped(now.0 - last.0, now.1.duration_since(last.1)) {
                warn!(
                    "the clock jumped by {} s; cron jobs are rescheduled from the new time",
                    ((now.0 - last.0).num_seconds()
                        - now.1.duration_since(last.1).as_secs() as i64)
                );
                next = jobs.iter().map(|j| next_run(&j.schedule, &now.0)).collect();
            }
            last = now;
            for p in pending.iter_mut() {
                if p.as_ref().is_some_and(|lane| port.lane_idle(lane)) {
                    *p = None;
                }
            }
            for (i, job) in jobs.iter().enumerate() {
                if next[i].is_none_or(|at| at > now.0) {
                    continue;
                }
                next[i] = next_run(&job.schedule, &now.0);
                if pending[i].is_some() {
                    info!(job = %job.label, "skipping a run: the previous one is still queued or running");
                    continue;
                }
                match self.channel(&**port, &job.channel, &job.label).await {
                    Ok(channel) => {
                        let lane = Lane::new(&channel.chat_id, None);
                        info!(job = %job.label, channel = %channel.chat_id, "cron job due: asking the agent");
                        port.enqueue_automation(
                            lane.clone(),
                            job.prompt.clone(),
                            channel.name.clone(),
                        );
                        pending[i] = Some(lane);
                    }
                    Err(e) => warn!(job = %job.label, "cron run skipped: {e}"),
                }
            }
            let earliest = next.iter().flatten().min().copied();
            let wait = earliest
                .map(|at| (at - Local::now()).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(MAX_CRON_SLEEP)
                .min(MAX_CRON_SLEEP);
            tokio::select! {
                _ = tokio::time::sleep(wait.max(Duration::from_millis(1))) => {}
                _ = stop.recv() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
    }

    #[test]
    fn digests_compare_by_content() {
        assert!(same_bytes(b"abc", b"abc"));
        assert!(!same_bytes(b"abc", b"abd"));
        assert!(!same_bytes(b"abc", b"ab"));
    }

    #[test]
    fn bodies_are_json_or_text() {
        let json = Some("application/json; charset=utf-8");
        assert_eq!(
            parse_webhook_body(json, br#"{"text":"hi","title":"T"}"#),
            Ok((Some("T".into()), "hi".into()))
        );
        assert_eq!(
            parse_webhook_body(json, br#"{"text":"hi","extra":1}"#),
            Ok((None, "hi".into()))
        );
        assert!(matches!(
            parse_webhook_body(json, br#"{"title":"T"}"#),
            Err(HookError::BadRequest(_))
        ));
        assert_eq!(
            parse_webhook_body(Some("text/plain"), "héllo".as_bytes()),
            Ok((None, "héllo".into()))
        );
        assert_eq!(
            parse_webhook_body(None, br#"{"text":"raw"}"#),
            Ok((None, r#"{"text":"raw"}"#.into()))
        );
        assert!(matches!(
            parse_webhook_body(json, br#"["hi","T"]"#),
            Err(HookError::BadRequest(_))
        ));
        assert!(matches!(
            parse_webhook_body(None, &[0xff, 0xfe]),
            Err(HookError::BadRequest(_))
        ));
    }

    #[test]
    fn clock_steps_are_told_from_elapsed_time() {
        let secs = TimeDelta::seconds;
        assert!(!clock_stepped(secs(30), Duration::from_secs(30)));
        assert!(!clock_stepped(secs(31), Duration::from_secs(30)));
        assert!(clock_stepped(secs(3600), Duration::from_secs(30)));
        assert!(clock_stepped(secs(-3600), Duration::from_secs(30)));
    }

    #[test]
    fn the_next_run_is_after_now_and_never_a_backlog() {
        let schedule: cron::Schedule = "0 30 7 * * *".parse().expect("schedule");
        let now = Local::now();
        let next = next_run(&schedule, &now).expect("a next run");
        assert!(next > now && next - now <= TimeDelta::days(1) + TimeDelta::hours(1));
    }
}
