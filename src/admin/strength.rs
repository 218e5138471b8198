//! `POST /admin/strength`: the passphrase meter asks the gateway what it makes of a new
//! passphrase, so the meter shows the very test set-up and the change apply
//! (`owner::strength`) and the two cannot disagree.
//!
//! The estimate is real work (zxcvbn's cost grows faster than the length), and this door is
//! reachable before a session, so nothing unauthenticated gets it (docs/security.md, "What
//! costs the box work before a session"):
//! - only the set-up page while the box is unclaimed (its token must be one the gateway
//!   issued, `session::SetupTokens`) or a signed-in owner (the session's CSRF token) is
//!   answered; anything else is 403 before the body is read;
//! - every estimate (the meter's and the set-up and change forms' own check) goes through one
//!   [`Estimator`]: on a thread of its own at the lowest priority, one at a time gateway-wide,
//!   charged to one gateway-wide budget of estimate CPU time ([`BUDGET_MS_PER_SECOND`],
//!   [`BUDGET_BURST_MS`]), so rotating addresses cannot multiply it; only the first
//!   `owner::SCORED_CHARS` characters are rated;
//! - the meter's checks are also counted by `limits.admin_strength_checks_per_minute` over
//!   all browsers, the body bounded by `limits.admin_max_form_bytes`, and the passphrase is
//!   never logged or kept.

use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::json;
use zeroize::Zeroizing;

use super::reply::{json, Reply};
use super::{owner, read_form, session, Admin};

/// The path the meter posts to.
pub(super) const PATH: &str = "/admin/strength";

/// Estimate CPU time earned per second, over all browsers: a fifth of one core at most, so
/// the event loop's core and Hermes keep the rest whatever a flood of set-up pages asks.
pub const BUDGET_MS_PER_SECOND: u32 = 200;
/// Estimate CPU time that may be spent at once after a quiet spell: a few meter checks of long
/// passphrases in a row.
pub const BUDGET_BURST_MS: u32 = 2_000;

/// Checks counted in the current minute: a fixed window is enough for a bound on CPU.
pub(super) struct Window {
    start: Cell<Instant>,
    used: Cell<u32>,
}

impl Window {
    pub(super) fn new(now: Instant) -> Window {
        Window {
            start: Cell::new(now),
            used: Cell::new(0),
        }
    }

    /// Takes one check if the minute has room; the seconds until it has, if not.
    fn take(&self, per_minute: u32, now: Instant) -> Result<(), u64> {
        let minute = Duration::from_secs(60);
        if now.saturating_duration_since(self.start.get()) >= minute {
            self.start.set(now);
            self.used.set(0);
        }
        if self.used.get() >= per_minute {
            let left = minute.saturating_sub(now.saturating_duration_since(self.start.get()));
            return Err(left.as_secs().max(1));
        }
        self.used.set(self.used.get() + 1);
        Ok(())
    }
}

/// The gateway's one way to run a strength estimate (the meter's and the forms'): one at a
/// time, on a thread of its own at the lowest priority, charged to one budget of estimate CPU
/// time for all callers.
pub(super) struct Estimator {
    /// Held by the estimating thread until it is done: a request given up (its connection
    /// closed) while its estimate runs frees no room for another.
    one_at_a_time: Arc<tokio::sync::Semaphore>,
    /// Charged by the estimating thread itself, for the same reason.
    budget: Arc<Mutex<Budget>>,
    /// The meter's checks this minute (`limits.admin_strength_checks_per_minute`).
    meter_checks: Window,
}

/// Milliseconds of estimate CPU time that may still be spent, and when that was last brought
/// up to date; below zero after a long estimate (a debt the next callers wait out).
struct Budget {
    ms: f64,
    at: Instant,
}

impl Budget {
    /// The balance now, refilled for the time since it was last brought up to date.
    fn refill(&mut self, now: Instant) -> f64 {
        let earned =
            now.saturating_duration_since(self.at).as_secs_f64() * f64::from(BUDGET_MS_PER_SECOND);
        self.ms = (self.ms + earned).min(f64::from(BUDGET_BURST_MS));
        self.at = now;
        self.ms
    }

    fn charge(&mut self, now: Instant, took: Duration) {
        self.refill(now);
        self.ms -= took.as_secs_f64() * 1000.0;
    }
}

/// Why an estimate was not run: the gateway-wide budget or the one estimate at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Busy {
    /// Seconds until the budget has room again (at least 1).
    pub(super) retry_after_secs: u64,
}

/// Who asks, which decides whether a spent budget refuses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asker {
    /// The meter: refused while another estimate runs, the budget is spent or `per_minute`
    /// (`limits.admin_strength_checks_per_minute`) checks ran this minute.
    Meter { per_minute: u32 },
    /// The set-up form, before a session: waits its turn, refused while the budget is spent.
    SetupForm,
    /// A signed-in owner's change of passphrase: waits its turn and is never refused, only
    /// charged (it took a session to get here).
    Owner,
}

impl Estimator {
    pub(super) fn new(now: Instant) -> Estimator {
        Estimator {
            one_at_a_time: Arc::new(tokio::sync::Semaphore::new(1)),
            budget: Arc::new(Mutex::new(Budget {
                ms: f64::from(BUDGET_BURST_MS),
                at: now,
            })),
            meter_checks: Window::new(now),
        }
    }

    fn budget(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.budget
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `Err` while the budget is spent: when it has room again.
    fn has_room(&self, now: Instant) -> Result<(), Busy> {
        let balance = self.budget().refill(now);
        if balance > 0.0 {
            return Ok(());
        }
        let secs = (1.0 - balance) / f64::from(BUDGET_MS_PER_SECOND);
        Err(Busy {
            retry_after_secs: (secs.ceil() as u64).max(1),
        })
    }

    /// Rates `passphrase` (`owner::strength`) off the event loop, as [`Asker`] allows.
    pub(super) async fn rate(
        &self,
        passphrase: Zeroizing<String>,
        asker: Asker,
    ) -> Result<owner::Strength, Busy> {
        let permit = match asker {
            Asker::Meter { .. } => {
                self.one_at_a_time
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| Busy {
                        retry_after_secs: 1,
                    })?
            }
            Asker::SetupForm | Asker::Owner => self
                .one_at_a_time
                .clone()
                .acquire_owned()
                .await
                .expect("the estimator's semaphore is never closed"),
        };
        // Asked with the permit held: the balance then counts every estimate before this one.
        if asker != Asker::Owner {
            self.has_room(Instant::now())?;
        }
        // Counted only when it runs: checks refused as busy must not use up the minute.
        if let Asker::Meter { per_minute } = asker {
            self.meter_checks
                .take(per_minute, Instant::now())
                .map_err(|secs| Busy {
                    retry_after_secs: secs,
                })?;
        }
        let budget = self.budget.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A thread of its own at the lowest priority (one at most, by the permit): on a busy
        // box the event loop and Hermes go first, and no pooled worker keeps the priority.
        let spawned = std::thread::Builder::new()
            .name("strength-estimate".into())
            .spawn(move || {
                lower_this_threads_priority();
                let started = Instant::now();
                let cpu_before = thread_cpu_time();
                let s = owner::strength(&passphrase);
                let cpu = cpu_before.and_then(|b| Some(thread_cpu_time()?.saturating_sub(b)));
                // The CPU the estimate used: on a busy box its wall time also counts what
                // others took of the core meanwhile. Without the thread's clock, the wall time
                // (more, never less).
                let took = cpu.unwrap_or_else(|| started.elapsed());
                budget
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .charge(Instant::now(), took);
                drop(permit);
                let _ = tx.send(s);
            });
        let rated = match spawned {
            Ok(_) => rx.await.ok(),
            Err(_) => None,
        };
        Ok(rated.unwrap_or_else(|| owner::Strength {
            score: 0,
            ok: false,
            words: "The passphrase could not be checked: try again.".to_owned(),
        }))
    }
}

/// Makes the calling thread the last to get a busy core (nice 19); if the system refuses, it
/// runs at the normal priority, still one at a time within the budget.
fn lower_this_threads_priority() {
    // SAFETY: gettid has no preconditions; setpriority only changes this thread's nice value
    // (Linux keeps one per thread).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

/// The CPU time the calling thread has used so far, if the system says.
fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the one timespec it is given a valid pointer to.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Whether the meter's request carries a token this gateway stands behind: the set-up page's
/// (one it issued, and only while the box is unclaimed) or the signed-in owner's CSRF token.
fn may_ask(admin: &Admin, req: &Request<Incoming>) -> bool {
    let token = req
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if token.is_empty() {
        return false;
    }
    let setup = session::cookie(req.headers(), session::PRE_COOKIE)
        .is_some_and(|p| session::same(p, token))
        && admin.setup_tokens.issued(token);
    // Neither a token this gateway signed nor a session cookie: refused before the owner file
    // is read, so a flood of made-up pairs costs no disk.
    if !setup && session::cookie(req.headers(), session::COOKIE).is_none() {
        return false;
    }
    match owner::load(&admin.data_dir) {
        Ok(None) => setup,
        Ok(Some(o)) => admin
            .signed_in(req.headers(), &o)
            .is_some_and(|v| session::same(&v.csrf, token)),
        Err(_) => false,
    }
}

/// Answers `{"score", "ok", "words"}`, or 403 / 429 / 413 with `{"words"}`.
pub(super) async fn serve(admin: &Admin, req: Request<Incoming>) -> Reply {
    let refuse = |status, words: &str| json(status, &json!({ "words": words }));
    if !may_ask(admin, &req) {
        return refuse(
            StatusCode::FORBIDDEN,
            "Reload the page to check the passphrase.",
        );
    }
    let per_minute = admin
        .config
        .borrow()
        .limits
        .admin_strength_checks_per_minute;
    let form = match read_form(admin, req).await {
        Ok(f) => f,
        Err(_) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, "Too long to check."),
    };
    let passphrase = Zeroizing::new(form.get("passphrase").to_owned());
    match admin
        .estimator
        .rate(passphrase, Asker::Meter { per_minute })
        .await
    {
        Ok(s) => json(
            StatusCode::OK,
            &json!({ "score": s.score, "ok": s.ok, "words": s.words }),
        ),
        Err(Busy { retry_after_secs }) => {
            let words = format!(
                "Checked when you send the form (the meter resumes in {retry_after_secs} s)."
            );
            refuse(StatusCode::TOO_MANY_REQUESTS, &words)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_bounds_checks_per_minute() {
        let t0 = Instant::now();
        let w = Window::new(t0);
        assert!(w.take(2, t0).is_ok());
        assert!(w.take(2, t0).is_ok());
        assert_eq!(w.take(2, t0 + Duration::from_secs(20)), Err(40));
        assert!(w.take(2, t0 + Duration::from_secs(61)).is_ok());
    }

    #[test]
    fn the_budget_is_spent_by_estimate_time_and_refills() {
        let t0 = Instant::now();
        let e = Estimator::new(t0);
        assert!(e.has_room(t0).is_ok());
        let charge = |at, ms| e.budget().charge(at, Duration::from_millis(ms));
        charge(t0, u64::from(BUDGET_BURST_MS) + 400);
        // 400 ms in debt at 200 ms/s: a little over two seconds to be back above zero.
        assert_eq!(
            e.has_room(t0),
            Err(Busy {
                retry_after_secs: 3
            })
        );
        assert!(e.has_room(t0 + Duration::from_millis(1_500)).is_err());
        assert!(e.has_room(t0 + Duration::from_millis(2_100)).is_ok());
        // A long quiet spell refills only up to the burst.
        let later = t0 + Duration::from_secs(3_600);
        charge(later, u64::from(BUDGET_BURST_MS));
        assert!(e.has_room(later).is_err());
    }

    #[tokio::test]
    async fn an_estimate_given_up_still_holds_its_turn_and_is_charged() {
        let e = Estimator::new(Instant::now());
        let costly: String = "4@8(3!1|0$5+7".chars().cycle().take(64).collect();
        let meter = Asker::Meter { per_minute: 120 };
        // Started, then dropped at its first wait (as when the browser's connection closes).
        let given_up = e.rate(Zeroizing::new(costly.clone()), meter);
        let mut given_up = Box::pin(given_up);
        assert!(futures_poll_once(given_up.as_mut()).is_none());
        drop(given_up);
        assert_eq!(
            e.rate(Zeroizing::new(costly), meter).await,
            Err(Busy {
                retry_after_secs: 1
            }),
            "a second estimate ran beside the first"
        );
        // Its turn comes back once the thread is done, and the budget was charged.
        let _ = e.one_at_a_time.acquire().await.unwrap();
        assert!(e.budget().ms < f64::from(BUDGET_BURST_MS));
    }

    /// Polls a future once with a waker that does nothing.
    fn futures_poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
