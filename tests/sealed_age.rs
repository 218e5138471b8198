//! Sealed backups are age v1 files written without the `age` crate (src/backups/age_v1.rs):
//! checked here against the `age` crate itself, both ways, and against damage.
//!
//! - a backup sealed here opens with `age` (the wrapped key with age's scrypt identity, the
//!   backup with age's X25519 identity), and one sealed with `age` (as earlier builds did)
//!   opens here;
//! - a changed byte, a file cut anywhere (at a chunk boundary too), a changed header MAC, a
//!   wrong passphrase and a work factor over the cap are refused, and nothing is written;
//! - payloads of every size around the 64 KiB chunk boundary round-trip in both directions.

use std::io::{BufReader, Read, Write};
use std::path::Path;

use age::secrecy::{ExposeSecret, SecretString};
use iris_gateway::backups::age_v1::{self, CHUNK_BYTES};
use iris_gateway::backups::sealed::{self, Extras, Key, SealError, Sealer, MAGIC};
use proptest::prelude::*;

const PASSPHRASE: &str = "correct horse battery staple";
/// A cheap work factor for files made with `age` here (the gateway's own is 2^15).
const CHEAP_LOG_N: u8 = 10;

fn extras() -> Extras {
    Extras {
        settings: Some(b"[agent]\nkind = \"demo\"\n".to_vec()),
        owner: Some(br#"{"hash":"$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA"}"#.to_vec()),
    }
}

/// Bytes that do not repeat within a chunk, so a moved chunk cannot decrypt to the same text.
fn store_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The plaintext of a sealed backup's stream: each extra (present byte, length, bytes), then
/// the store backup.
fn stream_plaintext(extras: &Extras, store: &[u8]) -> Vec<u8> {
    let mut plain = Vec::new();
    for extra in [&extras.settings, &extras.owner] {
        match extra {
            None => plain.push(0),
            Some(b) => {
                plain.push(1);
                plain.extend_from_slice(&(b.len() as u32).to_be_bytes());
                plain.extend_from_slice(b);
            }
        }
    }
    plain.extend_from_slice(store);
    plain
}

/// Splits a sealed backup into its wrapped key and its age stream.
fn split(file: &[u8]) -> (&[u8], &[u8]) {
    assert_eq!(&file[..MAGIC.len()], MAGIC);
    let rest = &file[MAGIC.len()..];
    let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
    (&rest[4..4 + len], &rest[4 + len..])
}

/// A sealed backup made entirely with the `age` crate, the way earlier builds made one.
fn sealed_by_age(passphrase: &str, log_n: u8, extras: &Extras, store: &[u8]) -> (Key, Vec<u8>) {
    use base64::Engine;
    let identity = age::x25519::Identity::generate();
    let mut wrapper = age::scrypt::Recipient::new(SecretString::from(passphrase.to_owned()));
    wrapper.set_work_factor(log_n);
    let wrapped = age::encrypt(&wrapper, identity.to_string().expose_secret().as_bytes()).unwrap();
    let recipient = identity.to_public();
    let mut file = MAGIC.to_vec();
    file.extend_from_slice(&(wrapped.len() as u32).to_be_bytes());
    file.extend_from_slice(&wrapped);
    let encryptor =
        age::Encryptor::with_recipients(std::iter::once(&recipient as &dyn age::Recipient))
            .unwrap();
    let mut stream = encryptor.wrap_output(&mut file).unwrap();
    stream.write_all(&stream_plaintext(extras, store)).unwrap();
    stream.finish().unwrap();
    let key = Key {
        recipient: recipient.to_string(),
        wrapped: base64::engine::general_purpose::STANDARD.encode(&wrapped),
        set_ms: 1,
    };
    (key, file)
}

fn seal_here(key: &Key, extras: &Extras, store: &[u8]) -> Vec<u8> {
    let mut sealer = Sealer::new(Vec::new(), key, extras).unwrap();
    // Written in uneven pieces, as the backup's copy writes them.
    for piece in store.chunks(7_777) {
        sealer.write_all(piece).unwrap();
    }
    sealer.finish().unwrap()
}

/// Opens `file` here; on success also checks what came out.
fn open_here(dir: &Path, file: &[u8], passphrase: &str) -> Result<(Extras, Vec<u8>), SealError> {
    let path = dir.join("backup.age");
    std::fs::write(&path, file).unwrap();
    let out = dir.join("store.iris");
    let _ = std::fs::remove_file(&out);
    let got = sealed::open(&path, passphrase, &out);
    match got {
        Ok(extras) => Ok((extras, std::fs::read(&out).unwrap())),
        Err(e) => {
            assert!(!out.exists(), "a refused backup left {}", out.display());
            Err(e)
        }
    }
}

#[test]
fn a_backup_sealed_here_opens_with_age() {
    let dir = tempfile::tempdir().unwrap();
    let key = sealed::set_passphrase(dir.path(), PASSPHRASE).unwrap();
    let store = store_bytes(3 * CHUNK_BYTES + 123, 7);
    let file = seal_here(&key, &extras(), &store);
    let (wrapped, stream) = split(&file);

    let mut unwrapper = age::scrypt::Identity::new(SecretString::from(PASSPHRASE.to_owned()));
    unwrapper.set_max_work_factor(17);
    let secret = age::decrypt(&unwrapper, wrapped).expect("age opens the wrapped key");
    let identity: age::x25519::Identity = std::str::from_utf8(&secret).unwrap().parse().unwrap();
    assert_eq!(identity.to_public().to_string(), key.recipient);

    let decryptor = age::Decryptor::new_buffered(stream).unwrap();
    let mut plain = Vec::new();
    decryptor
        .decrypt(std::iter::once(&identity as &dyn age::Identity))
        .expect("age opens the backup")
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, stream_plaintext(&extras(), &store));
}

#[test]
fn a_backup_sealed_with_age_opens_here_and_so_does_one_sealed_here_to_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_bytes(2 * CHUNK_BYTES, 11);
    let (key, file) = sealed_by_age(PASSPHRASE, CHEAP_LOG_N, &extras(), &store);
    let (got_extras, got_store) = open_here(dir.path(), &file, PASSPHRASE).unwrap();
    assert_eq!(got_extras, extras());
    assert_eq!(got_store, store);

    // A key set by an earlier build (made with `age`) keeps sealing new backups here.
    let none = Extras::default();
    let file = seal_here(&key, &none, b"after the upgrade");
    let (got_extras, got_store) = open_here(dir.path(), &file, PASSPHRASE).unwrap();
    assert_eq!(got_extras, none);
    assert_eq!(got_store, b"after the upgrade");
}

#[test]
fn damaged_cut_or_wrongly_opened_backups_are_refused_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_bytes(2 * CHUNK_BYTES + 500, 3);
    let (_, file) = sealed_by_age(PASSPHRASE, CHEAP_LOG_N, &extras(), &store);
    let (wrapped, stream) = split(&file);
    let stream_at = file.len() - stream.len();
    // The MAC line is `--- ` and 43 characters; the 16-byte nonce follows it.
    let payload_at = stream_at + find(stream, b"--- ") + 48 + 16;
    assert!(open_here(dir.path(), &file, PASSPHRASE).is_ok());

    let wrong = open_here(dir.path(), &file, "not the passphrase");
    assert!(
        matches!(wrong, Err(SealError::WrongPassphrase)),
        "{wrong:?}"
    );

    let damaged = |file: &[u8], what: &str| {
        let got = open_here(dir.path(), file, PASSPHRASE);
        assert!(
            matches!(got, Err(SealError::Damaged { .. })),
            "{what}: {got:?}"
        );
        got.unwrap_err().to_string()
    };

    // One changed byte in the payload's second chunk.
    let mut changed = file.clone();
    let second_chunk = payload_at + (CHUNK_BYTES + 16) + 40;
    changed[second_chunk] ^= 0x20;
    let why = damaged(&changed, "a changed payload byte");
    assert!(why.contains("is damaged or cut short"), "{why}");

    // The header's MAC, one character changed.
    let mac_at = stream_at + find(stream, b"--- ") + 10;
    let mut changed = file.clone();
    changed[mac_at] = if changed[mac_at] == b'A' { b'B' } else { b'A' };
    damaged(&changed, "a changed header MAC");

    // A recipient's share, one character changed: its key no longer opens the file key.
    let share_at = stream_at + find(stream, b"-> X25519 ") + 12;
    let mut changed = file.clone();
    changed[share_at] = if changed[share_at] == b'A' {
        b'B'
    } else {
        b'A'
    };
    damaged(&changed, "a changed X25519 share");

    // Cut: in the wrapped key, in the header, right after the nonce, mid-chunk, at the first
    // chunk's boundary (a whole chunk that says it is not the last), and one byte short.
    let cuts = [
        MAGIC.len() + 4 + wrapped.len() / 2,
        stream_at + 30,
        payload_at,
        payload_at + 1000,
        payload_at + CHUNK_BYTES + 16,
        file.len() - 1,
    ];
    for cut in cuts {
        damaged(&file[..cut], &format!("cut at {cut} of {}", file.len()));
    }
    // A whole chunk appended after the last one.
    let mut longer = file.clone();
    longer.extend_from_slice(&file[payload_at..payload_at + CHUNK_BYTES + 16]);
    damaged(&longer, "a chunk appended");

    // A passphrase stanza naming more work than the cap: refused before scrypt runs.
    let at = find(wrapped, format!(" {CHEAP_LOG_N}\n").as_bytes());
    let costly_wrapped = [&wrapped[..at], b" 18\n".as_slice(), &wrapped[at + 4..]].concat();
    let mut costly = MAGIC.to_vec();
    costly.extend_from_slice(&(costly_wrapped.len() as u32).to_be_bytes());
    costly.extend_from_slice(&costly_wrapped);
    costly.extend_from_slice(stream);
    let got = open_here(dir.path(), &costly, PASSPHRASE);
    assert!(
        matches!(got, Err(SealError::TooCostly { log_n: 18, .. })),
        "{got:?}"
    );
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(needle)))
}

/// The payload sizes where chunking can go wrong: 0, 1, and a few bytes either side of each of
/// the first three chunk boundaries.
fn boundary_size() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1usize),
        (1usize..=3, -2i64..=2).prop_map(|(n, d)| ((n * CHUNK_BYTES) as i64 + d) as usize),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn payloads_round_trip_with_age_both_ways_around_the_chunk_boundary(
        size in boundary_size(),
        seed in any::<u64>(),
    ) {
        let plain = store_bytes(size, seed);
        let ours = age_v1::Identity::generate().unwrap();
        let theirs: age::x25519::Identity = ours.to_secret_string().parse().unwrap();
        prop_assert_eq!(theirs.to_public().to_string(), ours.recipient().to_string());

        // Sealed here, opened by age and here.
        let mut writer = age_v1::encrypt_to(Vec::new(), &ours.recipient()).unwrap();
        writer.write_all(&plain).unwrap();
        let sealed = writer.finish().unwrap();
        let mut by_age = Vec::new();
        age::Decryptor::new_buffered(&sealed[..])
            .unwrap()
            .decrypt(std::iter::once(&theirs as &dyn age::Identity))
            .unwrap()
            .read_to_end(&mut by_age)
            .unwrap();
        prop_assert!(by_age == plain, "age read {} bytes of {}", by_age.len(), plain.len());
        let mut here = Vec::new();
        age_v1::decrypt_with(BufReader::new(&sealed[..]), &ours)
            .unwrap()
            .read_to_end(&mut here)
            .unwrap();
        prop_assert!(here == plain);

        // Sealed by age, opened here.
        let recipient = theirs.to_public();
        let mut sealed = Vec::new();
        let mut stream = age::Encryptor::with_recipients(
            std::iter::once(&recipient as &dyn age::Recipient),
        )
        .unwrap()
        .wrap_output(&mut sealed)
        .unwrap();
        stream.write_all(&plain).unwrap();
        stream.finish().unwrap();
        let mut here = Vec::new();
        age_v1::decrypt_with(BufReader::new(&sealed[..]), &ours)
            .unwrap()
            .read_to_end(&mut here)
            .unwrap();
        prop_assert!(here == plain, "read {} bytes of {}", here.len(), plain.len());
    }
}
