//! The age v1 file format (https://age-encryption.org/v1, C2SP's `age.md`), as far as sealed
//! backups use it: a passphrase (`scrypt`) recipient for the wrapped key, an `X25519`
//! recipient for the backup itself, and the STREAM payload. Written with primitives the gateway
//! already carries (ring's ChaCha20-Poly1305, HMAC-SHA-256 and HKDF-SHA-256, the `scrypt`
//! crate, x25519-dalek for the one thing ring cannot do: a Diffie-Hellman with a stored private
//! key) instead of the `age` crate, whose localisation and plugin support was most of the
//! binary's crates (README, "Design notes"). Files are byte-for-byte the format `age` and
//! `rage` read and write; tests/sealed_age.rs checks both directions against the `age` crate.
//!
//! A file: the header (`age-encryption.org/v1`, one stanza per recipient, each wrapping the
//! 16-byte file key, then `---` and an HMAC of all that under a key derived from the file
//! key), a 16-byte nonce, then the payload in 64 KiB chunks, each sealed with a key derived
//! from the file key and the nonce, the chunk's nonce its counter and a last-chunk flag, so a
//! chunk changed, moved, dropped or cut off fails its tag.

use std::io::{self, BufRead, Read, Write};

use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine;
use bech32::{FromBase32, ToBase32, Variant};
use ring::{aead, hkdf, hmac};
use zeroize::Zeroizing;

const VERSION_LINE: &[u8] = b"age-encryption.org/v1";
const STANZA_PREFIX: &[u8] = b"-> ";
const MAC_PREFIX: &[u8] = b"---";
/// Stanza bodies are base64 wrapped at this many columns; a shorter (maybe empty) line ends one.
const BODY_COLUMNS: usize = 64;
const FILE_KEY_BYTES: usize = 16;
/// A wrapped file key: the key and its ChaCha20-Poly1305 tag.
const WRAPPED_KEY_BYTES: usize = FILE_KEY_BYTES + TAG_BYTES;
const TAG_BYTES: usize = 16;
const MAC_BYTES: usize = 32;
const PAYLOAD_NONCE_BYTES: usize = 16;
/// The payload's plaintext chunk.
pub const CHUNK_BYTES: usize = 64 * 1024;

const SCRYPT_TAG: &str = "scrypt";
const SCRYPT_LABEL: &[u8] = b"age-encryption.org/v1/scrypt";
const SCRYPT_SALT_BYTES: usize = 16;
const X25519_TAG: &str = "X25519";
const X25519_LABEL: &[u8] = b"age-encryption.org/v1/X25519";
const SECRET_KEY_HRP: &str = "age-secret-key-";
const PUBLIC_KEY_HRP: &str = "age";

/// Longest header read. One X25519 or scrypt stanza makes a header of about 200 bytes; the cap
/// keeps a damaged or made-up file from being read line by line without end (docs/limits.md).
pub const MAX_HEADER_BYTES: usize = 4096;

/// Why an age file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum AgeError {
    /// The header is not a valid age v1 header, or its MAC does not match.
    #[error("its age header {0}")]
    Header(&'static str),
    /// No stanza opened with the passphrase or key given.
    #[error("no recipient in it matches")]
    NoMatch,
    /// The passphrase stanza's work factor is over the cap given.
    #[error("its passphrase work factor 2^{log_n} is over the cap")]
    ExcessiveWork { log_n: u8 },
    /// A key string that is not an age key of the kind wanted.
    #[error("not an age {0}")]
    BadKey(&'static str),
    #[error("the system's random source failed: {0}")]
    Random(getrandom::Error),
    #[error("{0}")]
    Io(#[from] io::Error),
}

type FileKey = Zeroizing<[u8; FILE_KEY_BYTES]>;

fn random<const N: usize>() -> Result<[u8; N], AgeError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(AgeError::Random)?;
    Ok(bytes)
}

/// HKDF-SHA-256 to 32 bytes: every key age derives is one.
fn hkdf32(salt: &[u8], info: &[u8], ikm: &[u8]) -> Zeroizing<[u8; 32]> {
    struct Len32;
    impl hkdf::KeyType for Len32 {
        fn len(&self) -> usize {
            32
        }
    }
    let mut out = Zeroizing::new([0u8; 32]);
    hkdf::Salt::new(hkdf::HKDF_SHA256, salt)
        .extract(ikm)
        .expand(&[info], Len32)
        .and_then(|okm| okm.fill(&mut *out))
        .expect("32 bytes is within HKDF-SHA-256's output limit");
    out
}

fn aead_key(key: &[u8; 32]) -> aead::LessSafeKey {
    aead::LessSafeKey::new(
        aead::UnboundKey::new(&aead::CHACHA20_POLY1305, key).expect("a 32-byte key"),
    )
}

/// Stanza bodies are sealed under a key used once, so the all-zero nonce is the spec's.
fn wrap_file_key(key: &[u8; 32], file_key: &FileKey) -> Vec<u8> {
    let mut body = file_key.to_vec();
    aead_key(key)
        .seal_in_place_append_tag(
            aead::Nonce::assume_unique_for_key([0; 12]),
            aead::Aad::empty(),
            &mut body,
        )
        .expect("16 bytes is within ChaCha20-Poly1305's limit");
    body
}

fn unwrap_file_key(key: &[u8; 32], body: &[u8]) -> Option<FileKey> {
    let mut buf = Zeroizing::new(body.to_vec());
    let plain = aead_key(key)
        .open_in_place(
            aead::Nonce::assume_unique_for_key([0; 12]),
            aead::Aad::empty(),
            &mut buf,
        )
        .ok()?;
    let mut file_key = Zeroizing::new([0u8; FILE_KEY_BYTES]);
    file_key.copy_from_slice(plain);
    Some(file_key)
}

fn scrypt_key(passphrase: &str, salt: &[u8; SCRYPT_SALT_BYTES], log_n: u8) -> Zeroizing<[u8; 32]> {
    let mut full_salt = SCRYPT_LABEL.to_vec();
    full_salt.extend_from_slice(salt);
    let params = scrypt::Params::new(log_n, 8, 1, 32).expect("log_n is checked by the caller");
    let mut key = Zeroizing::new([0u8; 32]);
    scrypt::scrypt(passphrase.as_bytes(), &full_salt, &params, &mut *key)
        .expect("32 bytes is a valid scrypt output");
    key
}

/// An X25519 identity: the private key that opens files sealed to its [`Recipient`].
pub struct Identity(x25519_dalek::StaticSecret);

/// An X25519 recipient (`age1…`): the public key files are sealed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient([u8; 32]);

impl Identity {
    pub fn generate() -> Result<Identity, AgeError> {
        Ok(Identity(x25519_dalek::StaticSecret::from(random::<32>()?)))
    }

    /// `AGE-SECRET-KEY-1…`, as age writes it.
    pub fn to_secret_string(&self) -> Zeroizing<String> {
        let bytes = Zeroizing::new(self.0.to_bytes());
        let encoded = Zeroizing::new(
            bech32::encode(SECRET_KEY_HRP, bytes.to_base32(), Variant::Bech32)
                .expect("the prefix is a valid bech32 prefix"),
        );
        Zeroizing::new(encoded.to_uppercase())
    }

    pub fn parse(text: &str) -> Result<Identity, AgeError> {
        let bytes = Zeroizing::new(bech32_bytes(text, SECRET_KEY_HRP, "identity")?);
        let key: [u8; 32] = bytes[..]
            .try_into()
            .map_err(|_| AgeError::BadKey("identity"))?;
        Ok(Identity(x25519_dalek::StaticSecret::from(key)))
    }

    pub fn recipient(&self) -> Recipient {
        Recipient(x25519_dalek::PublicKey::from(&self.0).to_bytes())
    }

    /// The file key from an X25519 stanza, if it was sealed to this identity.
    fn unwrap(&self, stanza: &Stanza) -> Result<Option<FileKey>, AgeError> {
        let [_, share] = &stanza.args[..] else {
            return Err(AgeError::Header(
                "has an X25519 stanza without one argument",
            ));
        };
        let share: [u8; 32] =
            decode_exact(share).ok_or(AgeError::Header("has an X25519 stanza with a bad share"))?;
        if stanza.body.len() != WRAPPED_KEY_BYTES {
            return Err(AgeError::Header("has an X25519 stanza of the wrong size"));
        }
        let shared = self.0.diffie_hellman(&x25519_dalek::PublicKey::from(share));
        if !shared.was_contributory() {
            return Err(AgeError::Header("has a low-order X25519 share"));
        }
        let key = x25519_wrap_key(&share, &self.recipient().0, shared.as_bytes());
        Ok(unwrap_file_key(&key, &stanza.body))
    }
}

fn x25519_wrap_key(
    share: &[u8; 32],
    recipient: &[u8; 32],
    shared: &[u8; 32],
) -> Zeroizing<[u8; 32]> {
    let salt = [&share[..], &recipient[..]].concat();
    hkdf32(&salt, X25519_LABEL, shared)
}

impl Recipient {
    pub fn parse(text: &str) -> Result<Recipient, AgeError> {
        let bytes = bech32_bytes(text, PUBLIC_KEY_HRP, "recipient")?;
        bytes
            .try_into()
            .map(Recipient)
            .map_err(|_| AgeError::BadKey("recipient"))
    }

    fn wrap(&self, file_key: &FileKey) -> Result<Stanza, AgeError> {
        let ephemeral = x25519_dalek::StaticSecret::from(random::<32>()?);
        let share = x25519_dalek::PublicKey::from(&ephemeral).to_bytes();
        let shared = ephemeral.diffie_hellman(&x25519_dalek::PublicKey::from(self.0));
        if !shared.was_contributory() {
            return Err(AgeError::BadKey("recipient (a low-order point)"));
        }
        let key = x25519_wrap_key(&share, &self.0, shared.as_bytes());
        Ok(Stanza {
            args: vec![X25519_TAG.into(), STANDARD_NO_PAD.encode(share)],
            body: wrap_file_key(&key, file_key),
        })
    }
}

impl std::fmt::Display for Recipient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = bech32::encode(PUBLIC_KEY_HRP, self.0.to_base32(), Variant::Bech32)
            .expect("the prefix is a valid bech32 prefix");
        f.write_str(&text)
    }
}

fn bech32_bytes(text: &str, hrp: &str, kind: &'static str) -> Result<Vec<u8>, AgeError> {
    match bech32::decode(text) {
        Ok((got, data, Variant::Bech32)) if got == hrp => {
            Vec::<u8>::from_base32(&data).map_err(|_| AgeError::BadKey(kind))
        }
        _ => Err(AgeError::BadKey(kind)),
    }
}

/// Canonical unpadded base64 of exactly `N` bytes.
fn decode_exact<const N: usize>(text: &str) -> Option<[u8; N]> {
    STANDARD_NO_PAD.decode(text).ok()?.try_into().ok()
}

/// One recipient stanza: its type and arguments (`args[0]` is the type), and its body.
struct Stanza {
    args: Vec<String>,
    body: Vec<u8>,
}

impl Stanza {
    fn kind(&self) -> &str {
        &self.args[0]
    }
}

/// A header read from a file, its MAC not yet checked (that needs the file key).
pub struct Header {
    stanzas: Vec<Stanza>,
    /// The header's bytes up to and including `---`: what the MAC covers.
    covered: Vec<u8>,
    mac: [u8; MAC_BYTES],
}

fn header_mac_key(file_key: &FileKey) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, &*hkdf32(&[], b"header", &file_key[..]))
}

/// Writes the header for `stanzas`, its MAC made with `file_key`.
fn write_header(out: &mut impl Write, stanzas: &[Stanza], file_key: &FileKey) -> io::Result<()> {
    let mut text = VERSION_LINE.to_vec();
    text.push(b'\n');
    for stanza in stanzas {
        text.extend_from_slice(STANZA_PREFIX);
        text.extend_from_slice(stanza.args.join(" ").as_bytes());
        text.push(b'\n');
        let body = STANDARD_NO_PAD.encode(&stanza.body);
        for line in body.as_bytes().chunks(BODY_COLUMNS) {
            text.extend_from_slice(line);
            text.push(b'\n');
        }
        // A body ends at its first short line: an empty one when the last was full (or none).
        if body.len() % BODY_COLUMNS == 0 {
            text.push(b'\n');
        }
    }
    text.extend_from_slice(MAC_PREFIX);
    let mac = hmac::sign(&header_mac_key(file_key), &text);
    text.push(b' ');
    text.extend_from_slice(STANDARD_NO_PAD.encode(mac.as_ref()).as_bytes());
    text.push(b'\n');
    out.write_all(&text)
}

/// Reads one header line (without its `\n`), adding its bytes to `raw`.
fn read_line<'a>(input: &mut impl BufRead, raw: &'a mut Vec<u8>) -> Result<&'a [u8], AgeError> {
    let start = raw.len();
    let room = MAX_HEADER_BYTES.saturating_sub(start) as u64;
    input.take(room).read_until(b'\n', raw)?;
    if raw.last() != Some(&b'\n') || raw.len() == start {
        return Err(AgeError::Header(if raw.len() >= MAX_HEADER_BYTES {
            "is too long"
        } else {
            "is cut short"
        }));
    }
    Ok(&raw[start..raw.len() - 1])
}

/// An age "arbitrary string": one or more printable ASCII characters, no space.
fn is_arbitrary_string(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (33..=126).contains(&b))
}

impl Header {
    /// Reads and checks the header's form (not its MAC): the version line, stanzas whose
    /// arguments are printable and whose bodies are canonical base64 wrapped at 64 columns,
    /// and the MAC line.
    pub fn read(input: &mut impl BufRead) -> Result<Header, AgeError> {
        let mut raw = Vec::new();
        if read_line(input, &mut raw)? != VERSION_LINE {
            return Err(AgeError::Header("is not age v1"));
        }
        let mut stanzas = Vec::new();
        loop {
            let line = read_line(input, &mut raw)?.to_vec();
            if let Some(rest) = line.strip_prefix(STANZA_PREFIX) {
                let rest = std::str::from_utf8(rest)
                    .map_err(|_| AgeError::Header("has a stanza that is not text"))?;
                let args: Vec<String> = rest.split(' ').map(str::to_owned).collect();
                if !args.iter().all(|a| is_arbitrary_string(a)) {
                    return Err(AgeError::Header("has a malformed stanza line"));
                }
                let mut encoded = Vec::new();
                loop {
                    let body_line = read_line(input, &mut raw)?;
                    if body_line.len() > BODY_COLUMNS {
                        return Err(AgeError::Header("has a stanza line over 64 columns"));
                    }
                    encoded.extend_from_slice(body_line);
                    if body_line.len() < BODY_COLUMNS {
                        break;
                    }
                }
                let body = STANDARD_NO_PAD
                    .decode(&encoded)
                    .map_err(|_| AgeError::Header("has a stanza body that is not base64"))?;
                stanzas.push(Stanza { args, body });
            } else if let Some(rest) = line.strip_prefix(MAC_PREFIX) {
                let mac = rest
                    .strip_prefix(b" ")
                    .and_then(|m| std::str::from_utf8(m).ok())
                    .and_then(decode_exact::<MAC_BYTES>)
                    .ok_or(AgeError::Header("has a malformed MAC line"))?;
                if stanzas.is_empty() {
                    return Err(AgeError::Header("has no recipients"));
                }
                let covered_len = raw.len() - (line.len() + 1) + MAC_PREFIX.len();
                raw.truncate(covered_len);
                return Ok(Header {
                    stanzas,
                    covered: raw,
                    mac,
                });
            } else {
                return Err(AgeError::Header(
                    "has a line that is neither a stanza nor its MAC",
                ));
            }
        }
    }

    fn check_mac(&self, file_key: &FileKey) -> Result<(), AgeError> {
        hmac::verify(&header_mac_key(file_key), &self.covered, &self.mac)
            .map_err(|_| AgeError::Header("does not match its MAC"))
    }

    /// The file key from the header's passphrase stanza. Per the spec a passphrase stanza must
    /// be the header's only one; its work factor is checked against `max_log_n` before scrypt
    /// runs (scrypt takes 2^log_n KiB of memory).
    pub fn unwrap_with_passphrase(
        &self,
        passphrase: &str,
        max_log_n: u8,
    ) -> Result<FileKey, AgeError> {
        let [stanza] = &self.stanzas[..] else {
            return Err(if self.stanzas.iter().any(|s| s.kind() == SCRYPT_TAG) {
                AgeError::Header("has a passphrase stanza beside others")
            } else {
                AgeError::NoMatch
            });
        };
        if stanza.kind() != SCRYPT_TAG {
            return Err(AgeError::NoMatch);
        }
        let [_, salt, log_n] = &stanza.args[..] else {
            return Err(AgeError::Header(
                "has a passphrase stanza without two arguments",
            ));
        };
        let salt: [u8; SCRYPT_SALT_BYTES] = decode_exact(salt)
            .ok_or(AgeError::Header("has a passphrase stanza with a bad salt"))?;
        // Decimal digits, no leading zero (so not 0 either), as the spec writes it.
        let log_n: u8 = Some(log_n.as_str())
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0'))
            .and_then(|n| n.parse().ok())
            .ok_or(AgeError::Header(
                "has a passphrase stanza with a bad work factor",
            ))?;
        if stanza.body.len() != WRAPPED_KEY_BYTES {
            return Err(AgeError::Header(
                "has a passphrase stanza of the wrong size",
            ));
        }
        if log_n > max_log_n {
            return Err(AgeError::ExcessiveWork { log_n });
        }
        let key = scrypt_key(passphrase, &salt, log_n);
        let file_key = unwrap_file_key(&key, &stanza.body).ok_or(AgeError::NoMatch)?;
        self.check_mac(&file_key)?;
        Ok(file_key)
    }

    /// The file key from the X25519 stanza sealed to `identity`. Other stanza types are
    /// skipped, as the spec says, except a passphrase one (never beside others).
    pub fn unwrap_with_identity(&self, identity: &Identity) -> Result<FileKey, AgeError> {
        if self.stanzas.iter().any(|s| s.kind() == SCRYPT_TAG) {
            return Err(AgeError::NoMatch);
        }
        for stanza in self.stanzas.iter().filter(|s| s.kind() == X25519_TAG) {
            if let Some(file_key) = identity.unwrap(stanza)? {
                self.check_mac(&file_key)?;
                return Ok(file_key);
            }
        }
        Err(AgeError::NoMatch)
    }
}

/// Encrypts `plain` with a passphrase (an scrypt stanza of work factor 2^`log_n`), in memory:
/// for small secrets such as a key.
pub fn encrypt_with_passphrase(
    plain: &[u8],
    passphrase: &str,
    log_n: u8,
) -> Result<Vec<u8>, AgeError> {
    let file_key = Zeroizing::new(random::<FILE_KEY_BYTES>()?);
    let salt = random::<SCRYPT_SALT_BYTES>()?;
    let key = scrypt_key(passphrase, &salt, log_n);
    let stanza = Stanza {
        args: vec![
            SCRYPT_TAG.into(),
            STANDARD_NO_PAD.encode(salt),
            log_n.to_string(),
        ],
        body: wrap_file_key(&key, &file_key),
    };
    let mut out = Vec::new();
    let mut writer = StreamWriter::start(&mut out, &[stanza], &file_key)?;
    writer.write_all(plain)?;
    writer.finish()?;
    Ok(out)
}

/// Decrypts a small file made with a passphrase, in memory.
pub fn decrypt_with_passphrase(
    mut file: &[u8],
    passphrase: &str,
    max_log_n: u8,
) -> Result<Zeroizing<Vec<u8>>, AgeError> {
    let header = Header::read(&mut file)?;
    let file_key = header.unwrap_with_passphrase(passphrase, max_log_n)?;
    let mut plain = Zeroizing::new(Vec::new());
    StreamReader::start(file, &file_key)?.read_to_end(&mut plain)?;
    Ok(plain)
}

/// Starts a file sealed to `recipient` on `out`: the header and nonce are written now, the
/// payload as it is written; [`StreamWriter::finish`] seals the last chunk.
pub fn encrypt_to<W: Write>(out: W, recipient: &Recipient) -> Result<StreamWriter<W>, AgeError> {
    let file_key = Zeroizing::new(random::<FILE_KEY_BYTES>()?);
    let stanza = recipient.wrap(&file_key)?;
    StreamWriter::start(out, &[stanza], &file_key)
}

/// Opens a file sealed to `identity`: its header is read and checked now, the payload is
/// decrypted (and each chunk's tag checked) as it is read.
pub fn decrypt_with<R: BufRead>(
    mut input: R,
    identity: &Identity,
) -> Result<StreamReader<R>, AgeError> {
    let header = Header::read(&mut input)?;
    let file_key = header.unwrap_with_identity(identity)?;
    StreamReader::start(input, &file_key)
}

fn payload_key(file_key: &FileKey, nonce: &[u8; PAYLOAD_NONCE_BYTES]) -> aead::LessSafeKey {
    aead_key(&hkdf32(nonce, b"payload", &file_key[..]))
}

/// A chunk's nonce: its 11-byte big-endian counter, then 1 for the last chunk, else 0.
fn chunk_nonce(counter: u64, last: bool) -> aead::Nonce {
    let mut nonce = [0u8; 12];
    nonce[3..11].copy_from_slice(&counter.to_be_bytes());
    nonce[11] = u8::from(last);
    aead::Nonce::assume_unique_for_key(nonce)
}

/// The payload's writer. A full chunk is sealed only once more bytes follow it, because the
/// last chunk (which may be full) is sealed differently.
pub struct StreamWriter<W: Write> {
    out: W,
    key: aead::LessSafeKey,
    counter: u64,
    chunk: Zeroizing<Vec<u8>>,
}

impl<W: Write> StreamWriter<W> {
    fn start(
        mut out: W,
        stanzas: &[Stanza],
        file_key: &FileKey,
    ) -> Result<StreamWriter<W>, AgeError> {
        let nonce = random::<PAYLOAD_NONCE_BYTES>()?;
        write_header(&mut out, stanzas, file_key)?;
        out.write_all(&nonce)?;
        Ok(StreamWriter {
            out,
            key: payload_key(file_key, &nonce),
            counter: 0,
            chunk: Zeroizing::new(Vec::with_capacity(CHUNK_BYTES + TAG_BYTES)),
        })
    }

    fn seal_chunk(&mut self, last: bool) -> io::Result<()> {
        let nonce = chunk_nonce(self.counter, last);
        self.key
            .seal_in_place_append_tag(nonce, aead::Aad::empty(), &mut *self.chunk)
            .map_err(|_| io::Error::other("cannot seal a chunk"))?;
        self.out.write_all(&self.chunk)?;
        self.chunk.clear();
        self.counter += 1;
        Ok(())
    }

    /// Seals the last chunk; returns the writer, not flushed.
    pub fn finish(mut self) -> io::Result<W> {
        self.seal_chunk(true)?;
        Ok(self.out)
    }
}

impl<W: Write> Write for StreamWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut rest = buf;
        while !rest.is_empty() {
            if self.chunk.len() == CHUNK_BYTES {
                self.seal_chunk(false)?;
            }
            let take = rest.len().min(CHUNK_BYTES - self.chunk.len());
            self.chunk.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// The payload's reader: one chunk in memory at a time. A changed, cut or reordered chunk is
/// an `InvalidData` error from `read`.
pub struct StreamReader<R: Read> {
    input: R,
    key: aead::LessSafeKey,
    counter: u64,
    /// The current chunk: sealed as read, then its plaintext (`plain_len` bytes) in place.
    buf: Zeroizing<Vec<u8>>,
    plain_len: usize,
    at: usize,
    /// The byte read past a full chunk to learn it was not the last.
    peeked: Option<u8>,
    ended: bool,
}

fn damaged(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("its age payload {why}"))
}

impl<R: Read> StreamReader<R> {
    fn start(mut input: R, file_key: &FileKey) -> Result<StreamReader<R>, AgeError> {
        let mut nonce = [0u8; PAYLOAD_NONCE_BYTES];
        input
            .read_exact(&mut nonce)
            .map_err(|_| AgeError::Header("is not followed by a payload"))?;
        Ok(StreamReader {
            input,
            key: payload_key(file_key, &nonce),
            counter: 0,
            buf: Zeroizing::new(vec![0; CHUNK_BYTES + TAG_BYTES]),
            plain_len: 0,
            at: 0,
            peeked: None,
            ended: false,
        })
    }

    fn read_byte(&mut self) -> io::Result<Option<u8>> {
        let mut byte = [0u8; 1];
        loop {
            match self.input.read(&mut byte) {
                Ok(0) => return Ok(None),
                Ok(_) => return Ok(Some(byte[0])),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn next_chunk(&mut self) -> io::Result<()> {
        self.buf.resize(CHUNK_BYTES + TAG_BYTES, 0);
        let mut filled = 0;
        if let Some(byte) = self.peeked.take() {
            self.buf[0] = byte;
            filled = 1;
        }
        while filled < self.buf.len() {
            match self.input.read(&mut self.buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        // A short chunk is the last; a full one is, only if nothing follows it.
        let last = filled < self.buf.len() || {
            self.peeked = self.read_byte()?;
            self.peeked.is_none()
        };
        if filled < TAG_BYTES {
            return Err(damaged("is cut short"));
        }
        if last && filled == TAG_BYTES && self.counter > 0 {
            return Err(damaged("ends with an empty chunk"));
        }
        let nonce = chunk_nonce(self.counter, last);
        let plain = self
            .key
            .open_in_place(nonce, aead::Aad::empty(), &mut self.buf[..filled])
            .map_err(|_| damaged("is changed or cut short (a chunk fails its tag)"))?;
        self.plain_len = plain.len();
        self.at = 0;
        self.counter += 1;
        self.ended = last;
        Ok(())
    }
}

impl<R: Read> Read for StreamReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.plain_len {
            if self.ended || out.is_empty() {
                return Ok(0);
            }
            self.next_chunk()?;
        }
        let n = out.len().min(self.plain_len - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
