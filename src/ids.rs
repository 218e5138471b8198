//! Minting identifiers and secrets, and the wall clock the hub stamps frames with.

use base64::Engine;
use sha2::{Digest, Sha256};

/// Fills a buffer from the OS's CSPRNG. A box that cannot get randomness must not mint tokens,
/// so failure is fatal rather than silently weaker.
fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the OS random source is unavailable");
    b
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A time-ordered id: `prefix_` + 12 hex digits of milliseconds + 8 random hex digits, so ids
/// sort by creation (the channel directory relies on that) and never collide in practice.
pub fn time_ordered(prefix: &str) -> String {
    format!(
        "{prefix}_{:012x}{}",
        now_ms().max(0),
        hex(&random_bytes::<4>())
    )
}

/// A message id. Time-ordered for readability in logs; ordering in a lane comes from the store.
pub fn message_id() -> String {
    time_ordered("msg")
}

/// A pairing token: 256 random bits, URL-safe so it can ride in a QR code or a URL.
pub fn pairing_token() -> String {
    let raw = random_bytes::<32>();
    format!(
        "iris_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    )
}

/// What the store keeps of a token.
pub fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Milliseconds since the Unix epoch (the schema's `ts`).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_valid_protocol_ids_and_sort_by_time() {
        let a = time_ordered("chan");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = time_ordered("chan");
        assert!(crate::protocol::is_valid_id(&a) && a < b);
        let t = pairing_token();
        assert!(t.starts_with("iris_") && t.len() == 48);
        assert_ne!(token_hash(&t), token_hash(&pairing_token()));
    }
}
