//! The last log lines, kept in memory for the admin page's Log view.
//!
//! On the image the journal lives in RAM and is reachable only over SSH, so the owner's phone
//! could otherwise never see why something failed. The ring is bounded twice: at most
//! [`LOG_RING_LINES`] lines of at most [`LOG_LINE_MAX_BYTES`] bytes each, so it never holds more
//! than about 600 KB whatever is logged. It receives exactly what goes to stderr (the same
//! formatter writes both), so what it shows is no more than the journal already holds; secrets
//! are kept out of both by never logging them (`config::Secret` redacts itself in `Debug`).
//!
//! A restart from the admin page execs the binary afresh, so the ring (a process global) would
//! start empty, as after a stop: at a clean stop or restart `main.rs` writes it to the data dir
//! once ([`to_keep`]) and the next start puts it back ([`take_kept`]). Nothing is written per
//! line (the card's wear); a crash loses the ring, which the journal still has.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Mutex;

/// How many lines the ring keeps (the newest): "the last few hundred" of the issue.
pub const LOG_RING_LINES: usize = 300;
/// Longest line kept; a longer one is cut (with `…`), so one huge line cannot fill the ring.
pub const LOG_LINE_MAX_BYTES: usize = 2048;

/// The ring: complete lines, and the start of a line not yet ended by `\n`.
struct Ring {
    lines: VecDeque<String>,
    partial: Vec<u8>,
}

/// One ring per process: logging is set up once, in `main`, before anything logs.
static RING: Mutex<Ring> = Mutex::new(Ring {
    lines: VecDeque::new(),
    partial: Vec::new(),
});

impl Ring {
    /// Takes bytes as the formatter writes them, splitting them into lines.
    fn take(&mut self, mut bytes: &[u8]) {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            self.extend_partial(&bytes[..end]);
            let line = strip_ansi(&String::from_utf8_lossy(&self.partial));
            self.partial.clear();
            if self.lines.len() == LOG_RING_LINES {
                self.lines.pop_front();
            }
            self.lines.push_back(line);
            bytes = &bytes[end + 1..];
        }
        self.extend_partial(bytes);
    }

    /// Keeps at most [`LOG_LINE_MAX_BYTES`] of a line; the rest is dropped as it comes.
    fn extend_partial(&mut self, bytes: &[u8]) {
        let room = LOG_LINE_MAX_BYTES.saturating_sub(self.partial.len());
        if bytes.len() > room {
            self.partial.extend_from_slice(&bytes[..room]);
            if room > 0 {
                self.partial.extend_from_slice("\u{2026}".as_bytes());
            }
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }
}

/// Colour codes (`ESC [ … m`) are for terminals, not for a web page.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The lines kept, oldest first.
pub fn lines() -> Vec<String> {
    let ring = RING.lock().unwrap_or_else(|p| p.into_inner());
    ring.lines.iter().cloned().collect()
}

/// The file in the data dir that carries the ring across a restart.
pub const KEPT_FILE: &str = "log-before-restart.txt";
/// The line put between the lines of the run before and this run's.
pub const RESTART_MARK: &str = "----- the gateway restarted -----";

/// What goes to `DATA_DIR/`[`KEPT_FILE`], written whole (`main.rs`) once, at a clean stop or
/// restart, so the Log page still shows what led up to it. Never per line: a crash loses the
/// ring (the journal keeps it). At most the ring's bound, about 600 KB.
pub fn to_keep() -> Vec<u8> {
    let mut text = lines().join("\n");
    text.push('\n');
    text.into_bytes()
}

/// Puts the lines [`to_keep`] gave back into the ring (before this run's first line). The file
/// is deleted once the store has opened (`server.rs`), so they are shown once more, not at
/// every start after, and a start the store refuses changes no file.
pub fn take_kept(data_dir: &std::path::Path) {
    let Some(text) = read_kept(&data_dir.join(KEPT_FILE)) else {
        return;
    };
    let mut ring = RING.lock().unwrap_or_else(|p| p.into_inner());
    let now = std::mem::take(&mut ring.lines);
    ring.take(&text);
    ring.take(format!("{RESTART_MARK}\n").as_bytes());
    for line in now {
        if ring.lines.len() == LOG_RING_LINES {
            ring.lines.pop_front();
        }
        ring.lines.push_back(line);
    }
}

/// The newest part of the kept file, at most what the ring holds: [`to_keep`] writes no more,
/// so a larger file was not ours whole, and start-up never reads more than the bound.
fn read_kept(path: &std::path::Path) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let cap = (LOG_RING_LINES * (LOG_LINE_MAX_BYTES + 1)) as u64;
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(cap))).ok()?;
    let mut text = Vec::new();
    file.take(cap).read_to_end(&mut text).ok()?;
    Some(text)
}

/// A writer for `tracing_subscriber::fmt`: every write goes to stderr and into the ring.
pub struct Tee;

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        RING.lock().unwrap_or_else(|p| p.into_inner()).take(buf);
        std::io::stderr().write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `MakeWriter` for the formatter: one [`Tee`] per event.
pub fn make_writer() -> Tee {
    Tee
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_file_is_read_no_further_than_the_ring_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEPT_FILE);
        let cap = LOG_RING_LINES * (LOG_LINE_MAX_BYTES + 1);
        let mut big = vec![b'x'; cap * 3];
        big.extend_from_slice(b"\nthe newest line\n");
        std::fs::write(&path, &big).unwrap();
        let read = read_kept(&path).unwrap();
        assert_eq!(read.len(), cap);
        assert!(read.ends_with(b"the newest line\n"));
        std::fs::write(&path, b"one\n").unwrap();
        assert_eq!(read_kept(&path).unwrap(), b"one\n");
        assert!(read_kept(&dir.path().join("absent")).is_none());
    }

    #[test]
    fn lines_are_split_bounded_and_stripped() {
        let mut ring = Ring {
            lines: VecDeque::new(),
            partial: Vec::new(),
        };
        ring.take(b"\x1b[32mINFO\x1b[0m one\ntw");
        ring.take(b"o\n");
        assert_eq!(ring.lines, ["INFO one", "two"]);
        ring.take(&vec![b'x'; LOG_LINE_MAX_BYTES * 3]);
        ring.take(b"\n");
        let long = ring.lines.back().unwrap();
        assert!(long.len() <= LOG_LINE_MAX_BYTES + 3, "{}", long.len());
        for n in 0..LOG_RING_LINES * 2 {
            ring.take(format!("line {n}\n").as_bytes());
        }
        assert_eq!(ring.lines.len(), LOG_RING_LINES);
        assert_eq!(
            ring.lines.back().map(String::as_str),
            Some(format!("line {}", LOG_RING_LINES * 2 - 1).as_str())
        );
    }
}
