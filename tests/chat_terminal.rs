//! `iris-gateway chat` in a real terminal (a tmux pane) against the real gateway: it opens on the
//! channel's history, shows other devices' messages, keeps going through a gateway restart
//! (the line typed meanwhile arrives exactly once), moves between channels, shows an upload's
//! progress, and exits non-zero only when its token is refused.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Gateway, Paired, BIN};
use serde_json::{json, Value};

/// A detached tmux session on a server of its own, its socket in a temporary folder (so tests
/// never touch each other's or the user's sessions, and leave nothing behind), running one
/// command; killed with its server on drop.
struct Pane {
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Pane {
    fn start(command: &str) -> Pane {
        let dir = common::temp_data_dir();
        let pane = Pane {
            socket: dir.path().join("tmux.sock"),
            _dir: dir,
        };
        pane.tmux(&[
            "-f",
            "/dev/null",
            "start-server",
            ";",
            "set-option",
            "-g",
            "history-limit",
            "20000",
            ";",
            "new-session",
            "-d",
            "-s",
            "chat",
            "-x",
            "220",
            "-y",
            "50",
            command,
        ]);
        pane
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs (the chat tests need tmux installed)");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Everything the pane shows, its scrollback included.
    fn text(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-S", "-", "-t", "chat"])
    }

    /// Types `text` and presses Enter.
    fn type_line(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "chat", "-l", text]);
        self.tmux(&["send-keys", "-t", "chat", "Enter"]);
    }

    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", "chat", keys]);
    }

    /// Polls the pane until `what` shows `times` times, failing at the deadline.
    fn wait_for(&self, what: &str, times: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let text = self.text();
            if text.matches(what).count() >= times {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what:?} not shown {times} times within {within:?}:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// The client's command line in the pane; its exit status is printed after it.
fn chat_command(data_dir: &Path, downloads: &Path) -> String {
    format!(
        "'{}' chat --data-dir '{}' --downloads '{}'; echo \"chat exited with status $?\"; exec cat",
        BIN,
        data_dir.display(),
        downloads.display()
    )
}

/// Another device sends `text` into `chat_id` and waits for its receipt.
async fn phone_says(gw: &Gateway, phone: &Paired, chat_id: &str, text: &str) {
    let (mut c, _) = common::connect_online(gw, phone).await;
    let id = c
        .request("message.send", Some(chat_id), None, json!({ "text": text }))
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(common::frame_type(&r), "read.receipt", "{r}");
    c.close().await;
}

/// The user messages of a channel's lane, as another device's `history` shows them.
async fn user_texts(gw: &Gateway, phone: &Paired, chat_id: &str) -> Vec<String> {
    let (mut c, _) = common::connect_online(gw, phone).await;
    let id = c
        .request("history", Some(chat_id), None, json!({ "limit": 200 }))
        .await;
    let r = c.recv_reply(id).await;
    c.close().await;
    r["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["text"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn chat_keeps_going_through_a_restart_and_shows_the_conversation() {
    let dir = common::temp_data_dir();
    let work = common::temp_data_dir();
    let downloads = work.path().join("dl");
    let mut gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1"]);
    let listen = format!("--listen={}", gw.addr);

    // Before the terminal opens: a message in the default channel, and a Garden channel with
    // one of its own.
    let phone = common::pair(dir.path(), "phone");
    phone_says(&gw, &phone, "default", "seeded before the terminal opened").await;
    let garden = {
        let (mut c, _) = common::connect_online(&gw, &phone).await;
        let garden = common::create_channel(&mut c, "Garden").await;
        c.close().await;
        garden
    };
    phone_says(&gw, &phone, &garden, "the tomatoes are ripe").await;

    let pane = Pane::start(&chat_command(dir.path(), &downloads));
    let long = Duration::from_secs(30);
    // (a) History on open.
    pane.wait_for("[end of history]", 1, long);
    pane.wait_for("you: seeded before the terminal opened", 1, long);

    // (b) A line sent is answered.
    pane.type_line("alpha beta");
    pane.wait_for("That is 2 words and 10 characters.", 1, long);

    // (c) Another device's message shows as it comes.
    phone_says(&gw, &phone, "default", "hello from the phone").await;
    pane.wait_for("you (another device): hello from the phone", 1, long);

    // (d) A graceful restart: the terminal says so and waits; a line typed while the gateway
    // is away is held, then sent once it is back, exactly once.
    gw.stop_ok();
    pane.wait_for("[gateway restarting]", 1, long);
    pane.wait_for("reconnecting in", 1, long);
    pane.type_line("carrots after the restart");
    pane.wait_for("[held: it goes out when the gateway is back]", 1, long);
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1", &listen]);
    pane.wait_for("[back]", 1, long);
    pane.wait_for("That is 4 words and 25 characters.", 1, long);

    // (e) A hard crash: the connection is simply gone; what comes after is not lost either.
    let mut gw = gw;
    gw.kill9();
    pane.wait_for("[connection lost", 2, long);
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1", &listen]);
    pane.wait_for("[back]", 2, long);
    phone_says(&gw, &phone, "default", "the phone after the crash").await;
    pane.wait_for("you (another device): the phone after the crash", 1, long);
    pane.type_line("one more");
    pane.wait_for("That is 2 words and 8 characters.", 1, long);

    let said = user_texts(&gw, &phone, "default").await;
    for line in [
        "alpha beta",
        "carrots after the restart",
        "one more",
        "hello from the phone",
    ] {
        assert_eq!(
            said.iter().filter(|t| *t == line).count(),
            1,
            "{line:?} must arrive exactly once: {said:?}"
        );
    }

    // (f) Channels: listed, switched to (with its history), and talked in.
    pane.type_line("/channels");
    pane.wait_for("Garden [channel]", 1, long);
    pane.type_line("/switch Garden");
    pane.wait_for("[now in Garden]", 1, long);
    pane.wait_for("you: the tomatoes are ripe", 1, long);
    pane.type_line("water them");
    pane.wait_for("That is 2 words and 10 characters.", 2, long);
    assert!(user_texts(&gw, &phone, &garden)
        .await
        .contains(&"water them".to_owned()));

    // (g) An upload shows its progress, then is sent.
    let file = work.path().join("notes.txt");
    std::fs::write(&file, "garden notes\n".repeat(30_000)).unwrap();
    pane.type_line(&format!("/attach {} my notes", file.display()));
    pane.wait_for("[sending notes.txt: 50% of 390000 bytes]", 1, long);
    pane.wait_for("[sending notes.txt: 100% of 390000 bytes]", 1, long);
    pane.wait_for(
        "[sent notes.txt (document, text/plain, 390000 bytes)]",
        1,
        long,
    );
    pane.wait_for("You attached notes.txt", 1, long);

    // (h) Ctrl-D ends it, with status 0.
    pane.keys("C-d");
    pane.wait_for("chat exited with status 0", 1, long);
    // The held line's turn ran once (its text also shows where it was typed and in the answer).
    let text = pane.text();
    assert_eq!(
        text.matches("counting words in \u{201c}carrots after the restart")
            .count(),
        1,
        "{text}"
    );
    drop(gw);
}

#[test]
fn chat_exits_non_zero_when_its_token_is_refused() {
    let dir = common::temp_data_dir();
    let work = common::temp_data_dir();
    let _gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1"]);
    let pane = Pane::start(&chat_command(dir.path(), work.path()));
    pane.wait_for("[gateway online]", 1, Duration::from_secs(30));
    pane.type_line("/quit");
    pane.wait_for("chat exited with status 0", 1, Duration::from_secs(30));

    let saved: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("chat-client.json")).unwrap(),
    )
    .unwrap();
    common::revoke(dir.path(), saved["device_id"].as_str().unwrap());
    let pane = Pane::start(&chat_command(dir.path(), work.path()));
    pane.wait_for("chat exited with status 1", 1, Duration::from_secs(30));
    let text = pane.text();
    assert!(
        text.contains("iris-gateway: the gateway refused:"),
        "{text}"
    );
}

/// Whether a connection accepted on `port` holds bytes its process has not read yet.
fn unread_bytes_on(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).any(|row| {
        let cols: Vec<&str> = row.split_whitespace().collect();
        let local_port = cols[1].rsplit(':').next().unwrap();
        let rx_queue = cols[4].rsplit(':').next().unwrap();
        u16::from_str_radix(local_port, 16) == Ok(port)
            && cols[3] == "01"
            && u64::from_str_radix(rx_queue, 16).unwrap() > 0
    })
}

fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).unwrap();
    // SAFETY: kill(2) on the test's own child process.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

#[tokio::test(flavor = "current_thread")]
async fn a_line_whose_receipt_was_lost_arrives_exactly_once() {
    let dir = common::temp_data_dir();
    let work = common::temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1"]);
    let listen = format!("--listen={}", gw.addr);
    let phone = common::pair(dir.path(), "phone");
    let pane = Pane::start(&chat_command(dir.path(), work.path()));
    let long = Duration::from_secs(30);
    pane.wait_for("[no messages here yet]", 1, long);

    // (a) Sent, never read: the gateway is frozen when the line goes out, then dies. The
    // client cannot know, so it sends the line again once back, with the same request id.
    signal(gw.pid(), libc::SIGSTOP);
    pane.type_line("never read by the first gateway");
    let deadline = Instant::now() + long;
    while !unread_bytes_on(gw.addr.port()) {
        assert!(Instant::now() < deadline, "the line never left the client");
        std::thread::sleep(Duration::from_millis(20));
    }
    gw.kill9();
    let mut gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1", &listen]);
    pane.wait_for("[sending again: never read by the first gateway]", 1, long);
    pane.wait_for("That is 6 words and 31 characters.", 1, long);

    // (b) Stored, but the gateway dies before the receipt leaves (the test hook kills it
    // after the commit is durable): the reconnect's sync replays the echo, so the line is
    // known delivered and not sent again.
    gw.stop_ok();
    let mut gw = Gateway::start_with_env(
        dir.path(),
        &["--demo-pace-ms", "1", &listen],
        &[("IRIS_GATEWAY_KILL_AT", "before-apply")],
    );
    pane.wait_for("[back]", 2, long);
    pane.type_line("stored before the crash");
    assert!(gw.wait_exit(long).is_some(), "the kill hook did not fire");
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "1", &listen]);
    pane.wait_for("[back]", 3, long);
    pane.wait_for(
        "[delivered before the connection dropped: stored before the crash]",
        1,
        long,
    );

    let said = user_texts(&gw, &phone, "default").await;
    assert_eq!(
        said,
        ["never read by the first gateway", "stored before the crash"],
        "{}",
        pane.text()
    );
    pane.type_line("/quit");
    pane.wait_for("chat exited with status 0", 1, long);
}

#[tokio::test(flavor = "current_thread")]
async fn chat_opens_on_a_busy_channel_saying_so_then_shows_the_answer() {
    let dir = common::temp_data_dir();
    let work = common::temp_data_dir();
    // A slow demo agent, so the turn is still running when the terminal opens.
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "400"]);
    let phone = common::pair(dir.path(), "phone");
    let (mut c, _) = common::connect_online(&gw, &phone).await;
    c.request(
        "message.send",
        Some("default"),
        None,
        json!({ "text": "slow one please" }),
    )
    .await;
    c.recv_until(|f| common::frame_type(f) == "typing" && f["payload"]["on"] == true)
        .await;

    let pane = Pane::start(&chat_command(dir.path(), work.path()));
    let long = Duration::from_secs(60);
    pane.wait_for("[the agent is busy answering in this channel]", 1, long);
    pane.wait_for("you: slow one please", 1, long);
    pane.wait_for("That is 3 words and 15 characters.", 1, long);
    pane.type_line("/quit");
    pane.wait_for("chat exited with status 0", 1, long);
}

#[test]
fn a_voice_note_sent_from_the_terminal_shows_it_being_transcribed() {
    let stt = common::fake_stt::FakeStt::hearing("water the beans");
    let dir = common::temp_data_dir();
    let work = common::temp_data_dir();
    let config = work.path().join("gateway.toml");
    std::fs::write(&config, format!("[transcription]\nurl = \"{}\"\n", stt.url)).unwrap();
    let _gw = Gateway::start(
        dir.path(),
        &["--demo-pace-ms", "1", "--config", config.to_str().unwrap()],
    );
    let note = work.path().join("memo.opus");
    std::fs::write(&note, vec![7u8; 3000]).unwrap();
    let pane = Pane::start(&chat_command(dir.path(), &work.path().join("dl")));
    let long = Duration::from_secs(30);
    pane.wait_for("[no messages here yet]", 1, long);
    pane.type_line(&format!("/attach {}", note.display()));
    pane.wait_for("[sent memo.opus (voice, audio/ogg, 3000 bytes)]", 1, long);
    pane.wait_for("[transcribing the voice note\u{2026}]", 1, long);
    pane.wait_for("Heard: \u{201c}water the beans", 1, long);
    assert_eq!(stt.requests().len(), 1);
    pane.type_line("/quit");
    pane.wait_for("chat exited with status 0", 1, long);
}
