//! The owner's passphrase: an Argon2id hash in `DATA_DIR/owner.json`.
//!
//! A file of its own (not the store) so that `iris-gateway owner set|reset` works on the box
//! while the gateway runs (sled locks the store for one process) and takes effect at once: the
//! gateway reads this small file at every admin request. Its [`Owner::stamp`] changes with every
//! new hash (a fresh salt each time), and a session is only good for the stamp it was made
//! under, so setting, changing or resetting the passphrase ends every session.
//!
//! Hashing costs [`MEMORY_KIB`] of memory and about a second of CPU on a Pi: it runs on a
//! blocking thread, one at a time (`Admin::hashing`), never on the event loop.

use std::path::{Path, PathBuf};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::passphrase_rule::{self, Fault, Weakness};
pub use super::passphrase_rule::{MAX_PASSPHRASE_BYTES, MIN_PASSPHRASE_CHARS};

/// The file's name inside the data dir.
pub const FILE_NAME: &str = "owner.json";
/// The meter's level (0–4) from which a passphrase is accepted: 3 is "Good enough.", 4
/// "Strong." (`passphrase_rule::STRONG_CHARS`); a refused one is 0–2.
pub const MIN_STRENGTH_SCORE: u8 = 3;
/// Argon2id memory cost (OWASP's minimum for Argon2id: 19 MiB, 2 passes, 1 lane).
pub const MEMORY_KIB: u32 = 19 * 1024;
/// Argon2id passes (time cost).
const PASSES: u32 = 2;
/// Largest owner file read: a hash is about 100 bytes.
const MAX_FILE_BYTES: u64 = 4096;

/// Why the owner could not be read, set or checked.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("the passphrase must have at least {MIN_PASSPHRASE_CHARS} characters")]
    TooShort { chars: usize },
    #[error("the passphrase must be at most {MAX_PASSPHRASE_BYTES} bytes")]
    TooLong,
    #[error("this passphrase is too easy to guess ({}): add a few unrelated words", .0.why())]
    Weak(Weakness),
    #[error("cannot read or write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is damaged ({why}); `iris-gateway owner reset` removes it")]
    Damaged { path: PathBuf, why: String },
    #[error("cannot hash the passphrase: {0}")]
    Hash(String),
}

/// The stored owner: the PHC string of the hash (`$argon2id$v=19$m=…`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Owner {
    pub hash: String,
    pub set_ms: i64,
}

impl Owner {
    /// Identifies this hash without revealing it: sessions carry it, and die when it changes.
    pub fn stamp(&self) -> [u8; 32] {
        Sha256::digest(self.hash.as_bytes()).into()
    }
}

/// Where the owner file is for a data dir.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// What the policy makes of a new passphrase: the page's meter shows exactly this (it asks
/// `/admin/strength`), and set-up and the passphrase change refuse what is not `ok`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Strength {
    /// The meter's level, 0–4: from [`MIN_STRENGTH_SCORE`] when accepted; below it, 0–2 by
    /// length while too short, 1 for a weakness, 0 when too long.
    pub score: u8,
    /// Long enough and strong enough.
    pub ok: bool,
    /// One sentence for the owner.
    pub words: String,
}

/// Rates a new passphrase for the page's meter: the same test as [`check_new`], with the box's
/// own words (`passphrase_rule::own_words`).
pub fn strength(passphrase: &str, own_words: &[String]) -> Strength {
    match rate(passphrase, own_words) {
        Ok(score) => Strength {
            score,
            ok: true,
            words: if score == 4 {
                "Strong."
            } else {
                "Good enough."
            }
            .to_owned(),
        },
        Err(e) => Strength {
            score: match e {
                OwnerError::TooShort { chars } => (chars * 3 / MIN_PASSPHRASE_CHARS).min(2) as u8,
                OwnerError::Weak(_) => 1,
                _ => 0,
            },
            ok: false,
            words: sentence(&e.to_string()),
        },
    }
}

/// Checks a new passphrase against the policy (`passphrase_rule`) with the box's own words
/// known without the store (its names and host name): `owner set` at the box cannot read the
/// devices while the gateway runs; the pages check with their names too ([`strength`]) first.
pub fn check_new(passphrase: &str) -> Result<(), OwnerError> {
    rate(passphrase, &passphrase_rule::own_words([])).map(|_| ())
}

/// The meter's level of a passphrase the policy accepts, or why it does not.
fn rate(passphrase: &str, own_words: &[String]) -> Result<u8, OwnerError> {
    match passphrase_rule::check(passphrase, own_words) {
        Ok(accepted) if accepted.strong() => Ok(4),
        Ok(_) => Ok(MIN_STRENGTH_SCORE),
        Err(Fault::TooLong) => Err(OwnerError::TooLong),
        Err(Fault::TooShort { chars }) => Err(OwnerError::TooShort { chars }),
        Err(Fault::Weak(w)) => Err(OwnerError::Weak(w)),
    }
}

/// An error's text as a sentence: capital first, full stop last.
fn sentence(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect::<String>() + ".")
        .unwrap_or_default()
}

/// The one Argon2id configuration used to hash (verifying reads the parameters from the hash).
fn argon2() -> Argon2<'static> {
    let params = Params::new(MEMORY_KIB, PASSES, 1, None).expect("valid Argon2 parameters");
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// Hashes a new passphrase (blocking: about a second on a Pi).
pub fn hash(passphrase: &str) -> Result<Owner, OwnerError> {
    check_new(passphrase)?;
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| OwnerError::Hash(e.to_string()))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| OwnerError::Hash(e.to_string()))?;
    let hash = argon2()
        .hash_password(passphrase.as_bytes(), &salt)
        .map_err(|e| OwnerError::Hash(e.to_string()))?
        .to_string();
    Ok(Owner {
        hash,
        set_ms: crate::ids::now_ms(),
    })
}

/// Whether `passphrase` is the owner's (blocking). The parameters come from the stored hash.
pub fn verify(owner: &Owner, passphrase: &str) -> bool {
    if passphrase.len() > MAX_PASSPHRASE_BYTES {
        return false;
    }
    match PasswordHash::new(&owner.hash) {
        Ok(parsed) => argon2()
            .verify_password(passphrase.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

/// The owner, or `None` while the box is unclaimed.
pub fn load(data_dir: &Path) -> Result<Option<Owner>, OwnerError> {
    let path = path(data_dir);
    let io = |source| OwnerError::Io {
        path: path.clone(),
        source,
    };
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let mut text = String::new();
    use std::io::Read;
    file.take(MAX_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(io)?;
    let owner: Owner = serde_json::from_str(&text).map_err(|e| OwnerError::Damaged {
        path: path.clone(),
        why: e.to_string(),
    })?;
    PasswordHash::new(&owner.hash).map_err(|e| OwnerError::Damaged {
        path: path.clone(),
        why: e.to_string(),
    })?;
    Ok(Some(owner))
}

/// Stores the owner atomically (temporary file, fsync, rename), mode 0600.
pub fn store(data_dir: &Path, owner: &Owner) -> Result<(), OwnerError> {
    let path = path(data_dir);
    let io = |source| OwnerError::Io {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(data_dir).map_err(io)?;
    let text = serde_json::to_vec(owner).map_err(|e| io(std::io::Error::other(e)))?;
    crate::atomic_file::write(&path, &text, 0o600).map_err(io)
}

/// Stores the owner only if there is none yet (the claim): `Ok(false)` when someone was first.
/// The gateway is one thread and claims only from it, so check-then-write cannot race itself;
/// `owner set` from a shell at the same instant is the owner at the box anyway.
pub fn claim(data_dir: &Path, owner: &Owner) -> Result<bool, OwnerError> {
    if load(data_dir)?.is_some() {
        return Ok(false);
    }
    store(data_dir, owner)?;
    Ok(true)
}

/// Removes the owner: the box is unclaimed and the page shows set-up again.
pub fn reset(data_dir: &Path) -> Result<bool, OwnerError> {
    let path = path(data_dir);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(OwnerError::Io { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passphrase_round_trips_and_a_new_hash_changes_the_stamp() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_none());
        assert!(matches!(
            hash("short"),
            Err(OwnerError::TooShort { chars: 5 })
        ));
        assert!(matches!(
            hash("aaaaaaaaaaaa"),
            Err(OwnerError::Weak(Weakness::Repeats))
        ));
        let weak = strength("aaaaaaaaaaaa", &[]);
        assert!(!weak.ok);
        assert_eq!(
            weak.words,
            "This passphrase is too easy to guess (repeats like \"aaa\" or \"abab\" are tried \
             early): add a few unrelated words."
        );
        assert!(!strength("short", &[]).ok);
        assert!(strength("violet tractor harbour 42", &[]).ok);
        let owner = hash("correct horse battery").unwrap();
        assert!(owner.hash.starts_with("$argon2id$"), "{}", owner.hash);
        assert!(claim(dir.path(), &owner).unwrap());
        let other = hash("correct horse battery").unwrap();
        assert!(
            !claim(dir.path(), &other).unwrap(),
            "a claimed box stays claimed"
        );
        let loaded = load(dir.path()).unwrap().unwrap();
        assert!(verify(&loaded, "correct horse battery"));
        assert!(!verify(&loaded, "correct horse battery!"));
        assert_ne!(other.stamp(), loaded.stamp());
        assert!(reset(dir.path()).unwrap());
        assert!(load(dir.path()).unwrap().is_none());
    }

    #[test]
    fn the_meter_level_follows_the_verdict() {
        let level = |p: &str| {
            let s = strength(p, &["kitchen".to_owned()]);
            (s.score, s.ok)
        };
        assert_eq!(level("shor"), (1, false));
        assert_eq!(level("violet trac"), (2, false));
        assert_eq!(level("password1234"), (1, false));
        assert_eq!(level(&"x".repeat(MAX_PASSPHRASE_BYTES + 1)), (0, false));
        assert_eq!(level("violet tract"), (MIN_STRENGTH_SCORE, true));
        assert_eq!(level("violet tractor harbour 42"), (4, true));
        // The box's own words count for nothing, towards the level too.
        assert_eq!(level("kitchen violet tractor"), (MIN_STRENGTH_SCORE, true));
        let own = strength("kitchen and sink", &["kitchen".to_owned()]);
        assert_eq!((own.score, own.ok), (1, false));
        assert!(own.words.contains("naming this box"), "{}", own.words);
    }
}
