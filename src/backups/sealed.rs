//! The scheduled backups' file: the store backup (as the admin page's download makes it) with
//! the saved settings and the owner file, encrypted in the age v1 format (`age_v1.rs`).
//!
//! The schedule runs unattended, so it cannot ask for the backup passphrase. It encrypts to an
//! age X25519 public key (the recipient), kept in the data dir; the matching secret key (the
//! identity) is kept only encrypted with the passphrase (age's scrypt), in the data dir and in
//! every backup file. So a backup can be made without the passphrase, and opened only with it,
//! on this box or on a new one (the file carries all it needs). docs/security.md, "Scheduled
//! backups", says what that protects and what it does not.
//!
//! The file: [`MAGIC`], the wrapped identity (4-byte big-endian length, then age scrypt
//! ciphertext), then one age stream (to the recipient) holding the settings and the owner file
//! (each: one byte present or not, 4-byte length, the bytes) and then the store backup itself.

use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::age_v1::{self, AgeError};

/// The first bytes of a sealed backup.
pub const MAGIC: &[u8] = b"IRIS-SEALED-BACKUP-1\n";
/// The key file in the data dir: the recipient and the wrapped identity.
pub const KEY_FILE: &str = "backup-key.json";
/// Longest wrapped identity read (it is about 200 bytes).
const MAX_WRAPPED_BYTES: u32 = 4096;
/// Longest settings or owner file carried (the settings file's own bound).
const MAX_EXTRA_BYTES: u32 = crate::settings::MAX_FILE_BYTES as u32;
/// Largest key file read.
const MAX_KEY_FILE_BYTES: u64 = 8192;

/// Why a sealed backup could not be written or opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("that backup passphrase is not right, so nothing was changed")]
    WrongPassphrase,
    #[error("no backup passphrase is set: choose one on the Backup page first")]
    NoKey,
    #[error("{0} is not an encrypted scheduled backup")]
    NotSealed(String),
    #[error("{what} is damaged or cut short ({why}); nothing was changed")]
    Damaged { what: String, why: String },
    #[error(
        "{what} was sealed with a passphrase work factor of 2^{log_n}, which needs {} MiB of \
         memory, more than this box allows (2^{OPEN_MAX_LOG_N}); open it on a computer with \
         age, or restore a backup this box made; nothing was changed",
        (1u64 << .log_n) / 1024
    )]
    TooCostly { what: String, log_n: u8 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot encrypt: {0}")]
    Encrypt(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SealError {
    let what = what.into();
    move |source| SealError::Io { what, source }
}

/// The data dir's backup key: what the schedule encrypts to, and the identity it cannot open.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Key {
    /// `age1…`: the public key.
    pub recipient: String,
    /// The identity, encrypted with the backup passphrase (age scrypt), base64.
    pub wrapped: String,
    pub set_ms: i64,
}

/// What a backup carries besides the store: the files' bytes, each if it existed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Extras {
    pub settings: Option<Vec<u8>>,
    pub owner: Option<Vec<u8>>,
}

/// Where the key file is for a data dir.
pub fn key_path(data_dir: &Path) -> PathBuf {
    data_dir.join(KEY_FILE)
}

/// scrypt's work factor for the backup passphrase: N = 2^15, 32 MiB of memory and about a
/// second on a Pi Zero 2 W. Fixed, not age's own tuning to a second of this machine's time, which
/// on a fast x86 box picks 2^19 (512 MiB), more than a 512 MB Pi has beside Hermes.
const SEAL_LOG_N: u8 = 15;

/// The largest work factor a sealed backup may name and still be opened here: 2^17, 128 MiB.
/// Backups this box seals use [`SEAL_LOG_N`]; a file naming more (made elsewhere, or an upload
/// made to cost) is refused before scrypt allocates anything (the stanza is checked first).
const OPEN_MAX_LOG_N: u8 = 17;

/// Makes a new key for `passphrase` and saves it (mode 0600). Slow (scrypt: about a second by
/// design); call it off the event loop. Backups made before keep their own key, so they still
/// open with the passphrase they were made under.
pub fn set_passphrase(data_dir: &Path, passphrase: &str) -> Result<Key, SealError> {
    use base64::Engine;
    let encrypt = |e: AgeError| SealError::Encrypt(e.to_string());
    let identity = age_v1::Identity::generate().map_err(encrypt)?;
    let wrapped = age_v1::encrypt_with_passphrase(
        identity.to_secret_string().as_bytes(),
        passphrase,
        SEAL_LOG_N,
    )
    .map_err(encrypt)?;
    let key = Key {
        recipient: identity.recipient().to_string(),
        wrapped: base64::engine::general_purpose::STANDARD.encode(wrapped),
        set_ms: crate::ids::now_ms(),
    };
    let json = serde_json::to_vec_pretty(&key).map_err(|e| SealError::Encrypt(e.to_string()))?;
    crate::atomic_file::write(&key_path(data_dir), &json, 0o600)
        .map_err(io(format!("cannot write {}", key_path(data_dir).display())))?;
    Ok(key)
}

/// The saved key; `None` when no backup passphrase was set.
pub fn key(data_dir: &Path) -> Result<Option<Key>, SealError> {
    let path = key_path(data_dir);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("cannot read {}", path.display()))(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io(format!("cannot read {}", path.display())))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| SealError::Damaged {
            what: path.display().to_string(),
            why: e.to_string(),
        })
}

/// Writes a sealed backup to `out`: the header and the extras at once, then whatever is
/// written (the store backup), encrypted as it comes. [`Sealer::finish`] ends the age stream.
pub struct Sealer<W: Write> {
    stream: age_v1::StreamWriter<W>,
}

impl<W: Write> Sealer<W> {
    pub fn new(mut out: W, key: &Key, extras: &Extras) -> Result<Sealer<W>, SealError> {
        use base64::Engine;
        let bad = |why: String| SealError::Damaged {
            what: KEY_FILE.into(),
            why,
        };
        let wrapped = base64::engine::general_purpose::STANDARD
            .decode(&key.wrapped)
            .map_err(|e| bad(e.to_string()))?;
        let recipient = age_v1::Recipient::parse(&key.recipient).map_err(|e| bad(e.to_string()))?;
        let write = io("writing the backup");
        out.write_all(MAGIC).map_err(io("writing the backup"))?;
        out.write_all(&(wrapped.len() as u32).to_be_bytes())
            .and_then(|_| out.write_all(&wrapped))
            .map_err(write)?;
        let mut stream = age_v1::encrypt_to(out, &recipient).map_err(|e| match e {
            AgeError::Io(source) => io("writing the backup")(source),
            e => SealError::Encrypt(e.to_string()),
        })?;
        for extra in [&extras.settings, &extras.owner] {
            write_extra(&mut stream, extra.as_deref()).map_err(io("writing the backup"))?;
        }
        Ok(Sealer { stream })
    }

    /// Ends the encryption (its last chunk and tag); returns the writer, not synced.
    pub fn finish(self) -> Result<W, SealError> {
        self.stream.finish().map_err(io("writing the backup"))
    }
}

impl<W: Write> Write for Sealer<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

fn write_extra(w: &mut impl Write, bytes: Option<&[u8]>) -> std::io::Result<()> {
    match bytes {
        None => w.write_all(&[0]),
        Some(b) => {
            w.write_all(&[1])?;
            w.write_all(&(b.len() as u32).to_be_bytes())?;
            w.write_all(b)
        }
    }
}

/// Whether `path` starts as a sealed backup.
pub fn is_sealed(path: &Path) -> bool {
    let mut head = vec![0u8; MAGIC.len()];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head == MAGIC
}

/// Opens a sealed backup with the passphrase: the extras, and the store backup written to
/// `store_out` (synced). A wrong passphrase is found before `store_out` is created. Slow
/// (scrypt), and it reads the whole file: call it off the event loop.
pub fn open(path: &Path, passphrase: &str, store_out: &Path) -> Result<Extras, SealError> {
    let name = path.display().to_string();
    let damaged = |why: String| SealError::Damaged {
        what: name.clone(),
        why,
    };
    let mut input =
        BufReader::new(std::fs::File::open(path).map_err(io(format!("cannot open {name}")))?);
    let mut magic = vec![0u8; MAGIC.len()];
    if input.read_exact(&mut magic).is_err() || magic != MAGIC {
        return Err(SealError::NotSealed(name));
    }
    let len = read_u32(&mut input).map_err(|e| damaged(e.to_string()))?;
    if len > MAX_WRAPPED_BYTES {
        return Err(damaged(format!("a key of {len} bytes")));
    }
    let mut wrapped = vec![0u8; len as usize];
    input
        .read_exact(&mut wrapped)
        .map_err(|e| damaged(e.to_string()))?;
    let identity = match age_v1::decrypt_with_passphrase(&wrapped, passphrase, OPEN_MAX_LOG_N) {
        Ok(i) => i,
        Err(AgeError::NoMatch) => return Err(SealError::WrongPassphrase),
        Err(AgeError::ExcessiveWork { log_n }) => {
            return Err(SealError::TooCostly { what: name, log_n })
        }
        Err(e) => return Err(damaged(e.to_string())),
    };
    let identity = std::str::from_utf8(&identity)
        .ok()
        .and_then(|s| age_v1::Identity::parse(s).ok())
        .ok_or_else(|| damaged("its key is not an age identity".into()))?;
    let mut plain = age_v1::decrypt_with(input, &identity).map_err(|e| damaged(e.to_string()))?;
    let mut extras = Extras::default();
    for slot in [&mut extras.settings, &mut extras.owner] {
        *slot = read_extra(&mut plain).map_err(|e| damaged(e.to_string()))?;
    }
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(store_out)
        .map_err(io(format!("cannot create {}", store_out.display())))?;
    let copied = (|| {
        let mut w = std::io::BufWriter::with_capacity(super::CHUNK, out);
        std::io::copy(&mut plain, &mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()
    })();
    if let Err(e) = copied {
        let _ = std::fs::remove_file(store_out);
        // The age stream's tags: a changed or cut byte fails here, not later.
        return Err(damaged(e.to_string()));
    }
    Ok(extras)
}

/// Refuses extras that are not what their names say (a settings file that does not parse, an
/// owner file without a hash), before anything is changed with them.
pub fn check_extras(extras: &Extras, name: &str) -> Result<(), SealError> {
    let damaged = |why: String| SealError::Damaged {
        what: name.to_owned(),
        why,
    };
    if let Some(s) = &extras.settings {
        let text = std::str::from_utf8(s).map_err(|e| damaged(e.to_string()))?;
        toml::from_str::<crate::settings::Settings>(text)
            .map_err(|e| damaged(format!("its settings: {e}")))?;
    }
    if let Some(o) = &extras.owner {
        let v: serde_json::Value =
            serde_json::from_slice(o).map_err(|e| damaged(format!("its owner file: {e}")))?;
        if !v["hash"].as_str().is_some_and(|h| h.starts_with("$argon2")) {
            return Err(damaged("its owner file has no passphrase hash".into()));
        }
    }
    Ok(())
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_extra(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut present = [0u8; 1];
    r.read_exact(&mut present)?;
    if present[0] == 0 {
        return Ok(None);
    }
    let len = read_u32(r)?;
    if len > MAX_EXTRA_BYTES {
        return Err(std::io::Error::other(format!("a file of {len} bytes")));
    }
    let mut b = vec![0u8; len as usize];
    r.read_exact(&mut b)?;
    Ok(Some(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use age::secrecy::SecretString;

    #[test]
    fn sealed_round_trip_and_a_wrong_passphrase_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let key = set_passphrase(dir.path(), "correct horse battery").unwrap();
        let extras = Extras {
            settings: Some(b"[agent]\n".to_vec()),
            owner: None,
        };
        let mut sealer = Sealer::new(Vec::new(), &key, &extras).unwrap();
        sealer.write_all(b"the store part, secret words").unwrap();
        let bytes = sealer.finish().unwrap();
        assert!(!bytes.windows(12).any(|w| w == b"secret words"));
        let file = dir.path().join("b.age");
        std::fs::write(&file, &bytes).unwrap();
        assert!(is_sealed(&file));
        let out = dir.path().join("store.iris");
        let wrong = open(&file, "not the passphrase", &out);
        assert!(
            matches!(wrong, Err(SealError::WrongPassphrase)),
            "{wrong:?}"
        );
        assert!(!out.exists());
        let got = open(&file, "correct horse battery", &out).unwrap();
        assert_eq!(got, extras);
        assert_eq!(
            std::fs::read(&out).unwrap(),
            b"the store part, secret words"
        );
    }

    /// A file whose passphrase stanza names a work factor over [`OPEN_MAX_LOG_N`] is refused by
    /// its header, before scrypt would allocate 2^log_n KiB.
    #[test]
    fn a_passphrase_work_factor_over_the_cap_is_refused_before_scrypt_runs() {
        use base64::Engine;
        let dir = tempfile::tempdir().unwrap();
        let mut cheap = age::scrypt::Recipient::new(SecretString::from("p".to_owned()));
        cheap.set_work_factor(2);
        let wrapped = age::encrypt(&cheap, b"AGE-SECRET-KEY-1").unwrap();
        // The header is text; the stanza's last argument is the work factor.
        let at = wrapped
            .windows(3)
            .position(|w| w == b" 2\n")
            .expect("the stanza names its work factor");
        let costly = [&wrapped[..at], b" 18\n".as_slice(), &wrapped[at + 3..]].concat();
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(&(costly.len() as u32).to_be_bytes());
        file.extend_from_slice(&costly);
        let path = dir.path().join("far.age");
        std::fs::write(&path, &file).unwrap();
        let out = dir.path().join("store.iris");
        let got = open(&path, "p", &out);
        assert!(
            matches!(got, Err(SealError::TooCostly { log_n: 18, .. })),
            "{got:?}"
        );
        assert!(!out.exists());
        // The key this box seals with stays under the cap.
        let key = set_passphrase(dir.path(), "correct horse battery").unwrap();
        let wrapped = base64::engine::general_purpose::STANDARD
            .decode(&key.wrapped)
            .unwrap();
        assert!(String::from_utf8_lossy(&wrapped).contains(&format!(" {SEAL_LOG_N}\n")));
    }
}
