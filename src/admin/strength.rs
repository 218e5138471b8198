//! `POST /admin/strength`: the passphrase meter asks the gateway what it makes of a new
//! passphrase, so the meter shows the very test set-up and the changes apply
//! (`owner::strength`, the rule in `passphrase_rule`) and the two cannot disagree.
//!
//! This door is reachable before a session (docs/security.md, "What costs the box work before
//! a session"):
//! - only the set-up page while the box is unclaimed (its token must be one the gateway
//!   issued, `session::SetupTokens`) or a signed-in owner (the session's CSRF token) is
//!   answered; anything else is 403 before the body is read;
//! - the meter's checks are counted by `limits.admin_strength_checks_per_minute` over all
//!   browsers (so rotating addresses cannot multiply them), the body bounded by
//!   `limits.admin_max_form_bytes`, and the passphrase is never logged or kept.
//!
//! A check is a few passes over at most `passphrase_rule::MAX_PASSPHRASE_BYTES` and a binary search
//! (`passphrase_rule`), bounded whatever is sent: it runs on a pooled blocking thread, and the
//! lowest-priority thread, the one-at-a-time and the CPU budget the zxcvbn estimate needed (its
//! cost grew faster than the length: about a second for 64 characters on a Pi) went with it.

use std::cell::Cell;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::json;
use zeroize::Zeroizing;

use super::context::{Ctx, Gate};
use super::passphrase_rule;
use super::reply::{json, Reply};
use super::{owner, read_form, session, Admin};
use crate::hub::Hub;

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

/// What the policy makes of a signed-in owner's new passphrase (the change, the backups'): the
/// box's own words are its names, its host name and its devices' names; the devices are left
/// out if the store cannot say (the rule still has the rest).
pub(super) async fn rate_for_owner(hub: &Hub, passphrase: &str) -> owner::Strength {
    let devices = hub.store().devices().unwrap_or_default();
    let words = passphrase_rule::own_words(devices.iter().map(|d| d.name.as_str()));
    rate_off_the_loop(passphrase, words).await
}

/// What the policy makes of the set-up page's passphrase: the box's names and host name only,
/// as `owner set` checks. Its devices' names stay out: the meter would tell anyone on the LAN
/// which words they contain.
pub(super) async fn rate_for_setup(passphrase: &str) -> owner::Strength {
    rate_off_the_loop(passphrase, passphrase_rule::own_words([])).await
}

/// Runs the rule on a blocking thread: bounded by its 1 KiB, but milliseconds unoptimised, and a
/// burst of a minute's meter checks on the event loop held a phone's pings back past 100 ms.
async fn rate_off_the_loop(passphrase: &str, words: Vec<String>) -> owner::Strength {
    let passphrase = Zeroizing::new(passphrase.to_owned());
    tokio::task::spawn_blocking(move || owner::strength(&passphrase, &words))
        .await
        .unwrap_or_else(|_| owner::Strength {
            score: 0,
            ok: false,
            words: "The passphrase could not be checked: try again.".to_owned(),
        })
}

/// Who asks the meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asker {
    SetUp,
    Owner,
}

/// Who asks, if the meter's request carries a token this gateway stands behind: the set-up
/// page's (one it issued, and only while the box is unclaimed) or the signed-in owner's CSRF
/// token.
fn may_ask(admin: &Admin, req: &Request<Incoming>, ctx: Ctx) -> Option<Asker> {
    let token = req
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if token.is_empty() {
        return None;
    }
    let setup = session::cookie(req.headers(), session::PRE_COOKIE)
        .is_some_and(|p| session::same(p, token))
        && admin.setup_tokens.issued(token);
    // Neither a token this gateway signed nor a session cookie: refused before the owner file
    // is read, so a flood of made-up pairs costs no disk.
    if !setup && session::cookie(req.headers(), session::COOKIE).is_none() {
        return None;
    }
    match Gate::of(admin, req.headers(), ctx) {
        Gate::Unclaimed => setup.then_some(Asker::SetUp),
        Gate::SignedIn(_, who) => session::same(who.csrf(), token).then_some(Asker::Owner),
        Gate::SignedOut(_) | Gate::Unreadable(_) => None,
    }
}

/// Answers `{"score", "ok", "words"}`, or 403 / 429 / 413 with `{"words"}`.
pub(super) async fn serve(admin: &Admin, hub: &Hub, req: Request<Incoming>, ctx: Ctx) -> Reply {
    let refuse = |status, words: &str| json(status, &json!({ "words": words }));
    let Some(asker) = may_ask(admin, &req, ctx) else {
        return refuse(
            StatusCode::FORBIDDEN,
            "Reload the page to check the passphrase.",
        );
    };
    let per_minute = admin
        .config
        .read(|c| c.limits.admin_strength_checks_per_minute);
    let form = match read_form(admin, req).await {
        Ok(f) => f,
        Err(_) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, "Too long to check."),
    };
    if let Err(secs) = admin.meter_checks.take(per_minute, Instant::now()) {
        let words = format!("Checked when you send the form (the meter resumes in {secs} s).");
        return refuse(StatusCode::TOO_MANY_REQUESTS, &words);
    }
    let passphrase = Zeroizing::new(form.get("passphrase").to_owned());
    let s = match asker {
        Asker::SetUp => rate_for_setup(&passphrase).await,
        Asker::Owner => rate_for_owner(hub, &passphrase).await,
    };
    json(
        StatusCode::OK,
        &json!({ "score": s.score, "ok": s.ok, "words": s.words }),
    )
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
}
