//! Admin sessions and their CSRF tokens, in a bounded table in memory.
//!
//! A session is a random 256-bit id in an `HttpOnly; SameSite=Strict` cookie (`Secure` over
//! https). The table keeps only the SHA-256 of each id, so nothing in memory can be replayed
//! as a cookie. Each session has its own CSRF token, which every state-changing form carries
//! and which is compared in constant time. A session ends when it is idle for
//! `limits.admin_session_idle_secs`, when it is older than `limits.admin_session_max_secs`, on
//! sign-out, and when the owner's passphrase changes (it is bound to the owner's stamp). The
//! table holds at most `limits.admin_max_sessions`; a new one past that ends the least recently
//! used. A restart ends them all (memory only), which costs one sign-in.

use std::time::{Duration, Instant};

use base64::Engine;

use super::outcome::{Outcome, Paired};
use sha2::{Digest, Sha256};

/// The session cookie's name.
pub const COOKIE: &str = "iris_admin";
/// The cookie that carries the set-up and sign-in forms' token before a session exists (a
/// double-submit token: a cross-site form cannot read or send it).
pub const PRE_COOKIE: &str = "iris_admin_pre";

/// One signed-in browser.
struct Session {
    id_hash: [u8; 32],
    csrf: String,
    owner_stamp: [u8; 32],
    created: Instant,
    last_used: Instant,
    /// What the last form did, for the page it redirected to.
    outcome: Option<Outcome>,
    /// The latest pairing not yet shown, under its one-time id (a newer one replaces it: the
    /// device stays listed, only its token is not shown again).
    paired: Option<(String, Paired)>,
}

/// A session that passed every check, as a handler needs it.
#[derive(Debug, Clone)]
pub struct Valid {
    pub csrf: String,
    /// Names the session for [`Sessions::leave`] and the other per-session calls.
    pub key: [u8; 32],
}

/// The table.
pub struct Sessions {
    sessions: Vec<Session>,
    max: usize,
    idle: Duration,
    lifetime: Duration,
}

/// A fresh random token: 32 bytes, base64url without padding (43 characters).
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What the table keeps of a session id: its SHA-256, never the id.
fn hash_id(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// Equality that takes as long for any two strings of the same length.
pub fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Sessions {
    /// An empty table with the limits from `[limits]`.
    pub fn new(max: usize, idle: Duration, lifetime: Duration) -> Sessions {
        Sessions {
            sessions: Vec::new(),
            max: max.max(1),
            idle,
            lifetime,
        }
    }

    /// Starts a session for the owner as of `owner_stamp`; returns the cookie value.
    pub fn create(&mut self, owner_stamp: [u8; 32], now: Instant) -> String {
        self.expire(now);
        if self.sessions.len() >= self.max {
            if let Some(oldest) = self
                .sessions
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(i, _)| i)
            {
                self.sessions.swap_remove(oldest);
            }
        }
        let id = random_token();
        self.sessions.push(Session {
            id_hash: hash_id(&id),
            csrf: random_token(),
            owner_stamp,
            created: now,
            last_used: now,
            outcome: None,
            paired: None,
        });
        id
    }

    /// The session for this cookie, if it is still good for the current owner; using it
    /// extends its idle time.
    pub fn check(&mut self, id: &str, owner_stamp: [u8; 32], now: Instant) -> Option<Valid> {
        self.expire(now);
        let h = hash_id(id);
        let pos = self.sessions.iter().position(|s| s.id_hash == h)?;
        if self.sessions[pos].owner_stamp != owner_stamp {
            self.sessions.swap_remove(pos);
            return None;
        }
        let s = &mut self.sessions[pos];
        s.last_used = now;
        Some(Valid {
            csrf: s.csrf.clone(),
            key: h,
        })
    }

    fn by_key(&mut self, key: &[u8; 32]) -> Option<&mut Session> {
        self.sessions.iter_mut().find(|s| &s.id_hash == key)
    }

    /// Leaves what a form did for the next GET of its page.
    pub fn leave(&mut self, key: &[u8; 32], outcome: Outcome) {
        if let Some(s) = self.by_key(key) {
            s.outcome = Some(outcome);
        }
    }

    /// What the last form did, if it was for `page`: shown once.
    pub fn take_outcome(&mut self, key: &[u8; 32], page: &str) -> Option<Outcome> {
        let s = self.by_key(key)?;
        if s.outcome.as_ref().is_some_and(|o| o.page == page) {
            return s.outcome.take();
        }
        None
    }

    /// Keeps a new pairing for one showing; returns its one-time id.
    pub fn keep_paired(&mut self, key: &[u8; 32], paired: Paired) -> String {
        let id = random_token();
        if let Some(s) = self.by_key(key) {
            s.paired = Some((id.clone(), paired));
        }
        id
    }

    /// The pairing kept under `id`, once: a second call (a reload) gets `None`.
    pub fn take_paired(&mut self, key: &[u8; 32], id: &str) -> Option<Paired> {
        let s = self.by_key(key)?;
        if s.paired.as_ref().is_some_and(|(k, _)| same(k, id)) {
            return s.paired.take().map(|(_, p)| p);
        }
        None
    }

    /// Ends every session (sign-out, a new passphrase): any browser signs in again.
    pub fn end_all(&mut self) {
        self.sessions.clear();
    }

    /// Sessions alive (for tests and the bound).
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// No session alive.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        let (idle, lifetime) = (self.idle, self.lifetime);
        self.sessions.retain(|s| {
            now.saturating_duration_since(s.last_used) < idle
                && now.saturating_duration_since(s.created) < lifetime
        });
    }
}

/// The value of cookie `name` in a request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a hyper::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == name).then_some(v)
        })
}

/// A `Set-Cookie` value for `name` (an empty value with `Max-Age=0` removes it).
pub fn set_cookie(name: &str, value: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    let age = if value.is_empty() { "; Max-Age=0" } else { "" };
    format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict{secure}{age}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_are_bounded_and_die_with_the_owner() {
        let t0 = Instant::now();
        let mut s = Sessions::new(2, Duration::from_secs(10), Duration::from_secs(30));
        let stamp = [1; 32];
        let a = s.create(stamp, t0);
        assert!(s.check(&a, stamp, t0).is_some());
        assert!(s.check("forged", stamp, t0).is_none());
        assert!(
            s.check(&a, [2; 32], t0).is_none(),
            "a new passphrase ends it"
        );
        assert!(s.check(&a, stamp, t0).is_none(), "and it stays ended");

        let b = s.create(stamp, t0);
        assert!(s.check(&b, stamp, t0 + Duration::from_secs(9)).is_some());
        assert!(s.check(&b, stamp, t0 + Duration::from_secs(18)).is_some());
        assert!(
            s.check(&b, stamp, t0 + Duration::from_secs(31)).is_none(),
            "the lifetime bounds a busy session"
        );
        let c = s.create(stamp, t0);
        assert!(
            s.check(&c, stamp, t0 + Duration::from_secs(11)).is_none(),
            "idle"
        );

        let first = s.create(stamp, t0);
        let _second = s.create(stamp, t0 + Duration::from_millis(1));
        let _third = s.create(stamp, t0 + Duration::from_millis(2));
        assert_eq!(s.len(), 2);
        assert!(
            s.check(&first, stamp, t0).is_none(),
            "the least recent went"
        );
    }

    #[test]
    fn an_outcome_and_a_pairing_are_shown_once() {
        use super::super::outcome::Tone;
        let t0 = Instant::now();
        let mut s = Sessions::new(2, Duration::from_secs(10), Duration::from_secs(30));
        let id = s.create([1; 32], t0);
        let key = s.check(&id, [1; 32], t0).unwrap().key;
        s.leave(&key, Outcome::new("/admin/push", Tone::Good, "Saved."));
        assert!(
            s.take_outcome(&key, "/admin/agent").is_none(),
            "another page"
        );
        assert_eq!(s.take_outcome(&key, "/admin/push").unwrap().text, "Saved.");
        assert!(s.take_outcome(&key, "/admin/push").is_none(), "shown once");
        let paired = Paired {
            device_id: "dev_1".into(),
            token: zeroize::Zeroizing::new("tok".into()),
            intro: "Pair",
        };
        let once = s.keep_paired(&key, paired);
        assert!(s.take_paired(&key, "forged").is_none());
        assert_eq!(s.take_paired(&key, &once).unwrap().device_id, "dev_1");
        assert!(
            s.take_paired(&key, &once).is_none(),
            "a reload finds it gone"
        );
    }

    #[test]
    fn tokens_compare_in_full() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        assert_eq!(random_token().len(), 43);
    }
}
