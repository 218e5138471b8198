//! The keys updates are signed with: the release key built into the binary, the keys the box's
//! root put in the trusted-keys directory (an owner who builds the gateway themselves), and the
//! secret keys `update keygen` makes for whoever signs.
//!
//! A public key file is one line, `iris-update-key-v1 ed25519 BASE64 COMMENT`; a secret key
//! file is `iris-update-secret-v1 ed25519 BASE64` (the PKCS#8 document ring reads), mode 0600.

use std::path::Path;

use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use sha2::{Digest, Sha256};

use super::Error;

const PUBLIC_TAG: &str = "iris-update-key-v1";
const SECRET_TAG: &str = "iris-update-secret-v1";
/// Longest key file read from the trusted-keys directory, and most files read from it: a key is
/// one short line, and the directory is root's, not a place for anything else.
const MAX_KEY_FILE: u64 = 1024;
const MAX_TRUSTED_KEYS: usize = 16;

/// The project's release key. Its secret half is kept offline by the maintainers and never in
/// the repository (docs/security.md, "Updates").
pub const RELEASE_KEY: &str =
    "iris-update-key-v1 ed25519 UbYFV1MnSCYjx/MHdEZOGxa1XlNZ16o3W7RzkbRbDZY= iris-gateway release 2026";

/// A public key updates may be signed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    bytes: [u8; 32],
    pub comment: String,
}

impl PublicKey {
    pub fn parse(line: &str) -> Result<PublicKey, Error> {
        let mut parts = line.trim().splitn(4, ' ');
        let (tag, alg, b64) = (parts.next(), parts.next(), parts.next());
        if tag != Some(PUBLIC_TAG) || alg != Some("ed25519") {
            return Err(Error::Key(format!(
                "not an update key (expected a line starting `{PUBLIC_TAG} ed25519`)"
            )));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.unwrap_or_default())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| Error::Key("the key is not 32 bytes of base64".into()))?;
        Ok(PublicKey {
            bytes,
            comment: parts.next().unwrap_or_default().to_owned(),
        })
    }

    /// A short name for the key: the first 8 bytes of its SHA-256, in hex.
    pub fn id(&self) -> String {
        hex(&Sha256::digest(self.bytes)[..8])
    }

    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, self.bytes)
            .verify(message, signature)
            .is_ok()
    }

    pub fn to_line(&self) -> String {
        format!(
            "{PUBLIC_TAG} ed25519 {} {}",
            base64::engine::general_purpose::STANDARD.encode(self.bytes),
            self.comment
        )
    }
}

/// The keys a bundle may be signed with: the release key and the trusted-keys directory's.
pub fn trusted(keys_dir: &Path) -> Vec<PublicKey> {
    let mut keys: Vec<PublicKey> = PublicKey::parse(RELEASE_KEY).into_iter().collect();
    let Ok(entries) = std::fs::read_dir(keys_dir) else {
        return keys;
    };
    let mut names: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pub"))
        .collect();
    names.sort();
    if names.len() > MAX_TRUSTED_KEYS {
        tracing::warn!(
            "{} holds {} keys; only the first {MAX_TRUSTED_KEYS} (by name) are trusted",
            keys_dir.display(),
            names.len()
        );
    }
    for path in names.into_iter().take(MAX_TRUSTED_KEYS) {
        let text = match std::fs::metadata(&path) {
            Ok(m) if m.len() <= MAX_KEY_FILE => std::fs::read_to_string(&path).ok(),
            _ => None,
        };
        match text.as_deref().map(PublicKey::parse) {
            Some(Ok(key)) => keys.push(key),
            _ => tracing::warn!("update key {} is not a key; ignored", path.display()),
        }
    }
    keys
}

/// A key that signs bundles (`update keygen`, `update bundle`).
pub struct SecretKey {
    pair: Ed25519KeyPair,
}

impl SecretKey {
    /// A new key pair, and its secret key file's text.
    pub fn generate() -> Result<(SecretKey, String), Error> {
        let rng = ring::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| Error::Key("cannot make a key".into()))?;
        let text = format!(
            "{SECRET_TAG} ed25519 {}\n",
            base64::engine::general_purpose::STANDARD.encode(doc.as_ref())
        );
        Ok((SecretKey::parse(&text)?, text))
    }

    pub fn parse(text: &str) -> Result<SecretKey, Error> {
        let mut parts = text.split_whitespace();
        if parts.next() != Some(SECRET_TAG) || parts.next() != Some("ed25519") {
            return Err(Error::Key(format!(
                "not a secret update key ({SECRET_TAG})"
            )));
        }
        let doc = base64::engine::general_purpose::STANDARD
            .decode(parts.next().unwrap_or_default())
            .map_err(|_| Error::Key("the secret key is not base64".into()))?;
        let pair = Ed25519KeyPair::from_pkcs8(&doc)
            .map_err(|_| Error::Key("the secret key does not parse".into()))?;
        Ok(SecretKey { pair })
    }

    pub fn public(&self, comment: &str) -> PublicKey {
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey {
            bytes,
            comment: comment.to_owned(),
        }
    }

    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_release_key_parses() {
        let key = PublicKey::parse(RELEASE_KEY).unwrap();
        assert_eq!(key.id().len(), 16);
    }

    #[test]
    fn a_signature_verifies_only_with_its_key_and_message() {
        let (secret, text) = SecretKey::generate().unwrap();
        let again = SecretKey::parse(&text).unwrap();
        let public = PublicKey::parse(&again.public("test").to_line()).unwrap();
        let sig = secret.sign(b"manifest");
        assert!(public.verify(b"manifest", &sig));
        assert!(!public.verify(b"manifesT", &sig));
        let (other, _) = SecretKey::generate().unwrap();
        assert!(!other.public("o").verify(b"manifest", &sig));
    }
}
