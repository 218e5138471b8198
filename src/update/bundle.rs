//! The update bundle: one file that carries a gateway binary, what it is (the manifest), and a
//! signature over the manifest. The manifest names the binary's SHA-256, so checking the
//! signature and then the hash checks every byte.
//!
//! ```text
//! "IRISUPD\x01"  u32 BE manifest length  manifest (JSON)
//!                u32 BE signature length  signature (JSON: key id, base64 Ed25519)
//!                the binary (manifest.payload_len bytes), then nothing
//! ```
//!
//! The signed message is `SIGNED_PREFIX` followed by the manifest's bytes exactly as stored, so
//! nothing is re-encoded between signing and checking.

use std::io::{Read, Write};
use std::path::Path;

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::keys::{hex, PublicKey, SecretKey};
use super::Error;

const MAGIC: &[u8; 8] = b"IRISUPD\x01";
const SIGNED_PREFIX: &[u8] = b"iris-update-bundle-v1\0";
/// Bounds on what is read before the signature is checked: a manifest is a few hundred bytes.
pub const MAX_MANIFEST: u32 = 16 * 1024;
const MAX_SIGNATURE: u32 = 1024;
/// The largest binary a bundle may carry (the aarch64 binary is ~11 MB stripped).
pub const MAX_PAYLOAD: u64 = 64 * 1024 * 1024;
/// The largest bundle file accepted from an upload or a download.
pub const MAX_BUNDLE: u64 = MAX_PAYLOAD + 64 * 1024;

/// What a bundle says it carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `iris-gateway`.
    pub name: String,
    pub version: String,
    /// As Rust names it: `aarch64`, `arm`, `x86_64`.
    pub arch: String,
    pub payload_len: u64,
    /// Hex.
    pub payload_sha256: String,
    /// What changed, in a few lines, for the admin page.
    #[serde(default)]
    pub notes: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct SignatureBlock {
    key_id: String,
    signature: String,
}

/// A bundle whose signature and payload checked out.
#[derive(Debug, Clone)]
pub struct Verified {
    pub manifest: Manifest,
    pub version: semver::Version,
    /// The key that signed it (its comment, for the history).
    pub signed_by: String,
    /// Where in the file the binary starts.
    pub payload_offset: u64,
}

/// Writes a bundle of `binary` to `out`, signed with `key`.
pub fn write(
    out: &Path,
    binary: &Path,
    version: &str,
    arch: &str,
    notes: &str,
    key: &SecretKey,
) -> Result<Manifest, Error> {
    semver::Version::parse(version)
        .map_err(|e| Error::Bundle(format!("version {version:?} is not semver: {e}")))?;
    let bytes = std::fs::read(binary).map_err(|e| Error::io("reading the binary", binary, e))?;
    if bytes.len() as u64 > MAX_PAYLOAD {
        return Err(Error::Bundle(
            "the binary is larger than a bundle may carry".into(),
        ));
    }
    let manifest = Manifest {
        name: "iris-gateway".into(),
        version: version.into(),
        arch: arch.into(),
        payload_len: bytes.len() as u64,
        payload_sha256: hex(&Sha256::digest(&bytes)),
        notes: notes.into(),
    };
    let manifest_bytes = serde_json::to_vec(&manifest).expect("a manifest serializes");
    let signature = SignatureBlock {
        key_id: key.public("").id(),
        signature: base64::engine::general_purpose::STANDARD
            .encode(key.sign(&signed_message(&manifest_bytes))),
    };
    let signature_bytes = serde_json::to_vec(&signature).expect("a signature serializes");
    let mut file = Vec::with_capacity(bytes.len() + manifest_bytes.len() + 256);
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&(manifest_bytes.len() as u32).to_be_bytes());
    file.extend_from_slice(&manifest_bytes);
    file.extend_from_slice(&(signature_bytes.len() as u32).to_be_bytes());
    file.extend_from_slice(&signature_bytes);
    file.extend_from_slice(&bytes);
    let mut f = std::fs::File::create(out).map_err(|e| Error::io("creating", out, e))?;
    f.write_all(&file)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io("writing", out, e))?;
    Ok(manifest)
}

fn signed_message(manifest: &[u8]) -> Vec<u8> {
    [SIGNED_PREFIX, manifest].concat()
}

/// Checks `path` in full: its signature by one of `keys`, then every byte of the binary against
/// the signed hash, then that nothing follows it. Reads the file once, in bounded pieces.
pub fn verify(path: &Path, keys: &[PublicKey]) -> Result<Verified, Error> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io("opening", path, e))?;
    let len = f
        .metadata()
        .map_err(|e| Error::io("reading", path, e))?
        .len();
    if len > MAX_BUNDLE {
        return Err(Error::Bundle(format!(
            "the file is {len} bytes, more than any bundle ({MAX_BUNDLE})"
        )));
    }
    let mut magic = [0u8; 8];
    read_exact(&mut f, &mut magic)?;
    if &magic != MAGIC {
        return Err(Error::Bundle(
            "not an iris-gateway update bundle (no bundle header)".into(),
        ));
    }
    let manifest_bytes = read_block(&mut f, MAX_MANIFEST, "manifest")?;
    let signature_bytes = read_block(&mut f, MAX_SIGNATURE, "signature")?;
    let block: SignatureBlock = serde_json::from_slice(&signature_bytes)
        .map_err(|e| Error::Bundle(format!("the signature block does not parse: {e}")))?;
    let signature = base64::engine::general_purpose::STANDARD
        .decode(&block.signature)
        .map_err(|_| Error::Bundle("the signature is not base64".into()))?;
    let message = signed_message(&manifest_bytes);
    let signer = keys
        .iter()
        .find(|k| k.verify(&message, &signature))
        .ok_or_else(|| {
            Error::BadSignature(if keys.iter().any(|k| k.id() == block.key_id) {
                "the signature does not match the bundle: it was changed after signing".into()
            } else {
                format!(
                    "signed by a key this gateway does not trust (key {})",
                    block.key_id
                )
            })
        })?;
    let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
        .map_err(|e| Error::Bundle(format!("the manifest does not parse: {e}")))?;
    if manifest.name != "iris-gateway" {
        return Err(Error::Bundle(format!(
            "the bundle is for {:?}, not iris-gateway",
            manifest.name
        )));
    }
    let version = semver::Version::parse(&manifest.version)
        .map_err(|e| Error::Bundle(format!("the version does not parse: {e}")))?;
    let payload_offset = 8 + 4 + manifest_bytes.len() as u64 + 4 + signature_bytes.len() as u64;
    if payload_offset + manifest.payload_len != len {
        return Err(Error::Bundle(format!(
            "the file is {len} bytes; the manifest says {}: it is cut short or has extra bytes",
            payload_offset + manifest.payload_len
        )));
    }
    let mut hasher = Sha256::new();
    let mut first = Vec::with_capacity(64);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::io("reading", path, e))?;
        if n == 0 {
            break;
        }
        if first.len() < 64 {
            let take = (64 - first.len()).min(n);
            first.extend_from_slice(&buf[..take]);
        }
        hasher.update(&buf[..n]);
    }
    if hex(&hasher.finalize()) != manifest.payload_sha256 {
        return Err(Error::BadSignature(
            "the binary does not match the signed manifest".into(),
        ));
    }
    let elf_arch = elf_arch(&first);
    if elf_arch != Some(manifest.arch.as_str()) {
        return Err(Error::Bundle(format!(
            "the manifest says {} but the binary is {}",
            manifest.arch,
            elf_arch.unwrap_or("not a Linux program this gateway knows")
        )));
    }
    Ok(Verified {
        manifest,
        version,
        signed_by: if signer.comment.is_empty() {
            signer.id()
        } else {
            signer.comment.clone()
        },
        payload_offset,
    })
}

fn read_exact(f: &mut std::fs::File, buf: &mut [u8]) -> Result<(), Error> {
    f.read_exact(buf)
        .map_err(|_| Error::Bundle("the file is cut short".into()))
}

fn read_block(f: &mut std::fs::File, max: u32, what: &str) -> Result<Vec<u8>, Error> {
    let mut len = [0u8; 4];
    read_exact(f, &mut len)?;
    let len = u32::from_be_bytes(len);
    if len > max {
        return Err(Error::Bundle(format!(
            "the {what} is larger than {max} bytes"
        )));
    }
    let mut bytes = vec![0u8; len as usize];
    read_exact(f, &mut bytes)?;
    Ok(bytes)
}

/// The architecture an ELF header says its program is for, as Rust names it.
pub fn elf_arch(header: &[u8]) -> Option<&'static str> {
    if header.len() < 20 || &header[..4] != b"\x7fELF" {
        return None;
    }
    // e_machine, little-endian on every target the gateway is built for (EI_DATA = 1).
    if header[5] != 1 {
        return None;
    }
    match (header[4], u16::from_le_bytes([header[18], header[19]])) {
        (2, 183) => Some("aarch64"),
        (1, 40) => Some("arm"),
        (2, 62) => Some("x86_64"),
        _ => None,
    }
}

/// Copies the binary out of a verified bundle to `out` (mode 0755, fsynced), hashing it again
/// on the way: the file may have changed since it was verified.
pub fn extract(bundle: &Path, verified: &Verified, out: &Path) -> Result<(), Error> {
    use std::io::Seek;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::File::open(bundle).map_err(|e| Error::io("opening", bundle, e))?;
    f.seek(std::io::SeekFrom::Start(verified.payload_offset))
        .map_err(|e| Error::io("reading", bundle, e))?;
    let _ = std::fs::remove_file(out);
    let mut w = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(out)
        .map_err(|e| Error::io("creating", out, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = verified.manifest.payload_len;
    while left > 0 {
        let want = buf.len().min(left as usize);
        let n = f
            .read(&mut buf[..want])
            .map_err(|e| Error::io("reading", bundle, e))?;
        if n == 0 {
            return Err(Error::Bundle(
                "the bundle was cut short while copying".into(),
            ));
        }
        hasher.update(&buf[..n]);
        w.write_all(&buf[..n])
            .map_err(|e| Error::io("writing", out, e))?;
        left -= n as u64;
    }
    if hex(&hasher.finalize()) != verified.manifest.payload_sha256 {
        let _ = std::fs::remove_file(out);
        return Err(Error::BadSignature(
            "the binary changed after it was verified".into(),
        ));
    }
    w.sync_all().map_err(|e| Error::io("writing", out, e))
}
