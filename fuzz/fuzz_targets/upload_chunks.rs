//! The binary-frame path of a media upload: `media.upload.start`, binary frames, `.end`, and
//! the idle timeout, in any order, with any chunk bytes and any claimed checksum.
//!
//! The target drives the real `media::MediaFiles` / `media::Upload` (temp files in a private
//! directory, on a tokio current-thread runtime like the gateway's) exactly as
//! `session/upload.rs` does: one upload slot per connection, a second start refused while
//! one is active, a chunk outside an upload refused, a failed write dropping the upload (and its
//! temp file) so its end is answered `ok: false`, an end naming nothing active refused. An
//! in-memory model says what each step must do. Checked: no panic; a chunk is refused exactly
//! when it would pass the announced size; an end succeeds exactly when every announced byte
//! arrived and the checksum matches (case and surrounding spaces ignored), and the stored blob
//! then holds exactly those bytes under their SHA-256; the quota's byte count follows; and no
//! temp file outlives its upload.

#![no_main]

use std::path::PathBuf;

use arbitrary::Arbitrary;
use iris_gateway::media::{MediaError, MediaFiles, Upload};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

/// `limits.max_media_bytes` for the target: small, so both refusals are reachable.
const MAX_SIZE: u64 = 2048;

#[derive(Arbitrary, Debug)]
enum Step {
    /// `media.upload.start` announcing this many bytes.
    Start { size: u16 },
    /// A binary frame.
    Chunk(Vec<u8>),
    /// `media.upload.end` claiming a checksum.
    End(Claim),
    /// `limits.media_idle_timeout_secs` passed: the upload is abandoned.
    Idle,
}

#[derive(Arbitrary, Debug)]
enum Claim {
    Right,
    Upper,
    Padded,
    /// The right checksum with one hex digit changed.
    Altered(u8),
    Other(String),
}

/// The connection's upload slot, as `session/upload.rs` keeps it, plus the model's bytes.
struct Active {
    upload: Option<Upload>,
    expected: u64,
    bytes: Vec<u8>,
}

struct Env {
    runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
    tmp: PathBuf,
    files: MediaFiles,
}

thread_local! {
    static ENV: Env = {
        let dir = tempfile::tempdir().expect("a temp dir");
        let files = MediaFiles::open(dir.path(), MAX_SIZE, u64::MAX / 4, None).expect("media dir");
        Env {
            runtime: tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime"),
            tmp: dir.path().join("media/tmp"),
            _dir: dir,
            files,
        }
    };
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn run(env: &Env, steps: Vec<Step>) {
    let (rt, files) = (&env.runtime, &env.files);
    let mut slot: Option<Active> = None;
    let mut stored: Vec<String> = Vec::new();
    for step in steps {
        match step {
            Step::Start { size } => {
                if slot.is_some() {
                    continue; // refused: an upload is still in progress
                }
                let size = u64::from(size);
                match rt.block_on(files.begin(size)) {
                    Ok(upload) => {
                        assert!(size <= MAX_SIZE, "began an upload of {size} bytes");
                        slot = Some(Active {
                            upload: Some(upload),
                            expected: size,
                            bytes: Vec::new(),
                        });
                    }
                    Err(MediaError::TooLarge { .. }) => assert!(size > MAX_SIZE),
                    Err(e) => panic!("start of {size} bytes: unexpected {e}"),
                }
            }
            Step::Chunk(chunk) => {
                let Some(active) = slot.as_mut() else {
                    continue; // refused: a binary frame outside an upload
                };
                let Some(upload) = active.upload.as_mut() else {
                    continue; // the upload already failed; its end will say so
                };
                let fits = (active.bytes.len() + chunk.len()) as u64 <= active.expected;
                match rt.block_on(upload.write(&chunk)) {
                    Ok(()) => {
                        assert!(fits, "took bytes past the announced size");
                        active.bytes.extend_from_slice(&chunk);
                        assert_eq!(upload.received(), active.bytes.len() as u64);
                    }
                    Err(MediaError::TooMuchData { expected }) => {
                        assert!(!fits, "refused a chunk that fits");
                        assert_eq!(expected, active.expected);
                        active.upload = None;
                    }
                    Err(e) => panic!("chunk: unexpected {e}"),
                }
            }
            Step::End(claim) => {
                let Some(active) = slot.take() else {
                    continue; // answered ok: false, nothing active
                };
                let Some(upload) = active.upload else {
                    continue; // answered ok: false, it failed earlier
                };
                let actual = hex(&Sha256::digest(&active.bytes));
                let claimed = match claim {
                    Claim::Right => actual.clone(),
                    Claim::Upper => actual.to_ascii_uppercase(),
                    Claim::Padded => format!(" {actual}\n"),
                    Claim::Altered(at) => {
                        let mut s = actual.clone().into_bytes();
                        let i = usize::from(at) % s.len();
                        s[i] = if s[i] == b'0' { b'1' } else { b'0' };
                        String::from_utf8(s).expect("hex")
                    }
                    Claim::Other(s) => s,
                };
                let good = claimed.trim().eq_ignore_ascii_case(&actual);
                let complete = active.bytes.len() as u64 == active.expected;
                let existed = files.blob_path(&actual).exists();
                let used_before = files.used();
                match rt.block_on(upload.finish(files, &claimed)) {
                    Ok((sha, size)) => {
                        assert!(good && complete, "accepted an upload that does not match");
                        assert_eq!((sha.as_str(), size), (actual.as_str(), active.expected));
                        let on_disk = std::fs::read(files.blob_path(&sha)).expect("stored blob");
                        assert!(on_disk == active.bytes, "the stored blob differs");
                        let grew = if existed { 0 } else { size };
                        assert_eq!(files.used(), used_before + grew);
                        stored.push(sha);
                    }
                    Err(MediaError::WrongLength { received, expected }) => {
                        assert!(!complete);
                        assert_eq!(
                            (received, expected),
                            (active.bytes.len() as u64, active.expected)
                        );
                    }
                    Err(MediaError::WrongChecksum { .. }) => assert!(complete && !good),
                    Err(e) => panic!("end: unexpected {e}"),
                }
            }
            Step::Idle => slot = None,
        }
    }
    drop(slot); // the connection closes
    let left = std::fs::read_dir(&env.tmp).expect("tmp dir").count();
    assert_eq!(left, 0, "{left} temp file(s) outlived their upload");
    for sha in stored {
        files.remove_blob(&sha);
    }
    assert_eq!(files.used(), 0, "the quota count drifted");
}

fuzz_target!(|steps: Vec<Step>| {
    ENV.with(|env| run(env, steps));
});
