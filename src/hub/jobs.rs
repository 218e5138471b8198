//! The agent's scheduled jobs (Hermes' `cronjob` tool and `/api/jobs`): each run's result
//! reaches the lane the job was made in, once, and `/jobs` lists and changes them.
//!
//! A job made by a turn (`AgentEvent::JobMade`) is recorded with its lane (`AgentJob`). One
//! task asks the agent for its job list every [`JOB_POLL_INTERVAL`] (one request, however many
//! jobs) and looks for a job's new runs only when its `last_run_at` changed since the last
//! look, or at start, which is how runs finished while the gateway was down are caught up, in
//! order, at most one a second into a lane. Each run becomes a `cron` message with the run's own time, and the job's record moves
//! its newest delivered run in the same commit: a crash delivers a run fully or not at all, and
//! never twice. A job whose lane was deleted, or that was made outside Iris, posts into the
//! automation channel [`AGENT_JOBS_CHANNEL`]. A job made outside Iris while the gateway
//! watched has every run delivered; one found at the gateway's first look after a start (made
//! while it was down, or before it ever ran) starts from its newest run, so an agent's old
//! history is not replayed into the channel.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use serde_json::{json, Value};
use tracing::{debug, info, warn};

use super::automation::{cron_message_changes, Automation, AutomationError};
use super::choices::Setting;
use super::errors::CommitError;
use super::port::Port;
use crate::agent::{Agent, AgentEvent, JobAction, JobInfo, JobRun};
use crate::ids;
use crate::protocol::{fit, HistoryMessage, Lane, Role};
use crate::shutdown::Listener;
use crate::store::{AgentJob, Change, Record, Store};

/// How often the agent's job list is read.
pub const JOB_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// A lane gets at most one job result this often: a burst is paced, never dropped.
pub const JOB_RESULT_PACE: Duration = Duration::from_secs(1);
/// The automation channel for results that have no lane of their own.
pub const AGENT_JOBS_CHANNEL: &str = "Agent jobs";
/// Jobs a `/jobs` picker lists; the rest are named by count.
const MAX_PICKED_JOBS: usize = 30;
/// Messages looked back through for job results the agent has not seen.
const JOB_CONTEXT_LOOKBACK: usize = 16;
/// Job results handed to the agent with the next message, newest kept.
const JOB_CONTEXT_RESULTS: usize = 3;
/// Each handed over up to this many characters.
const JOB_CONTEXT_CHARS: usize = 2000;
/// A picker label names this much of a job's name.
const MAX_JOB_LABEL_CHARS: usize = 60;

/// The agent's scheduled jobs as the gateway follows them: their records in the store, the
/// agent that runs them. The delivering task's memory is its own ([`Watch`]); what it posts
/// goes through the port, into a lane or the automation channel [`AGENT_JOBS_CHANNEL`].
pub(super) struct AgentJobs {
    store: Store,
    agent: Rc<dyn Agent>,
    /// `limits.max_text_bytes`: a longer run's output is cut with a note.
    max_text_bytes: usize,
}

/// What `/jobs` answers in the lane: a sentence, or a picker to offer.
pub(super) enum JobsOffer {
    Say(String),
    Pick {
        title: String,
        choices: Vec<Value>,
        setting: Setting,
    },
}

impl AgentJobs {
    pub(super) fn new(store: Store, agent: Rc<dyn Agent>, max_text_bytes: usize) -> AgentJobs {
        AgentJobs {
            store,
            agent,
            max_text_bytes,
        }
    }

    /// The task that delivers the agent's job results, until `stop`.
    pub(super) async fn follow<P: AgentJobsPort>(
        &self,
        port: &P,
        automation: &Automation<P>,
        mut stop: Listener,
    ) {
        let mut watch = Watch {
            looked: HashMap::new(),
            first_look: true,
            sighted: HashSet::new(),
            posted: HashMap::new(),
        };
        loop {
            if stop.is_shutdown() {
                return;
            }
            if self.agent.has_jobs() {
                match self.agent.jobs().await {
                    Ok(jobs) => {
                        self.deliver_job_runs(port, automation, &jobs, &mut watch)
                            .await;
                        watch.first_look = false;
                    }
                    Err(e) => debug!("could not read the agent's jobs: {e}"),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(JOB_POLL_INTERVAL) => {}
                _ = stop.recv() => return,
            }
        }
    }

    /// Delivers the runs of `jobs` not delivered yet; forgets jobs the agent no longer has.
    async fn deliver_job_runs<P: AgentJobsPort>(
        &self,
        port: &P,
        automation: &Automation<P>,
        jobs: &[JobInfo],
        watch: &mut Watch,
    ) {
        watch.posted.retain(|_, at| at.elapsed() < JOB_RESULT_PACE);
        let known: HashMap<String, AgentJob> = match self.store.agent_jobs() {
            Ok(records) => records.into_iter().map(|r| (r.job_id.clone(), r)).collect(),
            Err(e) => return warn!("cannot read the agent jobs' records: {e}"),
        };
        for job in jobs {
            let record = known.get(&job.id);
            if record.is_some() && watch.looked.get(&job.id) == Some(&job.last_run_at) {
                continue;
            }
            // A job new to the gateway may be one a running turn just made, whose lane is on
            // its way to the store: it is taken as made outside Iris only if still unclaimed
            // at the next look.
            if record.is_none() && !watch.first_look && watch.sighted.insert(job.id.clone()) {
                continue;
            }
            let after = record.and_then(|r| r.delivered.as_deref());
            let runs = match self.agent.job_runs(job, after).await {
                Ok(runs) => runs,
                Err(e) => {
                    warn!(job = %job.id, "could not read the job's runs: {e}");
                    continue;
                }
            };
            let deliver = Delivery { port, automation };
            let done = match record {
                Some(_) => {
                    self.deliver_runs(&deliver, job, runs, &mut watch.posted)
                        .await
                }
                None if watch.first_look => self.adopt_job(port, job, runs.last()).await,
                None => match self.adopt_job(port, job, None).await {
                    Ok(()) => {
                        self.deliver_runs(&deliver, job, runs, &mut watch.posted)
                            .await
                    }
                    Err(e) => Err(e),
                },
            };
            match done {
                Ok(()) => {
                    watch.sighted.remove(&job.id);
                    watch.looked.insert(job.id.clone(), job.last_run_at.clone());
                }
                Err(e) => warn!(job = %job.id, "could not deliver the job's result: {e}"),
            }
        }
        for gone in known.keys().filter(|id| !jobs.iter().any(|j| &j.id == *id)) {
            let change = Change::Record(Record::RemoveAgentJob(gone.clone()));
            if let Err(e) = port.commit(vec![change], None).await {
                warn!(job = %gone, "could not forget a removed job: {e}");
            }
            watch.looked.remove(gone);
        }
        watch.sighted.retain(|id| jobs.iter().any(|j| &j.id == id));
    }

    /// A job the gateway did not see being made: its results go to the agent-jobs channel,
    /// starting after its newest run so far.
    async fn adopt_job(
        &self,
        port: &impl AgentJobsPort,
        job: &JobInfo,
        newest: Option<&JobRun>,
    ) -> Result<(), JobError> {
        info!(job = %job.id, "the agent has a job made outside Iris: its results go to `{AGENT_JOBS_CHANNEL}`");
        let record = AgentJob {
            job_id: job.id.clone(),
            lane: None,
            delivered: newest.map(|r| r.stamp.clone()),
        };
        port.commit(vec![Change::Record(Record::PutAgentJob(record))], None)
            .await?;
        Ok(())
    }

    /// Posts `runs` (oldest first) one commit each, moving the job's delivered mark with each;
    /// a lane gets at most one result every [`JOB_RESULT_PACE`] (`posted`: when each lane last
    /// got one), so a burst caught up at start reaches the phones paced, none dropped.
    async fn deliver_runs(
        &self,
        deliver: &Delivery<'_, impl AgentJobsPort>,
        job: &JobInfo,
        runs: Vec<JobRun>,
        posted: &mut HashMap<Lane, Instant>,
    ) -> Result<(), JobError> {
        for run in runs {
            // Read again for each run: the turn that made the job may have named its lane since.
            let record = match self.store.agent_jobs() {
                Ok(records) => records.into_iter().find(|r| r.job_id == job.id),
                Err(e) => return Err(e.into()),
            };
            let Some(mut record) = record else {
                return Ok(());
            };
            record.delivered = Some(run.stamp.clone());
            let mut changes = vec![Change::Record(Record::PutAgentJob(record.clone()))];
            if let Some(text) = run.text {
                // No lane to post into (the agent-jobs channel cannot be made): nothing is marked
                // delivered, and the run is tried again at the next look.
                let lane = deliver.lane(record.lane.as_ref()).await?;
                if let Some(last) = posted.get(&lane) {
                    tokio::time::sleep_until(*last + JOB_RESULT_PACE).await;
                }
                // `MEDIA:` lines go through the media policy, as in any answer (files stored
                // before the message: a crash between them leaves an offer for no message).
                let (text, files) = self.agent.files_of(text).await;
                let text = cut_with_note(text, self.max_text_bytes);
                let mut message =
                    HistoryMessage::text_only(ids::message_id(), Role::Cron, text, run.at_ms);
                deliver
                    .port
                    .attach_agent_files(&lane, &mut message, files)
                    .await;
                changes.extend(cron_message_changes(&lane, &job.name, &message));
                info!(job = %job.id, %lane, run = %run.stamp, "delivering a job's result");
                deliver.port.commit(changes, None).await?;
                posted.insert(lane, Instant::now());
            } else {
                deliver.port.commit(changes, None).await?;
            }
        }
        Ok(())
    }

    /// A turn in `lane` made the agent job `job_id`: its results belong to this lane (a record
    /// the poller already made for it keeps its delivered mark).
    pub(super) async fn made(&self, port: &impl AgentJobsPort, lane: &Lane, job_id: String) {
        let delivered = match self.store.agent_jobs() {
            Ok(records) => records
                .into_iter()
                .find(|r| r.job_id == job_id)
                .and_then(|r| r.delivered),
            Err(e) => return warn!(%lane, "cannot read the agent jobs' records: {e}"),
        };
        let record = AgentJob {
            job_id: job_id.clone(),
            lane: Some(lane.clone()),
            delivered,
        };
        match port
            .commit(vec![Change::Record(Record::PutAgentJob(record))], None)
            .await
        {
            Ok(_) => {
                info!(%lane, job = %job_id, "the agent made a job here: its results come here")
            }
            Err(e) => warn!(%lane, job = %job_id, "could not record the job's lane: {e}"),
        }
    }

    /// `text` with the job results posted in `lane` since the agent last spoke there: Hermes
    /// ran each job in a session of its own, so without them a reply to a result would reach
    /// the lane's conversation with no idea what it answers. Lines after the text in the shape
    /// of attachment lines (`\n[…]`), so a restart's recovery still knows the message.
    pub(super) async fn with_results(
        &self,
        lane: &Lane,
        current: &str,
        mut text: String,
    ) -> String {
        if !self.agent.has_jobs() {
            return text;
        }
        let Ok((Ok(page), _)) = self
            .store
            .query_history_page(lane.clone(), None, JOB_CONTEXT_LOOKBACK)
            .await
        else {
            return text;
        };
        let mut unseen: Vec<HistoryMessage> = page
            .messages
            .into_iter()
            .rev()
            .filter(|m| m.message_id != current)
            .take_while(|m| m.role == Role::Cron || m.role == Role::System)
            .filter(|m| m.role == Role::Cron)
            .take(JOB_CONTEXT_RESULTS)
            .collect();
        unseen.reverse();
        for m in unseen {
            let said: String = m.text.chars().take(JOB_CONTEXT_CHARS).collect();
            let at = chrono::DateTime::from_timestamp_millis(m.ts)
                .map(|t| {
                    t.with_timezone(&chrono::Local)
                        .format("%Y-%m-%d %H:%M")
                        .to_string()
                })
                .unwrap_or_default();
            text.push_str(&format!(
                "\n[A scheduled job's result, posted in this chat at {at}: {said}]"
            ));
        }
        text
    }

    /// `/jobs`: a picker of the agent's jobs, this lane's first.
    pub(super) async fn picker(&self, lane: &Lane) -> JobsOffer {
        if !self.agent.has_jobs() {
            let text = format!(
                "This agent ({}) has no scheduled jobs: only Hermes makes and runs them.",
                self.agent.name()
            );
            return JobsOffer::Say(text);
        }
        let jobs = match self.agent.jobs().await {
            Ok(jobs) => jobs,
            Err(e) => {
                let text = format!("Could not ask the agent for its jobs: {e}.");
                return JobsOffer::Say(text);
            }
        };
        if jobs.is_empty() {
            let text = "The agent has no scheduled jobs. Ask it for one, e.g. \"remind me every morning at 8 to water the garden\".".to_owned();
            return JobsOffer::Say(text);
        }
        let lanes: HashMap<String, Option<Lane>> = self
            .store
            .agent_jobs()
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.job_id, r.lane))
            .collect();
        let here = |j: &JobInfo| lanes.get(&j.id).is_some_and(|l| l.as_ref() == Some(lane));
        let mut ordered: Vec<&JobInfo> = jobs.iter().filter(|j| here(j)).collect();
        ordered.extend(jobs.iter().filter(|j| !here(j)));
        let choices: Vec<Value> = ordered
            .iter()
            .take(MAX_PICKED_JOBS)
            .map(|j| {
                let elsewhere = if here(j) { "" } else { " (another chat)" };
                json!({
                    "value": j.id,
                    "label": format!("{}{elsewhere}", job_label(j)),
                    "is_current": false,
                })
            })
            .collect();
        let title = match jobs.len() {
            n if n > MAX_PICKED_JOBS => {
                format!("Scheduled jobs (the first {MAX_PICKED_JOBS} of {n})")
            }
            _ => "Scheduled jobs".to_owned(),
        };
        JobsOffer::Pick {
            title,
            choices,
            setting: Setting::Job,
        }
    }

    /// A job was chosen in a `/jobs` picker: offer what can be done to it.
    pub(super) async fn actions_picker(&self, job_id: &str) -> JobsOffer {
        let job = match self.agent.jobs().await {
            Ok(jobs) => jobs.into_iter().find(|j| j.id == job_id),
            Err(e) => {
                let text = format!("Could not ask the agent for its jobs: {e}.");
                return JobsOffer::Say(text);
            }
        };
        let Some(job) = job else {
            return JobsOffer::Say("The agent no longer has that job.".to_owned());
        };
        let choices: Vec<Value> = JobAction::ALL
            .into_iter()
            .filter(|a| match a {
                JobAction::Pause => !job.paused,
                JobAction::Resume => job.paused,
                _ => true,
            })
            .map(|a| {
                let label = match a {
                    JobAction::Pause => "Pause",
                    JobAction::Resume => "Resume",
                    // Hermes' run now (`trigger_job`, 0.19.0 and 0.22) schedules a paused
                    // job again: said before it is chosen, not found out a minute later.
                    JobAction::RunNow if job.paused => "Run now (resumes it)",
                    JobAction::RunNow => "Run now",
                    JobAction::Remove => "Remove",
                };
                json!({ "value": a.value(), "label": label, "is_current": false })
            })
            .collect();
        JobsOffer::Pick {
            title: job_label(&job),
            choices,
            setting: Setting::JobAction(job.id),
        }
    }

    /// An action chosen for a job: done at the agent, and said in the lane.
    pub(super) async fn apply_action(&self, job_id: &str, value: &str) -> String {
        let Some(action) = JobAction::from_value(value) else {
            return format!(
                "`{value}` is not something a job can do: pause, resume, run or remove."
            );
        };
        match self.agent.job_action(job_id, action).await {
            Ok(()) => match action {
                JobAction::Pause => "Paused the job: it will not run until resumed.".to_owned(),
                JobAction::Resume => "Resumed the job.".to_owned(),
                JobAction::RunNow => "The job runs at the agent's next scheduler tick (within a minute); its result comes here.".to_owned(),
                JobAction::Remove => "Removed the job.".to_owned(),
            },
            Err(e) => format!("Could not change the job: {e}."),
        }
    }
}

/// What the agent's jobs ask of the hub beyond the core: storing the files a job's answer names.
#[allow(async_fn_in_trait)]
pub(super) trait AgentJobsPort: Port {
    /// Stores the files an agent's answer names (`MEDIA:` lines, through the media policy) and
    /// attaches them to `message`.
    async fn attach_agent_files(
        &self,
        lane: &Lane,
        message: &mut HistoryMessage,
        files: Vec<AgentEvent>,
    );
}

/// Where the delivering task posts: the hub, through the port, and automation's channels.
struct Delivery<'a, P> {
    port: &'a P,
    automation: &'a Automation<P>,
}

impl<P: AgentJobsPort> Delivery<'_, P> {
    /// Where a job's result goes: its lane while it exists, else the agent-jobs channel.
    async fn lane(&self, lane: Option<&Lane>) -> Result<Lane, JobError> {
        if let Some(lane) = lane.filter(|l| self.port.lane_exists(l)) {
            return Ok(lane.clone());
        }
        let channel = self
            .automation
            .channel(self.port, AGENT_JOBS_CHANNEL, "the agent's jobs")
            .await
            .map_err(JobError::NoChannel)?;
        Ok(Lane::new(&channel.chat_id, None))
    }
}

/// What the delivering task remembers between looks (memory only).
struct Watch {
    /// Each job's `last_run_at` at the last look that delivered everything: an unchanged one
    /// is not looked into again. Empty at start, so every job is looked into once.
    looked: HashMap<String, Option<String>>,
    /// The first look since start: jobs found now start from their newest run.
    first_look: bool,
    /// Jobs seen once with no record: adopted at the next look if no turn claimed them.
    sighted: HashSet<String>,
    /// When each lane last got a result (within [`JOB_RESULT_PACE`]).
    posted: HashMap<Lane, Instant>,
}

/// Why a job's run was not delivered (it is tried again at the next look).
#[derive(Debug, thiserror::Error)]
enum JobError {
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error("cannot use the `{AGENT_JOBS_CHANNEL}` channel: {0}")]
    NoChannel(#[source] AutomationError),
}

impl From<crate::store::StoreError> for JobError {
    fn from(e: crate::store::StoreError) -> JobError {
        JobError::Commit(e.into())
    }
}

/// A run's text within `max` bytes (`limits.max_text_bytes`), cut with a note when longer.
fn cut_with_note(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let note = format!(
        "\n\n[cut: the job's output was {} bytes, over limits.max_text_bytes; the agent keeps it whole]",
        text.len()
    );
    let mut end = max.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&note);
    text
}

/// How a picker names a job: name, schedule, next run, last status.
fn job_label(j: &JobInfo) -> String {
    let mut label: String = j.name.chars().take(MAX_JOB_LABEL_CHARS).collect();
    if !j.schedule.is_empty() {
        label.push_str(&format!(" \u{2014} {}", j.schedule));
    }
    if j.paused {
        label.push_str(" \u{2014} paused");
    } else if let Some(next) = &j.next_run_at {
        label.push_str(&format!(" \u{2014} next {}", short_time(next)));
    }
    if let Some(status) = &j.last_status {
        label.push_str(&format!(" \u{2014} last {status}"));
    }
    fit::cut_in_place(&mut label, fit::PREVIEW_BYTES);
    label
}

/// `2026-12-07T10:51:00.123+00:00` as `2026-12-07 10:51`.
fn short_time(iso: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(iso) {
        Ok(t) => t
            .with_timezone(&chrono::Local)
            .format("%Y-%m-%d %H:%M")
            .to_string(),
        Err(_) => iso.chars().take(32).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_output_is_cut_with_a_note_within_the_limit() {
        let short = "fits".to_owned();
        assert_eq!(cut_with_note(short.clone(), 100), short);
        let long = "é".repeat(600); // 1200 bytes, two a character
        let cut = cut_with_note(long, 300);
        assert!(cut.len() <= 300, "{}", cut.len());
        assert!(cut.starts_with("éé"));
        assert!(cut.ends_with("over limits.max_text_bytes; the agent keeps it whole]"));
        assert!(cut.contains("was 1200 bytes"));
    }

    #[test]
    fn a_label_says_schedule_next_run_and_last_status() {
        let job = JobInfo {
            id: "abc".into(),
            name: "garden".into(),
            schedule: "every 1m".into(),
            next_run_at: Some("not a time".into()),
            last_status: Some("ok".into()),
            ..JobInfo::default()
        };
        assert_eq!(
            job_label(&job),
            "garden \u{2014} every 1m \u{2014} next not a time \u{2014} last ok"
        );
        let paused = JobInfo {
            paused: true,
            ..job
        };
        assert!(job_label(&paused).contains("paused"));
        assert!(!job_label(&paused).contains("next"));
    }
}
