//! Admin work the gateway owns, not the request that asked for it: a restore, an update's
//! download and install, a release-index check, a backup made from the page.
//!
//! A request's deadline bounds reading the request, never the work it starts (architecture
//! invariant 8). So a form that starts long work takes the slot of its kind here, hands the work
//! to a task of the event loop (which awaits its blocking part on a blocking thread), and answers
//! at once with a `303` to the job's page, which shows it running (and reloads itself) and then
//! its outcome. The slot is held by the work, not by the request: a second start while one runs
//! is refused and says so, whatever happened to the browser that started the first.
//!
//! What a crash cuts short is undone at the next start by the work's own files (a restore's
//! staging, an update's `upload.part`), never applied later: this table lives in memory only.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use maud::{html, Markup};

// The kinds are part of the job pages' addresses, so they are declared with the routes.
pub(super) use super::route::Kind;
use super::route::{Route, KINDS};

impl Kind {
    fn index(self) -> usize {
        KINDS.iter().position(|k| *k == self).unwrap_or(0)
    }

    /// What it is, in the owner's words.
    pub(super) fn title(self) -> &'static str {
        match self {
            Kind::Restore => "Restoring a backup",
            Kind::Backup => "Making a backup",
            Kind::UpdateCheck => "Checking for a newer version",
            Kind::UpdateInstall => "Downloading and checking an update",
        }
    }

    /// The page the work belongs to, for the job page's way back.
    pub(super) fn home(self) -> Route {
        match self {
            Kind::Restore | Kind::Backup => Route::Backup,
            Kind::UpdateCheck | Kind::UpdateInstall => Route::Update,
        }
    }

    /// The job page's address.
    pub(super) fn page(self) -> String {
        Route::Job(self).path().into_owned()
    }
}

/// Where a job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Phase {
    Running,
    Succeeded,
    Failed,
}

/// A job as its page shows it.
#[derive(Debug, Clone)]
pub(super) struct View {
    pub(super) phase: Phase,
    /// While running: what is being done; after: the outcome, in the owner's words.
    pub(super) message: String,
    pub(super) started: SystemTime,
    /// How long it ran (so far, while it runs).
    pub(super) took: Duration,
}

struct Job {
    phase: Phase,
    message: String,
    started: SystemTime,
    began: Instant,
    ended: Option<Instant>,
}

/// A start refused: one of its kind is running.
#[derive(Debug, thiserror::Error)]
#[error("{} is already under way (started {} s ago); wait for it to end, nothing new was started", .kind.title().to_lowercase(), .running_for.as_secs())]
pub(super) struct Busy {
    pub(super) kind: Kind,
    pub(super) running_for: Duration,
}

/// The one owner of the admin page's jobs: the last job of each kind.
#[derive(Default)]
pub(super) struct Jobs {
    slots: RefCell<[Option<Job>; KINDS.len()]>,
}

impl Jobs {
    /// Takes the slot of `kind` for work described by `what`; the ticket holds it until it is
    /// finished or dropped (a dropped ticket is a failure: the work ended without a word).
    pub(super) fn begin(self: &Rc<Self>, kind: Kind, what: &str) -> Result<Ticket, Busy> {
        let mut slots = self.slots.borrow_mut();
        let slot = &mut slots[kind.index()];
        if let Some(job) = slot.as_ref().filter(|j| j.phase == Phase::Running) {
            return Err(Busy {
                kind,
                running_for: job.began.elapsed(),
            });
        }
        *slot = Some(Job {
            phase: Phase::Running,
            message: what.to_owned(),
            started: SystemTime::now(),
            began: Instant::now(),
            ended: None,
        });
        Ok(Ticket {
            jobs: self.clone(),
            kind,
            done: false,
        })
    }

    /// Takes the slot and runs `work` on the event loop (its blocking part on a blocking
    /// thread, as it awaits); its `Ok` or `Err` sentence is the job's outcome.
    pub(super) fn start<F>(self: &Rc<Self>, kind: Kind, what: &str, work: F) -> Result<(), Busy>
    where
        F: Future<Output = Result<String, String>> + 'static,
    {
        let ticket = self.begin(kind, what)?;
        tokio::task::spawn_local(async move {
            let outcome = work.await;
            ticket.finish(outcome);
        });
        Ok(())
    }

    /// The last job of `kind` since the gateway started.
    pub(super) fn view(&self, kind: Kind) -> Option<View> {
        self.slots.borrow()[kind.index()].as_ref().map(|j| View {
            phase: j.phase.clone(),
            message: j.message.clone(),
            started: j.started,
            took: j.ended.unwrap_or_else(Instant::now) - j.began,
        })
    }

    pub(super) fn running(&self, kind: Kind) -> bool {
        self.view(kind).is_some_and(|v| v.phase == Phase::Running)
    }

    /// For a page: a line linking to each job of `kinds` that runs now.
    pub(super) fn under_way(&self, kinds: &[Kind]) -> Markup {
        html! {
            @for k in kinds.iter().filter(|k| self.running(**k)) {
                p.warn id={ "job-" (k.name()) } {
                    (k.title()) ": " a href=(k.page()) { "follow it" } "."
                }
            }
        }
    }

    fn end(&self, kind: Kind, outcome: Result<String, String>) {
        if let Some(job) = self.slots.borrow_mut()[kind.index()].as_mut() {
            let took = job.began.elapsed();
            (job.phase, job.message) = match outcome {
                Ok(m) => (Phase::Succeeded, m),
                Err(m) => (Phase::Failed, m),
            };
            job.ended = Some(Instant::now());
            tracing::info!(
                job = kind.name(),
                ok = job.phase == Phase::Succeeded,
                took_ms = took.as_millis() as u64,
                "admin job ended: {}",
                job.message
            );
        }
    }
}

/// The slot of one running job; it frees the slot when finished or dropped.
pub(super) struct Ticket {
    jobs: Rc<Jobs>,
    kind: Kind,
    done: bool,
}

impl Ticket {
    pub(super) fn finish(mut self, outcome: Result<String, String>) {
        self.done = true;
        self.jobs.end(self.kind, outcome);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.jobs.end(
                self.kind,
                Err(
                    "the work stopped before it could say how it went (the gateway is stopping?); \
                     nothing of it is applied"
                        .into(),
                ),
            );
        }
    }
}

/// How often the job page reloads itself while the job runs.
const RELOAD_SECS: u32 = 2;

/// The job page's body: what runs and since when, or how it ended, and the way back.
pub(super) fn body(kind: Kind, view: Option<&View>) -> Markup {
    let back = html! { p { a id="back" href=(kind.home()) { "Back to the page" } } };
    let Some(v) = view else {
        return html! {
            div id="result" {
                p id="job-state" {
                    "Nothing of this kind has been started since the gateway started."
                }
            }
            (back)
        };
    };
    let started = chrono::DateTime::<chrono::Local>::from(v.started)
        .format("%H:%M:%S")
        .to_string();
    let secs = v.took.as_secs();
    let (class, phase, state) = match v.phase {
        Phase::Running => (
            "warn",
            "running",
            format!("Running for {secs} s (started at {started})"),
        ),
        Phase::Succeeded => ("good", "succeeded", format!("Done in {secs} s")),
        Phase::Failed => ("bad", "failed", format!("Failed after {secs} s")),
    };
    let reload = (v.phase == Phase::Running).then_some(RELOAD_SECS);
    html! {
        div id="result" {
            p class=(class) id="job-state" data-phase=(phase) data-reload=[reload] {
                (state) "."
            }
            p id="job-message" { (super::words::owner_words(&v.message)) }
        }
        (back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_job_of_a_kind_holds_its_slot_until_it_ends() {
        let jobs = Rc::new(Jobs::default());
        let t = jobs.begin(Kind::Restore, "opening").unwrap();
        assert!(jobs.begin(Kind::Restore, "again").is_err());
        let other = jobs.begin(Kind::Backup, "another kind").unwrap();
        assert!(jobs.running(Kind::Restore));
        t.finish(Ok("restored".into()));
        let v = jobs.view(Kind::Restore).unwrap();
        assert_eq!(
            (v.phase, v.message.as_str()),
            (Phase::Succeeded, "restored")
        );
        drop(other);
        assert_eq!(jobs.view(Kind::Backup).unwrap().phase, Phase::Failed);
        assert!(jobs.begin(Kind::Restore, "a new one").is_ok());
    }
}
