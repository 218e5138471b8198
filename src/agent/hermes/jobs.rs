//! Hermes' scheduled jobs: listed and changed through its `/api/jobs`. Their runs are read
//! from the output files its scheduler saves (`HERMES_HOME/cron/output/<job id>/<time>.md`)
//! when Hermes runs on this machine and its folder is found, else from the session each run is
//! (`cron_<job id>_<time>`, `GET /api/sessions?source=cron`), which a Hermes elsewhere on the
//! LAN gives too. Both name a run by its time: the digits of it are the run's stamp, so the
//! two orders agree. docs/agents.md says what each Hermes version gives and why.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::wire::{
    record, CronToolResult, JobList, JobRecord, JobsError, Role, SessionPage, Transcript,
};
use super::HermesAgent;
use crate::agent::http::{off_loop, Endpoint};
use crate::agent::{AgentError, JobAction, JobInfo, JobRun, LocalBoxFuture};

/// Hermes' job ids: path-safe, so one can name a folder (its API checks the same).
fn is_job_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The job a `cronjob` tool call (`cronjob_manage` in 0.22) made: its `create` result, the only
/// one with a top-level `job_id` (in 0.19.0 and 0.22).
pub(super) fn made_job_id(tool_output: &str) -> Option<String> {
    let v: Value = serde_json::from_str(tool_output).ok()?;
    let made: CronToolResult = record(&v);
    if !made.success {
        return None;
    }
    made.job_id.filter(|id| is_job_id(id))
}

/// A job of `GET /api/jobs`.
fn job_info(j: JobRecord) -> Option<JobInfo> {
    let id = j.id.filter(|id| is_job_id(id))?;
    let schedule = j
        .schedule_display
        .or(j.schedule.display)
        .unwrap_or_default();
    let paused = j.enabled == Some(false) || j.state.as_deref() == Some("paused");
    Some(JobInfo {
        name: j.name.unwrap_or_else(|| id.clone()),
        id,
        schedule,
        next_run_at: j.next_run_at,
        last_run_at: j.last_run_at,
        last_status: j.last_status,
        paused,
    })
}

/// The jobs of a `GET /api/jobs` answer.
pub(super) fn jobs_of(v: &Value) -> Vec<JobInfo> {
    record::<JobList>(v)
        .jobs
        .into_iter()
        .filter_map(job_info)
        .collect()
}

/// Hermes' words for "nothing to report" (its scheduler does not deliver these either).
fn is_silent(answer: &str) -> bool {
    let upper = answer.trim().to_ascii_uppercase();
    upper.starts_with("[SILENT]") || matches!(upper.as_str(), "SILENT" | "NO_REPLY" | "NO REPLY")
}

/// What a saved run says to the person: its response (after the last `## Response` heading,
/// which Hermes writes after the prompt), or its error; `None` when it asked for silence.
pub(super) fn run_text(document: &str) -> Option<String> {
    if let Some((_, answer)) = document.rsplit_once("## Response") {
        let answer = answer.trim();
        return (!answer.is_empty() && !is_silent(answer)).then(|| answer.to_owned());
    }
    if let Some((_, error)) = document.rsplit_once("## Error") {
        let error = error.trim().trim_matches('`').trim();
        return Some(format!("The job failed: {error}"));
    }
    let whole = document.trim();
    (!whole.is_empty() && !is_silent(whole)).then(|| whole.to_owned())
}

/// The runs saved in `dir` newer than `after`, oldest first. Blocking: run it off the loop.
/// Hermes names each file after the run's time (`YYYY-MM-DD_HH-MM-SS.md`), so names order runs.
fn saved_runs(dir: &Path, after: Option<&str>, max_bytes: u64) -> Result<Vec<JobRun>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        // No run saved yet.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    };
    let mut found: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let time = name.strip_suffix(".md")?;
            // Hermes' own temporary files start with a dot.
            let stamp = run_stamp(time).filter(|_| !time.starts_with('.'))?;
            after
                .is_none_or(|a| stamp.as_str() > a)
                .then(|| (stamp, e.path()))
        })
        .collect();
    found.sort();
    let mut runs = Vec::with_capacity(found.len());
    for (stamp, path) in found {
        let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let at_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or_else(crate::ids::now_ms, |d| d.as_millis() as i64);
        // A run's document is read whole only up to the bound; the rest is cut with a note
        // where the message is made (the hub's text limit is smaller still).
        let mut bytes = Vec::new();
        use std::io::Read;
        std::fs::File::open(&path)
            .and_then(|f| f.take(max_bytes).read_to_end(&mut bytes))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let document = String::from_utf8_lossy(&bytes);
        runs.push(JobRun {
            stamp,
            at_ms,
            text: run_text(&document),
        });
    }
    Ok(runs)
}

/// A run's time as Hermes writes it (`2026-12-07_10-54-51` in a file name, `20261207_105451`
/// in a session id) as its stamp: the 14 digits, which order runs in both.
fn run_stamp(time: &str) -> Option<String> {
    let digits: String = time.chars().filter(char::is_ascii_digit).collect();
    (digits.len() == 14
        && time
            .chars()
            .all(|c| c.is_ascii_digit() || c == '-' || c == '_'))
    .then_some(digits)
}

/// Said for a run whose session holds no answer.
const NO_ANSWER: &str = "The job's run ended without an answer; /jobs shows its last status.";

/// Cron sessions read per page, and pages at most: the newest 500 runs of all jobs are found.
const SESSION_PAGE: usize = 100;
const MAX_SESSION_PAGES: usize = 5;

/// `job_id`'s finished runs newer than `after` from Hermes' sessions, oldest first: a run is
/// the session `cron_<job id>_<YYYYMMDD_HHMMSS>`, its answer the last assistant message. A run
/// still going (no `ended_at`) and every later one wait for the next look. Blocking.
fn session_runs(
    ep: &Endpoint,
    job_id: &str,
    after: Option<&str>,
) -> Result<Vec<JobRun>, AgentError> {
    let prefix = format!("cron_{job_id}_");
    let mut found: Vec<(String, String, Option<f64>)> = Vec::new();
    for page in 0..MAX_SESSION_PAGES {
        let v = ep.get_json(&format!(
            "/api/sessions?source=cron&limit={SESSION_PAGE}&offset={}",
            page * SESSION_PAGE
        ))?;
        let page: SessionPage = record(&v);
        for s in page.data {
            let Some(id) = s.id else {
                continue;
            };
            let Some(stamp) = id.strip_prefix(&prefix).and_then(run_stamp) else {
                continue;
            };
            if after.is_none_or(|a| stamp.as_str() > a) {
                found.push((stamp, id, s.ended_at));
            }
        }
        if !page.has_more {
            break;
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let mut runs = Vec::new();
    for (stamp, id, ended) in found {
        let Some(ended) = ended else {
            break;
        };
        let v = ep.get_json(&format!("/api/sessions/{id}/messages"))?;
        let rows = record::<Transcript>(&v).rows().unwrap_or_default();
        let answer = rows
            .iter()
            .rev()
            .filter(|m| m.role == Role::Assistant)
            .filter_map(|m| m.content.words())
            .find(|t| !t.trim().is_empty())
            .unwrap_or_default();
        let answer = answer.trim();
        let text = match answer {
            // A failed run leaves no answer in its session (its error is in Hermes' files).
            "" => Some(NO_ANSWER.to_owned()),
            a if is_silent(a) => None,
            a => Some(a.to_owned()),
        };
        runs.push(JobRun {
            stamp,
            at_ms: (ended * 1000.0) as i64,
            text,
        });
    }
    Ok(runs)
}

/// The longest run document read: Hermes' output of one run, far above any message's limit.
const MAX_RUN_DOCUMENT_BYTES: u64 = 1 << 20;

impl HermesAgent {
    /// Where Hermes saves `job_id`'s runs, when it runs on this machine and its output folder
    /// is found (`agent.hermes_home`, default `$HERMES_HOME`, else `~/.hermes`).
    fn job_output_dir(&self, job_id: &str) -> Option<PathBuf> {
        if !crate::agent::media_out::url_is_local(self.endpoint.base()) || !is_job_id(job_id) {
            return None;
        }
        let output = self.files.hermes_home.clone()?.join("cron").join("output");
        output.is_dir().then(|| output.join(job_id))
    }

    pub(super) fn list_jobs(&self) -> LocalBoxFuture<'_, Result<Vec<JobInfo>, AgentError>> {
        let ep = self.endpoint.clone();
        Box::pin(async move {
            let v = off_loop("agent-jobs", move |_| {
                ep.get_json("/api/jobs?include_disabled=true")
            })
            .await??;
            Ok(jobs_of(&v))
        })
    }

    pub(super) fn runs_of<'a>(
        &'a self,
        job: &'a JobInfo,
        after: Option<&'a str>,
    ) -> LocalBoxFuture<'a, Result<Vec<JobRun>, AgentError>> {
        let dir = self.job_output_dir(&job.id);
        let after = after.map(str::to_owned);
        let ep = self.endpoint.clone();
        let job_id = job.id.clone();
        Box::pin(async move {
            match dir {
                Some(dir) => off_loop("agent-job-runs", move |_| {
                    saved_runs(&dir, after.as_deref(), MAX_RUN_DOCUMENT_BYTES)
                })
                .await?
                .map_err(AgentError::Failed),
                None => {
                    off_loop("agent-job-sessions", move |_| {
                        session_runs(&ep, &job_id, after.as_deref())
                    })
                    .await?
                }
            }
        })
    }

    pub(super) fn change_job<'a>(
        &'a self,
        job_id: &'a str,
        action: JobAction,
    ) -> LocalBoxFuture<'a, Result<(), AgentError>> {
        let ep = self.endpoint.clone();
        let (method, path) = match action {
            JobAction::Pause => ("POST", format!("/api/jobs/{job_id}/pause")),
            JobAction::Resume => ("POST", format!("/api/jobs/{job_id}/resume")),
            JobAction::RunNow => ("POST", format!("/api/jobs/{job_id}/run")),
            JobAction::Remove => ("DELETE", format!("/api/jobs/{job_id}")),
        };
        let valid = is_job_id(job_id);
        Box::pin(async move {
            if !valid {
                return Err(AgentError::Failed("not a job id".into()));
            }
            let (status, v) = off_loop("agent-job-action", move |_| {
                ep.call_json(method, &path, Some(&json!({})))
            })
            .await??;
            match status {
                200..=299 => Ok(()),
                404 => Err(AgentError::Failed(
                    "the agent no longer has that job".into(),
                )),
                _ => Err(AgentError::Failed(format!(
                    "HTTP {status}{}",
                    record::<JobsError>(&v)
                        .error
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_response_is_what_follows_its_last_heading() {
        let doc =
            "# Cron Job: g\n\n## Prompt\n\nsay ## Response\n\n## Response\n\nWater the garden\n";
        assert_eq!(run_text(doc).as_deref(), Some("Water the garden"));
        assert_eq!(run_text("# x\n\n## Response\n\n[SILENT]\n"), None);
        assert_eq!(
            run_text("# x (FAILED)\n\n## Prompt\n\np\n\n## Error\n\n```\nBoom: no\n```\n")
                .as_deref(),
            Some("The job failed: Boom: no")
        );
    }

    #[test]
    fn saved_runs_come_oldest_first_and_only_after_the_mark() {
        let dir = tempfile::tempdir().unwrap();
        for (name, answer) in [
            ("2026-12-07_10-01-00.md", "two"),
            ("2026-12-07_10-00-00.md", "one"),
            ("2026-12-07_10-02-00.md", "three"),
        ] {
            std::fs::write(dir.path().join(name), format!("## Response\n\n{answer}\n")).unwrap();
        }
        std::fs::write(dir.path().join(".output_x.tmp"), "half").unwrap();
        let all = saved_runs(dir.path(), None, 1 << 20).unwrap();
        let texts: Vec<_> = all.iter().map(|r| r.text.clone().unwrap()).collect();
        assert_eq!(texts, ["one", "two", "three"]);
        let newer = saved_runs(dir.path(), Some("20261207100100"), 1 << 20).unwrap();
        assert_eq!(newer.len(), 1);
        assert_eq!(newer[0].stamp, "20261207100200");
        assert!(saved_runs(&dir.path().join("none"), None, 1 << 20)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn file_and_session_times_give_one_stamp() {
        assert_eq!(
            run_stamp("2026-12-07_10-54-51").as_deref(),
            Some("20261207105451")
        );
        assert_eq!(
            run_stamp("20261207_105451").as_deref(),
            Some("20261207105451")
        );
        assert_eq!(run_stamp(".output_x"), None);
        assert_eq!(run_stamp("2026-12-07"), None);
    }

    #[test]
    fn jobs_are_read_from_the_list() {
        let v = json!({"jobs": [
            {"id": "abc123def456", "name": "garden", "schedule_display": "every 1m",
             "next_run_at": "2026-12-07T10:00:00+00:00", "last_status": "ok", "enabled": true},
            {"id": "../etc", "name": "bad"},
            {"id": "fedcba654321", "schedule": {"display": "0 9 * * *"}, "state": "paused"}
        ]});
        let jobs = jobs_of(&v);
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].schedule, "every 1m");
        assert!(!jobs[0].paused);
        assert_eq!(jobs[1].name, "fedcba654321");
        assert!(jobs[1].paused);
    }
}
