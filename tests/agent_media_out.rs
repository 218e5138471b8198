//! Files from the agent to the phone, through the real binary: a `MEDIA:<path>` line in the
//! answer (the way Hermes' tools name what they made) and an inline `![…](data:image/…)` image
//! become a `media.offer` tied to the assistant message, whose `media.pull` gives the file's
//! bytes, and which a device that was away gets by `sync`; no `message.update` or
//! `message.stop` carries the tag or any part of its path. Paths outside the allowed folders,
//! `/etc/passwd`, a symlink out of an allowed folder and a file over `limits.agent_file_bytes`
//! are not read: a note stands in the text instead, also when a folder is swapped for a
//! symlink to the data folder or a `.ssh` folder while the gateway reads. An inline image is
//! offered only once it decodes (its base64 may be wrapped in lines), and so is a `MEDIA:` file
//! named as an image (else it goes as an opaque document). Against a real Hermes 0.19.0 (its runs
//! API, `agent.hermes_home` giving the default folders) and the OpenAI-compatible backend
//! (`agent.media_dirs`), both on the scripted mock LLM (`[[media …]]`, `[[inline N]]`).

mod common;

use std::path::{Path, PathBuf};

use common::peers::{Hermes, MockLlm, HERMES_TURN_TIMEOUT, ONE_HERMES};
use common::{
    connect, connect_awaiting_online, dump, frame_type, pair, pstr, pull_media, sync_from,
    temp_data_dir, typing_off, Client, Gateway, Paired,
};
use serde_json::Value;
use tempfile::TempDir;

/// `limits.agent_file_bytes` in these tests: small, so "at" and "over" are cheap.
const LIMIT: usize = 4096;

/// The mock's `[[inline N]]` image: a 1x1 PNG (one that decodes) padded with zero bytes (or
/// cut) to `n` bytes.
fn inline_png(n: usize) -> Vec<u8> {
    const PNG_1X1: &str = "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489\
                           0000000b4944415478da636000020000050001e9fadcd80000000049454e44ae426082";
    let mut png: Vec<u8> = (0..PNG_1X1.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&PNG_1X1[i..i + 2], 16).unwrap())
        .collect();
    png.resize(n, 0);
    png
}

/// A config file with `agent` lines under `[agent]` and the test's file limit.
fn config(agent: &str) -> (TempDir, PathBuf) {
    config_with(agent, "")
}

/// As [`config`], with more `[limits]` lines.
fn config_with(agent: &str, limits: &str) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        format!("[agent]\n{agent}\n[limits]\nagent_file_bytes = {LIMIT}\n{limits}\n"),
    )
    .unwrap();
    (dir, path)
}

fn toml_path(p: &Path) -> String {
    serde_json::to_string(&p.display().to_string()).unwrap()
}

fn of_type<'a>(frames: &'a [Value], kind: &str) -> Vec<&'a Value> {
    frames.iter().filter(|f| frame_type(f) == kind).collect()
}

fn stop_of(frames: &[Value]) -> &Value {
    of_type(frames, "message.stop")
        .last()
        .copied()
        .unwrap_or_else(|| panic!("no message.stop in {}", dump(frames)))
}

/// No streamed or final text of the turn holds any of `parts` (the tag, the path's pieces).
fn assert_text_clean(frames: &[Value], parts: &[&str]) {
    let texts: Vec<&str> = frames
        .iter()
        .filter_map(|f| match frame_type(f) {
            "message.update" => f["payload"]["text"].as_str(),
            "message.stop" => f["payload"]["final_text"].as_str(),
            _ => None,
        })
        .collect();
    assert!(!texts.is_empty(), "no text frames: {}", dump(frames));
    let joined = texts.join("\u{1}");
    for part in parts {
        assert!(
            !joined.contains(part),
            "`{part}` reached the phone's text: {joined:?}"
        );
    }
}

/// The pieces of a path that must never show in the text.
fn pieces_of(path: &Path) -> Vec<String> {
    path.components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .filter(|n| n.len() > 3)
        .collect()
}

/// The one offer of a turn: tied to the assistant message, its bytes equal to `want`.
async fn assert_offered(
    c: &mut Client,
    frames: &[Value],
    filename: &str,
    kind: &str,
    mime: &str,
    want: &[u8],
) -> Value {
    let offers = of_type(frames, "media.offer");
    assert_eq!(offers.len(), 1, "one offer: {}", dump(frames));
    let offer = offers[0].clone();
    let stop = stop_of(frames);
    assert_eq!(
        pstr(&offer, "message_id"),
        pstr(stop, "message_id"),
        "the offer names the assistant message: {offer}"
    );
    assert_eq!(pstr(&offer, "filename"), filename, "{offer}");
    assert_eq!(pstr(&offer, "kind"), kind, "{offer}");
    assert_eq!(pstr(&offer, "mime"), mime, "{offer}");
    assert_eq!(offer["payload"]["size"], want.len(), "{offer}");
    let got = pull_media(c, pstr(&offer, "media_id")).await;
    assert!(got == want, "pulled {} bytes, not the file", got.len());
    offer
}

/// The mock's inline image (`inline_png(n)`, as `[[inline N]]` and `[[inline76 N]]` send it)
/// offered as `chart.png`, none of its tag in the text, which reads "Look:  done.".
async fn assert_inline_chart(c: &mut Client, frames: &[Value], n: usize) -> Value {
    let offer = assert_offered(c, frames, "chart.png", "image", "image/png", &inline_png(n)).await;
    assert_text_clean(frames, &["data:", "base64", "![", "iVBOR", "AAAA"]);
    assert_eq!(pstr(stop_of(frames), "final_text"), "Look:  done.");
    offer
}

/// A device that was away connects and finds the offer (and the file) by `sync`.
async fn assert_away_device_gets(gw: &Gateway, away: &Paired, offer: &Value, want: &[u8]) {
    let (mut b, _) = connect(gw, away).await;
    let (replayed, _) = sync_from(&mut b, 0).await;
    let again = replayed
        .iter()
        .find(|f| frame_type(f) == "media.offer" && pstr(f, "media_id") == pstr(offer, "media_id"))
        .unwrap_or_else(|| panic!("sync lacks the offer: {}", dump(&replayed)));
    assert_eq!(pstr(again, "message_id"), pstr(offer, "message_id"));
    assert!(pull_media(&mut b, pstr(offer, "media_id")).await == want);
}

/// Files in and around an allowed folder: `at.png` at the limit, `over.png` one byte over, a
/// file outside, and `link.png`, a symlink from inside to it.
struct Around {
    outside_dir: TempDir,
    at: PathBuf,
    over: PathBuf,
    outside: PathBuf,
    link: PathBuf,
}

fn files_around(allowed: &Path) -> Around {
    std::fs::create_dir_all(allowed).unwrap();
    let outside_dir = tempfile::tempdir().unwrap();
    let outside = outside_dir.path().join("secret.png");
    std::fs::write(&outside, inline_png(200)).unwrap();
    let at = allowed.join("at.png");
    std::fs::write(&at, inline_png(LIMIT)).unwrap();
    let over = allowed.join("over.png");
    std::fs::write(&over, inline_png(LIMIT + 1)).unwrap();
    let link = allowed.join("link.png");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    Around {
        outside_dir,
        at,
        over,
        outside,
        link,
    }
}

/// The refusals of `[[media /etc/passwd OUTSIDE LINK AT OVER]]`: one offer (the file at the
/// limit), a note for each other path, nothing of the tags in the text.
async fn assert_refusals(c: &mut Client, a: &Around) {
    let ask = format!(
        "[[media /etc/passwd {} {} {} {}]]",
        a.outside.display(),
        a.link.display(),
        a.at.display(),
        a.over.display()
    );
    let frames = c.say(&ask, typing_off).await;
    assert_offered(
        c,
        &frames,
        "at.png",
        "image",
        "image/png",
        &inline_png(LIMIT),
    )
    .await;
    let text = pstr(stop_of(&frames), "final_text").to_owned();
    for note in [
        "[file not sent: /etc/passwd is outside the folders the gateway may read (agent.media_dirs)]"
            .to_owned(),
        format!(
            "[file not sent: {} is outside the folders the gateway may read",
            a.outside.display()
        ),
        format!(
            "[file not sent: {} is outside the folders the gateway may read",
            a.link.display()
        ),
        format!(
            "[file not sent: over.png is {} bytes, over the limit of {LIMIT} (limits.agent_file_bytes)]",
            LIMIT + 1
        ),
    ] {
        assert!(text.contains(&note), "no note {note:?} in {text:?}");
    }
    assert!(
        text.starts_with("Here it is.") && text.ends_with("Enjoy."),
        "{text:?}"
    );
    assert!(!text.contains("MEDIA"), "{text:?}");
    assert!(!text.contains("at.png"), "{text:?}");
    let _ = &a.outside_dir;
}

// ---------------------------------------------------------------------------------------------
// Hermes
// ---------------------------------------------------------------------------------------------

/// Hermes on the mock, its home's default output folders allowed (`agent.hermes_home`), a
/// gateway with a phone, and a second device paired but away.
struct HermesSetup {
    _llm: MockLlm,
    hermes: Hermes,
    dir: TempDir,
    _config: TempDir,
    config: PathBuf,
    gw: Gateway,
    away: Paired,
    c: Client,
}

async fn hermes_setup() -> HermesSetup {
    let llm = MockLlm::start();
    let hermes = Hermes::start_with_config(&llm, "");
    let (config_dir, config) = config(&format!("hermes_home = {}", toml_path(hermes.home.path())));
    let dir = temp_data_dir();
    let gw = hermes.gateway(dir.path(), &["--config", config.to_str().unwrap()]);
    let p = pair(dir.path(), "phone");
    let away = pair(dir.path(), "tablet");
    let c = connect_awaiting_online(&gw, &p, HERMES_TURN_TIMEOUT).await;
    HermesSetup {
        _llm: llm,
        hermes,
        dir,
        _config: config_dir,
        config,
        gw,
        away,
        c,
    }
}

#[tokio::test]
async fn hermes_a_media_line_becomes_an_offer_for_every_device_and_never_text() {
    let _one = ONE_HERMES.lock().await;
    let mut s = hermes_setup().await;
    // Where Hermes' image generation writes (`$HERMES_HOME/cache/images`).
    let images = s.hermes.home.path().join("cache/images");
    std::fs::create_dir_all(&images).unwrap();
    let cat = images.join("cat.png");
    let bytes = inline_png(3000);
    std::fs::write(&cat, &bytes).unwrap();

    let frames =
        s.c.say(&format!("[[media {}]]", cat.display()), typing_off)
            .await;
    let offer = assert_offered(&mut s.c, &frames, "cat.png", "image", "image/png", &bytes).await;
    let mut forbidden = vec!["MEDIA".to_owned(), "cat.png".to_owned()];
    forbidden.extend(pieces_of(&cat));
    let forbidden: Vec<&str> = forbidden.iter().map(String::as_str).collect();
    assert_text_clean(&frames, &forbidden);
    assert_eq!(
        pstr(stop_of(&frames), "final_text"),
        "Here it is.\nEnjoy.",
        "{}",
        s.hermes.log_tail()
    );
    assert_away_device_gets(&s.gw, &s.away, &offer, &bytes).await;
}

#[tokio::test]
async fn hermes_paths_outside_symlinks_out_and_files_over_the_limit_are_not_read() {
    let _one = ONE_HERMES.lock().await;
    let mut s = hermes_setup().await;
    let around = files_around(&s.hermes.home.path().join("cache/audio"));
    assert_refusals(&mut s.c, &around).await;
}

#[tokio::test]
async fn hermes_an_inline_image_becomes_an_offer() {
    // What reaches the phone when Hermes runs on another machine: images inline in the answer.
    let _one = ONE_HERMES.lock().await;
    let mut s = hermes_setup().await;
    let frames = s.c.say("[[inline 700]]", typing_off).await;
    let offer = assert_inline_chart(&mut s.c, &frames, 700).await;
    assert_away_device_gets(&s.gw, &s.away, &offer, &inline_png(700)).await;
}

#[tokio::test]
async fn hermes_a_run_that_ended_while_the_gateway_was_down_still_offers_its_file() {
    let _one = ONE_HERMES.lock().await;
    let mut s = hermes_setup().await;
    let audio = s.hermes.home.path().join("cache/audio");
    std::fs::create_dir_all(&audio).unwrap();
    let memo = audio.join("memo.ogg");
    let bytes = b"OggS not really audio".to_vec();
    std::fs::write(&memo, &bytes).unwrap();
    s.c.send_text(
        Some("default"),
        None,
        &format!("[[media {}]] [[slow]]", memo.display()),
    )
    .await;
    s.c.recv_type("message.update").await;
    let addr = s.gw.addr.to_string();
    s.gw.kill9();
    // The run goes on at Hermes and ends (16 chunks, one every 0.25 s) while no gateway runs.
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    let config = s.config.to_str().unwrap().to_owned();
    let gw = s
        .hermes
        .gateway(s.dir.path(), &["--listen", &addr, "--config", &config]);
    // The restart finds the run completed and delivers its answer, with the file offered.
    let (mut b, _) = connect(&gw, &s.away).await;
    let (replayed, _) = sync_from(&mut b, 0).await;
    let reply = replayed
        .iter()
        .find(|f| frame_type(f) == "message" && f["payload"]["role"] == "assistant")
        .unwrap_or_else(|| panic!("no answer in {}\n{}", dump(&replayed), gw.output_tail()));
    assert_eq!(pstr(reply, "text"), "Here it is.\nEnjoy.", "{reply}");
    let offer = replayed
        .iter()
        .find(|f| frame_type(f) == "media.offer")
        .unwrap_or_else(|| panic!("no offer in {}", dump(&replayed)));
    assert_eq!(pstr(offer, "message_id"), pstr(reply, "message_id"));
    assert_eq!(pstr(offer, "filename"), "memo.ogg");
    assert_eq!(pstr(offer, "kind"), "audio");
    assert!(pull_media(&mut b, pstr(offer, "media_id")).await == bytes);
}

// ---------------------------------------------------------------------------------------------
// OpenAI-compatible
// ---------------------------------------------------------------------------------------------

struct OpenAiSetup {
    _llm: MockLlm,
    allowed: TempDir,
    _dir: TempDir,
    _config: TempDir,
    gw: Gateway,
    away: Paired,
    c: Client,
}

/// A gateway on `data` with the OpenAI-compatible backend on the mock and `config`.
fn openai_gateway(data: &Path, llm: &MockLlm, config: &Path) -> Gateway {
    let url = llm.url();
    Gateway::start(
        data,
        &[
            "--agent",
            "openai",
            "--agent-url",
            &url,
            "--config",
            config.to_str().unwrap(),
        ],
    )
}

async fn openai_setup() -> OpenAiSetup {
    openai_setup_with("").await
}

async fn openai_setup_with(limits: &str) -> OpenAiSetup {
    let llm = MockLlm::start();
    let allowed = tempfile::tempdir().unwrap();
    let (config_dir, config) = config_with(
        &format!("media_dirs = [{}]", toml_path(allowed.path())),
        limits,
    );
    let dir = temp_data_dir();
    let gw = openai_gateway(dir.path(), &llm, &config);
    let p = pair(dir.path(), "phone");
    let away = pair(dir.path(), "tablet");
    let (c, _) = connect(&gw, &p).await;
    OpenAiSetup {
        _llm: llm,
        allowed,
        _dir: dir,
        _config: config_dir,
        gw,
        away,
        c,
    }
}

#[tokio::test]
async fn openai_a_media_line_becomes_an_offer_for_every_device_and_never_text() {
    let mut s = openai_setup().await;
    let report = s.allowed.path().join("report.pdf");
    let bytes = b"%PDF-1.4 not really a pdf, but named one".to_vec();
    std::fs::write(&report, &bytes).unwrap();
    let frames =
        s.c.say(&format!("[[media {}]]", report.display()), typing_off)
            .await;
    let offer = assert_offered(
        &mut s.c,
        &frames,
        "report.pdf",
        "document",
        "application/pdf",
        &bytes,
    )
    .await;
    let mut forbidden = vec!["MEDIA".to_owned(), "report.pdf".to_owned()];
    forbidden.extend(pieces_of(&report));
    let forbidden: Vec<&str> = forbidden.iter().map(String::as_str).collect();
    assert_text_clean(&frames, &forbidden);
    assert_eq!(pstr(stop_of(&frames), "final_text"), "Here it is.\nEnjoy.");
    assert_away_device_gets(&s.gw, &s.away, &offer, &bytes).await;
}

#[tokio::test]
async fn openai_paths_outside_symlinks_out_and_files_over_the_limit_are_not_read() {
    let mut s = openai_setup().await;
    let around = files_around(s.allowed.path());
    assert_refusals(&mut s.c, &around).await;
}

#[tokio::test]
async fn openai_an_inline_image_becomes_an_offer_up_to_the_limit() {
    let mut s = openai_setup().await;
    let frames = s.c.say("[[inline 500]]", typing_off).await;
    let offer = assert_inline_chart(&mut s.c, &frames, 500).await;
    assert_away_device_gets(&s.gw, &s.away, &offer, &inline_png(500)).await;

    let frames = s.c.say(&format!("[[inline {LIMIT}]]"), typing_off).await;
    assert_offered(
        &mut s.c,
        &frames,
        "chart.png",
        "image",
        "image/png",
        &inline_png(LIMIT),
    )
    .await;

    let frames =
        s.c.say(&format!("[[inline {}]]", LIMIT + 1), typing_off)
            .await;
    assert!(
        of_type(&frames, "media.offer").is_empty(),
        "{}",
        dump(&frames)
    );
    assert_text_clean(&frames, &["data:", "base64", "iVBOR"]);
    assert_eq!(
        pstr(stop_of(&frames), "final_text"),
        format!(
            "Look: [image not sent: an inline image is over the limit of {LIMIT} bytes (limits.agent_file_bytes)] done."
        )
    );
}

#[tokio::test]
async fn openai_a_file_the_media_quota_cannot_hold_is_a_note_not_a_silent_loss() {
    let mut s = openai_setup_with("media_quota_bytes = 3000").await;
    let big = s.allowed.path().join("big.png");
    std::fs::write(&big, inline_png(3500)).unwrap();
    let frames =
        s.c.say(&format!("[[media {}]]", big.display()), typing_off)
            .await;
    assert!(
        of_type(&frames, "media.offer").is_empty(),
        "{}",
        dump(&frames)
    );
    let text = pstr(stop_of(&frames), "final_text");
    assert!(
        text.contains("[file not sent: big.png could not be kept: media storage is full"),
        "{text:?}"
    );
    assert!(
        text.starts_with("Here it is.") && text.ends_with("Enjoy."),
        "{text:?}"
    );
    assert!(!text.contains("MEDIA"), "{text:?}");
}

/// Swaps `at` between the folder `real` and the symlink `link` (each kept under its own name
/// while the other stands at `at`) until `stop` is set: what a `MEDIA:` path names changes
/// between the gateway's check and its open.
fn swap_until(stop: &std::sync::atomic::AtomicBool, at: &Path, real: &Path, link: &Path) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for parked in [real, link] {
            std::fs::rename(parked, at).unwrap();
            std::fs::rename(at, parked).unwrap();
        }
    }
}

#[tokio::test]
async fn openai_a_folder_swapped_for_a_symlink_never_sends_a_denied_file() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const ATTEMPTS: usize = 200;
    const PER_TURN: usize = 8;
    let llm = MockLlm::start();
    // The gateway's data folder inside the allowed folder, and a `.ssh` folder there too.
    let allowed = tempfile::tempdir().unwrap();
    let root = allowed.path().canonicalize().unwrap();
    let data = root.join("data");
    // Every offer is pulled: more frames a second than a phone sends.
    let (_config_dir, config) = config_with(
        &format!("media_dirs = [{}]", toml_path(&root)),
        "frames_per_second = 1000\nframe_burst = 1000",
    );
    let gw = openai_gateway(&data, &llm, &config);
    let p = pair(&data, "phone");
    let (mut c, _) = connect(&gw, &p).await;
    let tls_key = std::fs::read(data.join("tls/key.pem")).expect("the gateway's TLS key");
    std::fs::create_dir(root.join(".ssh")).unwrap();
    let ssh_key = b"-----BEGIN OPENSSH PRIVATE KEY----- test".to_vec();
    std::fs::write(root.join(".ssh/id_test"), &ssh_key).unwrap();
    // Harmless look-alikes the names point at between swaps.
    for (folder, file) in [("plain_tls", "key.pem"), ("plain_ssh", "id_test")] {
        std::fs::create_dir(root.join(folder)).unwrap();
        std::fs::write(root.join(folder).join(file), format!("harmless {file}")).unwrap();
    }
    std::os::unix::fs::symlink(data.join("tls"), root.join("link_tls")).unwrap();
    std::os::unix::fs::symlink(root.join(".ssh"), root.join("link_ssh")).unwrap();

    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let swappers: Vec<_> = ["tls", "ssh"]
        .into_iter()
        .map(|which| {
            let stop = stop.clone();
            let root = root.clone();
            std::thread::spawn(move || {
                swap_until(
                    &stop,
                    &root.join(format!("x_{which}")),
                    &root.join(format!("plain_{which}")),
                    &root.join(format!("link_{which}")),
                )
            })
        })
        .collect();

    let paths: Vec<String> = (0..PER_TURN)
        .map(|i| {
            let file = if i % 2 == 0 {
                "x_tls/key.pem"
            } else {
                "x_ssh/id_test"
            };
            root.join(file).display().to_string()
        })
        .collect();
    let ask = format!("[[media {}]]", paths.join(" "));
    let (mut offered, mut refused) = (0, 0);
    for _ in 0..ATTEMPTS / PER_TURN {
        let frames = c.say(&ask, typing_off).await;
        let text = pstr(stop_of(&frames), "final_text").to_owned();
        refused += text.matches("[file not sent:").count();
        for offer in of_type(&frames, "media.offer") {
            let got = pull_media(&mut c, pstr(offer, "media_id")).await;
            assert!(got != tls_key, "the gateway's TLS key reached the phone");
            assert!(got != ssh_key, "a .ssh key reached the phone");
            assert!(got.starts_with(b"harmless "), "{offer}");
            offered += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for s in swappers {
        s.join().unwrap();
    }
    // Both sides of the race were met: files read between swaps, refusals during them.
    assert_eq!(
        offered + refused,
        ATTEMPTS,
        "every path is an offer or a note"
    );
    assert!(
        offered > 0 && refused > 0,
        "{offered} offered, {refused} refused"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn openai_inline_base64_wrapped_in_lines_is_an_image_and_bytes_that_only_start_like_one_are_not(
) {
    let mut s = openai_setup().await;
    // Wrapped at 76 columns (as `base64` prints it): 3,420 bytes, 4,560 base64 characters.
    let frames = s.c.say("[[inline76 3420]]", typing_off).await;
    assert_inline_chart(&mut s.c, &frames, 3420).await;

    // A bitmap's signature before HTML, and a PNG's before junk: not images, not offered;
    // a short note, and none of their base64 in the text.
    let png_signature = b"\x89PNG\r\n\x1a\n";
    for (subtype, bytes) in [
        (
            "bmp",
            &b"BM<html><script>alert(document.cookie)</script></html>"[..],
        ),
        ("png", &[&png_signature[..], &[0x42; 300]].concat()[..]),
    ] {
        let frames =
            s.c.say(
                &format!("[[inlinehex {subtype} {}]]", hex(bytes)),
                typing_off,
            )
            .await;
        assert!(
            of_type(&frames, "media.offer").is_empty(),
            "{subtype}: {}",
            dump(&frames)
        );
        assert_text_clean(&frames, &["data:", "base64", "Qk08", "iVBOR", "QkJC"]);
        let text = pstr(stop_of(&frames), "final_text");
        assert!(
            text.starts_with("Look: [image not sent: an inline image could not be read as one: ")
                && text.ends_with("] done.")
                && text.len() < 300,
            "{text:?}"
        );
    }
}

#[tokio::test]
async fn openai_a_media_file_named_as_an_image_is_offered_as_one_only_when_it_decodes() {
    let mut s = openai_setup().await;
    // A bitmap's signature before HTML, and a PNG's before junk: a phone would show them in an
    // image viewer; they go as opaque documents, bytes unchanged. A real PNG (a 1x1 image,
    // whatever follows its end) still is an image.
    let png_signature = b"\x89PNG\r\n\x1a\n";
    let (document, image) = (
        ("document", "application/octet-stream"),
        ("image", "image/png"),
    );
    for (name, bytes, (kind, mime)) in [
        (
            "page.bmp",
            b"BM<html><script>alert(document.cookie)</script></html>".to_vec(),
            document,
        ),
        (
            "junk.png",
            [&png_signature[..], &[0x42; 300]].concat(),
            document,
        ),
        ("chart.png", inline_png(500), image),
    ] {
        let path = s.allowed.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let frames =
            s.c.say(&format!("[[media {}]]", path.display()), typing_off)
                .await;
        assert_offered(&mut s.c, &frames, name, kind, mime, &bytes).await;
    }
}
