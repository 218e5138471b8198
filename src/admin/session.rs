//! Admin sessions and their CSRF tokens, in a bounded table in memory.
//!
//! A session is a random 256-bit id in an `HttpOnly; SameSite=Strict` cookie (`Secure` over
//! https). The table keeps only the SHA-256 of each id, so nothing in memory can be replayed
//! as a cookie. Each session has its own CSRF token, which every state-changing form carries
//! and which is compared in constant time. A session ends when it is idle for
//! `limits.admin_session_idle_secs`, when it is older than `limits.admin_session_max_secs`, on
//! sign-out, and when the owner's passphrase changes (it is bound to the owner's stamp). The
//! table holds at most `limits.admin_max_sessions`; a new one past that ends the least recently
//! used.
//!
//! A restart keeps them: at shutdown the table is written to [`FILE`] in the data dir (the
//! hashes, CSRF tokens, owner stamps and times, never an id), read back at the next start and
//! removed at once, so a crash later cannot bring back a session ended meanwhile. That is one
//! small write per shutdown and one removal per start, never a write per request
//! (docs/storage.md).

use std::time::{Duration, Instant};

use std::path::Path;

use base64::Engine;
use serde::{Deserialize, Serialize};

use super::outcome::{Outcome, Paired};
use super::route::Route;
use sha2::{Digest, Sha256};

/// The session cookie's name.
pub const COOKIE: &str = "iris_admin";
/// The cookie that carries the set-up and sign-in forms' token before a session exists (a
/// double-submit token: a cross-site form cannot read or send it).
pub const PRE_COOKIE: &str = "iris_admin_pre";
/// Where the table waits in the data dir while the gateway restarts.
pub const FILE: &str = "admin-sessions.json";
/// Bytes per session in [`FILE`] are about 300; a bigger file is not ours.
const FILE_CAP: u64 = 64 << 10;

/// One signed-in browser.
struct Session {
    id_hash: [u8; 32],
    csrf: String,
    owner_stamp: [u8; 32],
    /// When `admin_session_max_secs` after sign-in is up.
    ends: Instant,
    last_used: Instant,
    /// What the last form did, for the page it redirected to.
    outcome: Option<Outcome>,
    /// The latest pairing not yet shown, under its one-time id (a newer one replaces it: the
    /// device stays listed, only its token is not shown again).
    paired: Option<(String, Paired)>,
}

/// A session as [`FILE`] keeps it: an `Instant` means nothing to the next process, so times
/// are wall-clock milliseconds.
#[derive(Serialize, Deserialize)]
struct Saved {
    id_hash: String,
    csrf: String,
    owner_stamp: String,
    ends_ms: i64,
    last_used_ms: i64,
}

/// Why [`FILE`] could not be read back (the sessions are then lost: one sign-in).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {FILE}: {0}")]
    Read(#[from] std::io::Error),
    #[error("{FILE} is not a session table: {0}")]
    Parse(#[from] serde_json::Error),
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

/// The set-up page's tokens: the gateway signs each one it issues (HMAC-SHA-256 under a key
/// that lives only in this process), so it can tell its own from a made-up cookie and header
/// pair without keeping a table a flood of page loads could fill. A double-submit token alone
/// only proves the two copies match, which anyone can arrange; the strength meter and the
/// set-up form also need one the gateway gave out.
pub struct SetupTokens {
    key: [u8; 32],
}

impl SetupTokens {
    pub fn new() -> SetupTokens {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).expect("the OS random source works");
        SetupTokens { key }
    }

    /// A fresh token: a random nonce and its signature, base64url, joined by a dot.
    pub fn issue(&self) -> String {
        let nonce = random_token();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!("{nonce}.{}", b64.encode(self.sign(nonce.as_bytes())))
    }

    /// Whether this process issued `token` (compared in constant time).
    pub fn issued(&self, token: &str) -> bool {
        let Some((nonce, mac)) = token.split_once('.') else {
            return false;
        };
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        same(&b64.encode(self.sign(nonce.as_bytes())), mac)
    }

    /// HMAC-SHA-256 (RFC 2104) of `message` under the key, by ring (already the TLS and the
    /// update signatures' crypto).
    fn sign(&self, message: &[u8]) -> [u8; 32] {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.key);
        ring::hmac::sign(&key, message)
            .as_ref()
            .try_into()
            .expect("an HMAC-SHA-256 tag is 32 bytes")
    }
}

impl Default for SetupTokens {
    fn default() -> SetupTokens {
        SetupTokens::new()
    }
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
            ends: now + self.lifetime,
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
    pub fn take_outcome(&mut self, key: &[u8; 32], page: &Route) -> Option<Outcome> {
        let s = self.by_key(key)?;
        if s.outcome.as_ref().is_some_and(|o| o.page == *page) {
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
        let idle = self.idle;
        self.sessions
            .retain(|s| now.saturating_duration_since(s.last_used) < idle && now < s.ends);
    }

    /// Writes the live sessions to `dir/FILE` (atomically, owner-only), for the next start;
    /// with none alive, writes nothing. `now_ms`: the wall clock at `now`.
    pub fn save(&mut self, dir: &Path, now: Instant, now_ms: i64) -> std::io::Result<()> {
        self.expire(now);
        if self.sessions.is_empty() {
            return Ok(());
        }
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let saved: Vec<Saved> = self
            .sessions
            .iter()
            .map(|s| Saved {
                id_hash: b64(&s.id_hash),
                csrf: s.csrf.clone(),
                owner_stamp: b64(&s.owner_stamp),
                ends_ms: now_ms.saturating_add(ms(s.ends.saturating_duration_since(now))),
                last_used_ms: now_ms.saturating_sub(ms(now.saturating_duration_since(s.last_used))),
            })
            .collect();
        let json = serde_json::to_vec(&saved).map_err(std::io::Error::other)?;
        crate::atomic_file::write(&dir.join(FILE), &json, 0o600)
    }

    /// Takes back what [`Sessions::save`] wrote in `dir`, and removes the file. A session is
    /// dropped if it ended meanwhile, or if the clock went back past its times (nothing then
    /// says how old it is). Returns how many came back.
    pub fn load(&mut self, dir: &Path, now: Instant, now_ms: i64) -> Result<usize, FileError> {
        use std::io::Read;
        let path = dir.join(FILE);
        let mut text = Vec::new();
        match std::fs::File::open(&path) {
            Ok(f) => f.take(FILE_CAP).read_to_end(&mut text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        std::fs::remove_file(&path)?;
        let saved: Vec<Saved> = serde_json::from_slice(&text)?;
        let bytes32 = |t: &str| -> Option<[u8; 32]> {
            let v = base64::engine::general_purpose::STANDARD.decode(t).ok()?;
            v.try_into().ok()
        };
        let lifetime = i64::try_from(self.lifetime.as_millis()).unwrap_or(i64::MAX);
        let idle = i64::try_from(self.idle.as_millis()).unwrap_or(i64::MAX);
        for s in saved {
            let (Some(id_hash), Some(owner_stamp)) = (bytes32(&s.id_hash), bytes32(&s.owner_stamp))
            else {
                continue;
            };
            let (left, idle_for) = (s.ends_ms - now_ms, now_ms - s.last_used_ms);
            if left <= 0 || left > lifetime || idle_for < 0 || idle_for >= idle {
                continue;
            }
            if self.sessions.len() >= self.max {
                break;
            }
            let idle_for = Duration::from_millis(idle_for as u64);
            self.sessions.push(Session {
                id_hash,
                csrf: s.csrf,
                owner_stamp,
                ends: now + Duration::from_millis(left as u64),
                // Just after a boot the monotonic clock is younger than the idle time: the
                // idle time then counts from the start.
                last_used: now.checked_sub(idle_for).unwrap_or(now),
                // Shown-once results stay in memory: a pairing token is never written to disk.
                outcome: None,
                paired: None,
            });
        }
        Ok(self.sessions.len())
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
    fn sessions_survive_a_restart_and_still_end() {
        let dir = tempfile::tempdir().unwrap();
        let (t0, ms0) = (Instant::now(), 1_000_000_000_000);
        let new = || Sessions::new(4, Duration::from_secs(10), Duration::from_secs(30));
        let mut s = new();
        let stamp = [1; 32];
        let a = s.create(stamp, t0);
        let b = s.create(stamp, t0);
        let csrf = s.check(&a, stamp, t0).unwrap().csrf;
        s.save(dir.path(), t0 + Duration::from_secs(5), ms0 + 5_000)
            .unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(!text.contains(&a) && !text.contains(&b), "no id is kept");

        // The next process: its own monotonic clock, the wall clock 2 s later.
        let t1 = Instant::now();
        let mut next = new();
        assert_eq!(next.load(dir.path(), t1, ms0 + 7_000).unwrap(), 2);
        assert!(!dir.path().join(FILE).exists(), "read once, then removed");
        assert_eq!(next.check(&a, stamp, t1).unwrap().csrf, csrf);
        assert!(
            next.check(&b, [2; 32], t1).is_none(),
            "a new passphrase ends it"
        );
        // a's lifetime still counts from its sign-in (0 s), however busy it stays.
        assert!(next.check(&a, stamp, t1 + Duration::from_secs(9)).is_some());
        assert!(next
            .check(&a, stamp, t1 + Duration::from_secs(18))
            .is_some());
        next.save(dir.path(), t1 + Duration::from_secs(18), ms0 + 25_000)
            .unwrap();
        let t2 = Instant::now();
        let mut third = new();
        assert_eq!(third.load(dir.path(), t2, ms0 + 29_000).unwrap(), 1);
        assert!(third.check(&a, stamp, t2).is_some());
        assert!(
            third
                .check(&a, stamp, t2 + Duration::from_secs(2))
                .is_none(),
            "its lifetime ended"
        );
        third.save(dir.path(), t2, ms0 + 29_000).unwrap();
        assert!(
            !dir.path().join(FILE).exists(),
            "none alive: nothing written"
        );

        let c = s.create(stamp, t0);
        s.save(dir.path(), t0, ms0).unwrap();
        assert_eq!(
            new().load(dir.path(), t1, ms0 + 31_000).unwrap(),
            0,
            "ended meanwhile"
        );
        s.save(dir.path(), t0, ms0).unwrap();
        let mut back = new();
        assert_eq!(
            back.load(dir.path(), t1, ms0 - 60_000).unwrap(),
            0,
            "the clock went back"
        );
        assert!(back.check(&c, stamp, t1).is_none());

        std::fs::write(dir.path().join(FILE), "not json").unwrap();
        assert!(back.load(dir.path(), t1, ms0).is_err());
        assert!(
            !dir.path().join(FILE).exists(),
            "a bad file is not read twice"
        );
    }

    #[test]
    fn an_outcome_and_a_pairing_are_shown_once() {
        use super::super::outcome::Tone;
        let t0 = Instant::now();
        let mut s = Sessions::new(2, Duration::from_secs(10), Duration::from_secs(30));
        let id = s.create([1; 32], t0);
        let key = s.check(&id, [1; 32], t0).unwrap().key;
        s.leave(&key, Outcome::new(Route::Push, Tone::Good, "Saved."));
        assert!(
            s.take_outcome(&key, &Route::Agent).is_none(),
            "another page"
        );
        assert_eq!(s.take_outcome(&key, &Route::Push).unwrap().text, "Saved.");
        assert!(s.take_outcome(&key, &Route::Push).is_none(), "shown once");
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
    fn only_setup_tokens_this_process_issued_pass() {
        let tokens = SetupTokens::new();
        let t = tokens.issue();
        assert!(tokens.issued(&t));
        assert!(!tokens.issued("made-up"));
        assert!(!tokens.issued(&random_token()));
        let (nonce, _) = t.split_once('.').unwrap();
        assert!(!tokens.issued(&format!("{nonce}.{}", random_token())));
        assert!(
            !SetupTokens::new().issued(&t),
            "another process's key signs differently"
        );
        // HMAC-SHA-256 as another implementation computes it (Python's `hmac`, the key of
        // RFC 4231's first case widened to 32 bytes).
        let fixed = SetupTokens { key: [0x0b; 32] };
        let hex: String = fixed
            .sign(b"Hi There")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "198a607eb44bfbc69903a0f1cf2bbdc5ba0aa3f3d9ae3c1c7a3b1696a0b68cf7"
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
