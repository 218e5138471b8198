//! `POST /admin/strength`: the passphrase meter asks the gateway what it makes of a new
//! passphrase, so the meter shows the very test set-up and the change apply
//! (`owner::strength`) and the two cannot disagree. It changes nothing, but it is still a
//! form: its token (the set-up page's double-submit token, or the session's CSRF token) comes
//! in `X-CSRF-Token`, so no other site can use the box to rate passphrases. The body is
//! bounded by `limits.admin_max_form_bytes`, the checks by
//! `limits.admin_strength_checks_per_minute` over all browsers, and the passphrase is never
//! logged or kept.

use std::cell::Cell;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::json;

use super::reply::{json, Reply};
use super::{owner, read_form, session, Admin};

/// The path the meter posts to.
pub(super) const PATH: &str = "/admin/strength";

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

/// Answers `{"score", "ok", "words"}`, or 403 / 429 / 413 with `{"words"}`.
pub(super) async fn serve(admin: &Admin, req: Request<Incoming>) -> Reply {
    let refuse = |status, words: &str| json(status, &json!({ "words": words }));
    let token = req
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let pre = session::cookie(req.headers(), session::PRE_COOKIE)
        .is_some_and(|p| session::same(p, &token));
    let signed_in = || -> bool {
        let Ok(Some(o)) = owner::load(&admin.data_dir) else {
            return false;
        };
        admin
            .signed_in(req.headers(), &o)
            .is_some_and(|v| session::same(&v.csrf, &token))
    };
    if token.is_empty() || !(pre || signed_in()) {
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
    if let Err(secs) = admin.strength_checks.take(per_minute, Instant::now()) {
        let words = format!("Checked when you send the form (the meter resumes in {secs} s).");
        return refuse(StatusCode::TOO_MANY_REQUESTS, &words);
    }
    let form = match read_form(admin, req).await {
        Ok(f) => f,
        Err(_) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, "Too long to check."),
    };
    let passphrase = zeroize::Zeroizing::new(form.get("passphrase").to_owned());
    let s = owner::strength(&passphrase);
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
