//! `iris-gateway chat`, the terminal client, against the real gateway: it pairs itself through
//! the data dir, sends typed lines, renders the streamed turn, and reuses its credentials.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Gateway, BIN};
use serde_json::json;

/// Runs the client with `lines` on stdin, keeping stdin open for `linger` so the reply can
/// stream in before the client sees end-of-input and quits. Returns (exit ok, stdout).
fn chat(
    data_dir: &std::path::Path,
    extra: &[&str],
    lines: &str,
    linger: Duration,
) -> (bool, String) {
    let mut child = Command::new(BIN)
        .arg("chat")
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn chat");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(lines.as_bytes()).unwrap();
    std::thread::sleep(linger);
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (
        out.status.success(),
        format!("{stdout}\n--- stderr ---\n{stderr}"),
    )
}

#[test]
fn chat_pairs_itself_renders_a_turn_and_reuses_its_token() {
    let dir = common::temp_data_dir();
    let _gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1"]);

    let (ok, out) = chat(
        dir.path(),
        &[],
        "hello there world\n",
        Duration::from_secs(3),
    );
    assert!(ok, "chat failed:\n{out}");
    // The reply streamed and finished, with the tool call, todo list, reasoning and footer.
    assert!(out.contains("That is 3 words and 17 characters."), "{out}");
    assert!(out.contains("word_count"), "no tool line:\n{out}");
    assert!(out.contains("todo:"), "no todo line:\n{out}");
    assert!(out.contains("reasoning:"), "no reasoning:\n{out}");
    assert!(out.contains("iris-demo"), "no footer:\n{out}");
    // Text grows in place: the final reply appears once, not once per update.
    assert_eq!(out.matches("That is 3 words").count(), 1, "{out}");

    let creds = dir.path().join("chat-client.json");
    assert!(creds.exists(), "the client keeps its token in the data dir");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&creds).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "credentials must be private");

    // A second run reuses the device instead of pairing a new one, and talks in a new channel.
    let (ok, out) = chat(
        dir.path(),
        &["--channel", "Garden"],
        "",
        Duration::from_millis(800),
    );
    assert!(ok, "{out}");
    assert!(out.contains("[created channel Garden]"), "{out}");
    let devices = common::devices_json(dir.path());
    let chat_devices = devices
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["name"] == "terminal chat")
        .count();
    assert_eq!(chat_devices, 1, "{devices}");
}

/// A real PNG of `w`×`h` pixels, from an encoder.
fn png(w: u32, h: u32) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    image::RgbImage::new(w, h)
        .write_to(&mut out, image::ImageFormat::Png)
        .unwrap();
    out.into_inner()
}

/// A running `iris-gateway chat` whose output is read as it comes, for tests that wait for
/// something to be printed instead of for a fixed time.
struct Live {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Live {
    fn start(data_dir: &std::path::Path, extra: &[&str]) -> Live {
        use std::io::BufRead;
        let mut child = Command::new(BIN)
            .arg("chat")
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chat");
        let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stdout = child.stdout.take().unwrap();
        let reader = {
            let out = out.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let mut o = out.lock().unwrap();
                    o.push_str(&line);
                    o.push('\n');
                }
            })
        };
        Live {
            child,
            out,
            reader: Some(reader),
        }
    }

    fn type_lines(&mut self, lines: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin open");
        stdin.write_all(lines.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits until `what` was printed `times` times.
    fn wait_for(&self, what: &str, times: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.output().matches(what).count() < times {
            assert!(
                Instant::now() < deadline,
                "{what:?} not printed {times} times within {within:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ends input (Ctrl-D) and waits for the client to quit: (exit ok, everything printed).
    fn finish(mut self) -> (bool, String) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let ok = self.child.wait().unwrap().success();
        self.reader.take().unwrap().join().unwrap();
        (ok, self.output())
    }
}

/// The paths the client printed for saved files (`[saved NAME (N bytes): PATH]`), in order.
fn saved_paths(out: &str) -> Vec<std::path::PathBuf> {
    out.lines()
        .filter_map(|l| l.strip_prefix("[saved "))
        .filter_map(|l| l.split_once("): "))
        .map(|(_, path)| std::path::PathBuf::from(path.trim_end_matches(']')))
        .collect()
}

/// Every file the gateway offered (a full `sync`), pulled by a second device.
async fn offered_files(gw: &Gateway) -> Vec<(String, Vec<u8>)> {
    use common::{connect_online, frame_type, id_of, Incoming};
    let paired = common::pair(&gw.data_dir, "checker");
    let (mut c, _) = connect_online(gw, &paired).await;
    let sid = c.request("sync", None, None, json!({ "cursor": 0 })).await;
    let mut offers = Vec::new();
    loop {
        let f = c.recv().await;
        if id_of(&f) == Some(sid) {
            break;
        }
        if frame_type(&f) == "media.offer" {
            offers.push(f["payload"].clone());
        }
    }
    let mut files = Vec::new();
    for offer in offers {
        let media_id = offer["media_id"].as_str().unwrap();
        let rid = c
            .request("media.pull", None, None, json!({ "media_id": media_id }))
            .await;
        let mut bytes = Vec::new();
        loop {
            match c.recv_any().await {
                Incoming::Binary(b) => bytes.extend_from_slice(&b),
                Incoming::Text(f) if id_of(&f) == Some(rid) => {
                    assert_eq!(f["payload"]["ok"], true, "{f}");
                    break;
                }
                Incoming::Text(_) => {}
                Incoming::Closed(why) => panic!("closed during a pull: {why:?}"),
            }
        }
        files.push((offer["filename"].as_str().unwrap().to_owned(), bytes));
    }
    files
}

#[tokio::test(flavor = "current_thread")]
async fn chat_attaches_files_and_saves_the_agents_file_without_replacing_any() {
    let dir = common::temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1"]);
    let work = common::temp_data_dir();
    let picture = png(5, 3);
    let plant = work.path().join("plant.png");
    std::fs::write(&plant, &picture).unwrap();
    let notes = work.path().join("garden notes.txt");
    let notes_text = "Buy bean seeds\nwater on Tuesday\n";
    std::fs::write(&notes, notes_text).unwrap();
    let downloads = work.path().join("dl");
    std::fs::create_dir_all(&downloads).unwrap();
    // A file of the same name is already there: it must survive.
    std::fs::write(downloads.join("received.txt"), "mine").unwrap();

    let lines = format!(
        "/attach {} what plant is this?\n/attach \"{}\"\n",
        plant.display(),
        notes.display()
    );
    let dl = downloads.to_str().unwrap();
    let mut live = Live::start(dir.path(), &["--downloads", dl]);
    live.wait_for("[gateway online]", 1, Duration::from_secs(20));
    live.type_lines(&lines);
    // Each turn's answer is streamed and its file saved.
    live.wait_for("[saved received.txt", 2, Duration::from_secs(60));
    live.wait_for("[iris-demo", 2, Duration::from_secs(20));
    let (ok, out) = live.finish();
    assert!(ok, "chat failed:\n{out}");

    // (a) The demo names what it was shown: the image's size, the document's first line.
    assert!(
        out.contains(&format!(
            "You attached plant.png (image, image/png, {0} bytes; {0} bytes received).",
            picture.len()
        )),
        "{out}"
    );
    assert!(
        out.contains("It is a PNG image of 5\u{d7}3 pixels."),
        "{out}"
    );
    assert!(
        out.contains(
            "You attached garden notes.txt (document, text/plain, 32 bytes; 32 bytes received)."
        ),
        "{out}"
    );
    assert!(
        out.contains("Its first line: \u{201c}Buy bean seeds\u{201d}"),
        "{out}"
    );
    assert!(
        out.contains("what plant is this?"),
        "the caption is the text: {out}"
    );
    assert!(
        out.contains(&format!(
            "[sent plant.png (image, image/png, {} bytes)]",
            picture.len()
        )),
        "{out}"
    );

    // (b) Each turn's file from the demo is saved under a new name, the path printed, and its
    // bytes are what the gateway offers.
    let saved = saved_paths(&out);
    assert_eq!(
        saved,
        [
            downloads.join("received (1).txt"),
            downloads.join("received (2).txt")
        ],
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(downloads.join("received.txt")).unwrap(),
        "mine"
    );
    let offered = offered_files(&gw).await;
    assert_eq!(offered.len(), 2, "{offered:?}");
    for (path, (name, bytes)) in saved.iter().zip(&offered) {
        assert_eq!(name, "received.txt");
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
    assert_eq!(
        std::fs::read(&saved[0]).unwrap(),
        format!("plant.png\timage/png\t{}\n", picture.len()).into_bytes()
    );
    // Nothing half-written is left behind.
    let names: Vec<String> = std::fs::read_dir(&downloads)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn chat_says_clearly_why_a_file_was_not_sent() {
    let dir = common::temp_data_dir();
    let cfg = common::temp_data_dir();
    let config = cfg.path().join("gateway.toml");
    std::fs::write(&config, "[limits]\nmax_media_bytes = 1000\n").unwrap();
    let _gw = Gateway::start(
        dir.path(),
        &["--demo-pace-ms", "1", "--config", config.to_str().unwrap()],
    );
    let work = common::temp_data_dir();
    let big = work.path().join("big.bin");
    std::fs::write(&big, vec![7u8; 2000]).unwrap();
    // A voice note as phones record it: Ogg with an Opus stream.
    let mut opus = b"OggS".to_vec();
    opus.resize(28, 0);
    opus.extend_from_slice(b"OpusHead");
    let note = work.path().join("note.ogg");
    std::fs::write(&note, &opus).unwrap();
    let missing = work.path().join("missing.png");
    let dl = work.path().join("dl");

    let lines = format!(
        "/attach {}\n/attach {}\n/attach\n/attach {}\n",
        missing.display(),
        big.display(),
        note.display()
    );
    let mut live = Live::start(dir.path(), &["--downloads", dl.to_str().unwrap()]);
    live.wait_for("[gateway online]", 1, Duration::from_secs(20));
    live.type_lines(&lines);
    live.wait_for("[saved received.txt", 1, Duration::from_secs(60));
    let (ok, out) = live.finish();
    assert!(ok, "chat failed:\n{out}");
    assert!(
        out.contains(&format!(
            "[cannot attach {}: no such file]",
            missing.display()
        )),
        "{out}"
    );
    assert!(
        out.contains(
            "[big.bin was not sent: the file is 2000 bytes; the limit is 1000 (limits.max_media_bytes)]"
        ),
        "{out}"
    );
    assert!(out.contains("usage: /attach PATH [caption]"), "{out}");
    // The connection is still good: the voice note went, as a voice note.
    assert!(
        out.contains("[sent note.ogg (voice, audio/ogg, 36 bytes)]"),
        "{out}"
    );
    assert!(
        out.contains("I got note.ogg without a transcript: voice needs a transcription service"),
        "{out}"
    );
    assert_eq!(saved_paths(&out), [dl.join("received.txt")], "{out}");
}

/// The peak resident memory of a process, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb * 1024
}

#[tokio::test(flavor = "current_thread")]
async fn a_large_file_from_a_phone_streams_to_disk_not_memory() {
    const SIZE: usize = 48 << 20;
    let dir = common::temp_data_dir();
    let cfg = common::temp_data_dir();
    let config = cfg.path().join("gateway.toml");
    // Uploads here are limited by the test's speed, not the gateway's byte rate.
    std::fs::write(
        &config,
        "[limits]\nbytes_per_second = 1073741824\nbyte_burst = 1073741824\n",
    )
    .unwrap();
    let gw = Gateway::start(
        dir.path(),
        &["--demo-pace-ms", "1", "--config", config.to_str().unwrap()],
    );
    let work = common::temp_data_dir();
    let dl = work.path().join("dl");

    let live = Live::start(dir.path(), &["--downloads", dl.to_str().unwrap()]);
    live.wait_for("[gateway online]", 1, Duration::from_secs(20));
    let before = peak_rss(live.child.id());

    // Another device (a phone) sends a large file into the channel the terminal shows.
    let data: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
    let phone = common::pair(dir.path(), "phone");
    let (mut c, _) = common::connect_online(&gw, &phone).await;
    let start = c
        .request(
            "media.upload.start",
            None,
            None,
            json!({"media_ref": "big", "kind": "video", "mime": "video/mp4", "size": SIZE, "filename": "clip.mp4"}),
        )
        .await;
    for piece in data.chunks(256 << 10) {
        c.send_raw_binary(piece.to_vec()).await;
    }
    let end = c
        .request(
            "media.upload.end",
            None,
            None,
            json!({"media_ref": "big", "sha256": common::sha_hex(&data)}),
        )
        .await;
    let ack = c.recv_reply(end).await;
    assert_eq!(ack["payload"]["ok"], true, "upload (start {start}): {ack}");
    c.request(
        "message.send",
        Some("default"),
        None,
        json!({"text": "a clip", "media_refs": ["big"]}),
    )
    .await;

    live.wait_for("[saved clip.mp4", 1, Duration::from_secs(60));
    live.wait_for("[saved received.txt", 1, Duration::from_secs(20));
    let peak = peak_rss(live.child.id());
    let (ok, out) = live.finish();
    assert!(ok, "{out}");
    let saved = saved_paths(&out);
    assert_eq!(saved[0], dl.join("clip.mp4"), "{out}");
    assert!(
        std::fs::read(&saved[0]).unwrap() == data,
        "the saved clip differs"
    );
    // The pull went to disk as it arrived: the client never held the file (a few chunks'
    // worth of buffers at most).
    assert!(
        peak < before + (8 << 20),
        "the client grew from {before} to {peak} bytes resident for a {SIZE}-byte file"
    );
    eprintln!(
        "chat client peak RSS: {} KiB before, {} KiB after",
        before / 1024,
        peak / 1024
    );
}
