//! Files from the phone to the agent (src/agent/media_in/, docs/media.md "Phone to agent"),
//! through the real binary, checked in what the scripted mock LLM receives: a photo reaches the
//! model as an image (as it is when small, scaled and re-encoded within
//! `limits.agent_image_side`/`agent_image_bytes` when not), a text document's content reaches
//! it up to `limits.agent_document_bytes` (one byte over: an attachment line saying so), and
//! later turns carry the photo's name, never its bytes. Against a real Hermes 0.19.0 (whose
//! mock model it takes as having no vision: its vision tool is sent the image) and the
//! OpenAI-compatible backend.

mod common;

use std::io::Cursor;
use std::path::Path;

use base64::Engine;
use common::peers::{HermesRig, MockLlm, HERMES_TURN_TIMEOUT, ONE_HERMES};
use common::{
    connect, connect_awaiting_online, frame_type, id_of, pair, pstr, temp_data_dir, typing_off,
    upload_file, Client, Gateway,
};
use image::{DynamicImage, ImageFormat};
use serde_json::{json, Value};

/// A picture with detail everywhere (so it does not compress to nothing): a gradient with a
/// little noise; `noise` 255 is pure noise.
fn picture(w: u32, h: u32, noise: u8) -> DynamicImage {
    let mut s = 0x9e37_79b9_u32;
    DynamicImage::ImageRgb8(image::RgbImage::from_fn(w, h, |x, y| {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        let n = |shift: u32| ((s >> shift) as u8) & noise;
        image::Rgb([
            ((x * 255 / w) as u8).wrapping_add(n(0)),
            ((y * 255 / h) as u8).wrapping_add(n(8)),
            128u8.wrapping_add(n(16)),
        ])
    }))
}

fn encoded(img: &DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// Sends `text` with the uploads `refs` in the default channel; the turn's `message.stop`.
async fn send(c: &mut Client, text: &str, refs: &[&str]) -> Value {
    let id = c
        .request(
            "message.send",
            Some("default"),
            None,
            json!({ "text": text, "media_refs": refs }),
        )
        .await;
    let mut stop = None;
    loop {
        let f = c.recv().await;
        if frame_type(&f) == "error" && id_of(&f) == Some(id) {
            panic!("`{text}` was refused: {f}");
        }
        if frame_type(&f) == "message.stop" {
            stop = Some(f.clone());
        }
        if typing_off(&f) {
            if let Some(stop) = stop.take() {
                return stop;
            }
        }
    }
}

/// Every `image_url` data URL in a request, decoded: (mime, bytes).
fn images_in(request: &Value) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for m in request["messages"].as_array().into_iter().flatten() {
        for part in m["content"].as_array().into_iter().flatten() {
            if part["type"] != "image_url" {
                continue;
            }
            let url = part["image_url"]["url"].as_str().unwrap_or("");
            let (header, data) = url.split_once(',').expect("a data URL");
            let mime = header
                .strip_prefix("data:")
                .and_then(|h| h.strip_suffix(";base64"))
                .expect("data:MIME;base64");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data)
                .expect("base64");
            out.push((mime.to_owned(), bytes));
        }
    }
    out
}

/// The text of a message's content: a string, or its text parts joined.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn last_user(request: &Value) -> &Value {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .expect("a user message")
}

/// Requests the mock received since `from`.
fn since(llm: &MockLlm, from: usize) -> Vec<Value> {
    llm.requests().into_iter().skip(from).collect()
}

/// An image the agent was sent, checked to be within the default limits (1568 px, 1 MiB).
fn assert_within_defaults(mime: &str, bytes: &[u8]) {
    assert_eq!(mime, "image/jpeg");
    assert!(bytes.len() <= 1 << 20, "{} bytes", bytes.len());
    let img = image::load_from_memory(bytes).expect("a JPEG");
    assert!(
        img.width().max(img.height()) <= 1568,
        "{}×{}",
        img.width(),
        img.height()
    );
}

/// A scaled image kept the original's shape.
fn assert_aspect(bytes: &[u8], w: u32, h: u32) {
    let img = image::load_from_memory(bytes).unwrap();
    let (sw, sh) = (img.width(), img.height());
    assert!(
        (i64::from(sw) * i64::from(h) - i64::from(sh) * i64::from(w)).abs() <= i64::from(w.max(h)),
        "{sw}×{sh} is not the shape of {w}×{h}"
    );
}

fn gateway_config(dir: &Path, limits: &str) -> String {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, format!("[limits]\n{limits}")).unwrap();
    path.to_str().unwrap().to_owned()
}

// ---------------------------------------------------------------------------------------------
// Hermes 0.19.0
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn hermes_a_photo_reaches_the_model_and_later_turns_carry_only_its_name() {
    let _one = ONE_HERMES.lock().await;
    let dir = temp_data_dir();
    let config = gateway_config(dir.path(), "");
    let r = HermesRig::start("", &["--config", &config], dir);
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;

    // A small photo goes as it is.
    let png = encoded(&picture(64, 48, 255), ImageFormat::Png);
    upload_file(&mut c, "m1", "image", "image/png", "plant.png", &png).await;
    let stop = send(&mut c, "what plant is this?", &["m1"]).await;
    let reqs = r.llm.requests();
    // Hermes takes the mock model as having no vision: its vision tool gets the image (an
    // auxiliary call), and the model gets the tool's description with the text.
    let with_images: Vec<&Value> = reqs.iter().filter(|q| !images_in(q).is_empty()).collect();
    assert_eq!(with_images.len(), 1, "{}", r.hermes.log_tail());
    assert_eq!(
        images_in(with_images[0]),
        [("image/png".to_owned(), png.clone())],
        "the model is sent the photo's bytes"
    );
    let aux = with_images[0];
    assert!(
        aux["tools"].is_null(),
        "a vision-tool call, not the agent's: {aux}"
    );
    assert!(text_of(&last_user(aux)["content"])
        .starts_with("Describe everything visible in this image"));
    let main = reqs.last().unwrap();
    let asked = text_of(&last_user(main)["content"]);
    assert!(
        asked.starts_with("[The user attached an image. Here's what it contains:\n"),
        "{asked}"
    );
    assert!(
        asked.ends_with("\n\nwhat plant is this?\n[image: plant.png]"),
        "{asked}"
    );
    assert!(
        pstr(&stop, "final_text").starts_with("Echo: [The user attached an image."),
        "{stop}"
    );

    // What Hermes' transcript keeps: the text parts, each image as a `[screenshot]` line.
    let sessions: Value = serde_json::from_str(&common::peers::body_text(
        ureq::get(format!("{}/api/sessions", r.hermes.url()))
            .header("Authorization", format!("Bearer {}", r.hermes.key))
            .call()
            .unwrap(),
    ))
    .unwrap();
    let sid = sessions["data"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sessions}"))
        .to_owned();
    let transcript: Value = serde_json::from_str(&common::peers::body_text(
        ureq::get(format!("{}/api/sessions/{sid}/messages", r.hermes.url()))
            .header("Authorization", format!("Bearer {}", r.hermes.key))
            .call()
            .unwrap(),
    ))
    .unwrap();
    let stored = transcript["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap();
    assert_eq!(
        stored["content"],
        "what plant is this?\n[image: plant.png]\n[screenshot]"
    );

    // The next turn: the earlier message's text (with the photo's name) is history; no image
    // is sent again.
    let before = r.llm.requests().len();
    let stop = send(&mut c, "and how often to water it?", &[]).await;
    assert_eq!(
        pstr(&stop, "final_text"),
        "Echo: and how often to water it?. I have seen 1 earlier user messages; the first was: what plant is this?\n[image: plant.png]."
    );
    assert!(since(&r.llm, before)
        .iter()
        .all(|q| images_in(q).is_empty()));

    // A large photo, alone (no text), is scaled and re-encoded within the limits, not refused.
    let big = encoded(&picture(3000, 2000, 31), ImageFormat::Png);
    assert!(big.len() > 1 << 20, "{}", big.len());
    upload_file(&mut c, "m2", "image", "image/png", "garden.png", &big).await;
    let before = r.llm.requests().len();
    send(&mut c, "", &["m2"]).await;
    let asked = text_of(&last_user(r.llm.requests().last().unwrap())["content"]);
    assert!(asked.ends_with("]\n\n[image: garden.png]"), "{asked}");
    let sent: Vec<_> = since(&r.llm, before).iter().flat_map(images_in).collect();
    assert_eq!(sent.len(), 1);
    assert_within_defaults(&sent[0].0, &sent[0].1);
    assert_aspect(&sent[0].1, 3000, 2000);
}

/// A model Hermes knows to have vision (here declared in its config.yaml, as a user of a local
/// vision model would) is sent the image parts themselves, with no vision-tool call.
#[tokio::test]
async fn hermes_a_model_with_vision_gets_the_photo_itself() {
    let _one = ONE_HERMES.lock().await;
    let vision =
        "providers:\n  custom:\n    models:\n      mock-model:\n        supports_vision: true\n";
    let r = HermesRig::start(vision, &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let jpg = encoded(&picture(64, 48, 255), ImageFormat::Jpeg);
    upload_file(&mut c, "m1", "image", "image/jpeg", "plant.jpg", &jpg).await;
    let stop = send(&mut c, "what plant is this?", &["m1"]).await;
    let reqs = r.llm.requests();
    let with_images: Vec<&Value> = reqs.iter().filter(|q| !images_in(q).is_empty()).collect();
    assert_eq!(with_images.len(), 1, "{}", r.hermes.log_tail());
    let main = with_images[0];
    assert_eq!(images_in(main), [("image/jpeg".to_owned(), jpg)]);
    assert_eq!(
        last_user(main)["content"][0],
        json!({"type": "text", "text": "what plant is this?\n[image: plant.jpg]"})
    );
    assert!(
        main["tools"].is_array(),
        "the agent's own call, not a tool's"
    );
    assert_eq!(
        pstr(&stop, "final_text"),
        "Echo: what plant is this?\n[image: plant.jpg]. I have seen 0 earlier user messages; the first was: none."
    );
}

#[tokio::test]
async fn hermes_a_text_document_is_inlined_up_to_the_limit() {
    let _one = ONE_HERMES.lock().await;
    let dir = temp_data_dir();
    let config = gateway_config(dir.path(), "");
    let r = HermesRig::start("", &["--config", &config], dir);
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;

    // Exactly agent_document_bytes (64 KiB): inlined under its name.
    let line = "a line of notes, 32 bytes long.\n";
    let at: String = line.repeat((64 << 10) / line.len());
    assert_eq!(at.len(), 64 << 10);
    upload_file(
        &mut c,
        "d1",
        "document",
        "application/octet-stream",
        "notes.md",
        at.as_bytes(),
    )
    .await;
    send(&mut c, "summarise", &["d1"]).await;
    let asked = text_of(&last_user(r.llm.requests().last().unwrap())["content"]);
    let expected = format!(
        "summarise\n[file: notes.md (application/octet-stream, 65536 bytes)]\n{}\n[end of file: notes.md]",
        at.trim_end()
    );
    assert_eq!(asked, expected);

    // One byte over: an attachment line saying why it was not read.
    let over = format!("{at}!");
    upload_file(
        &mut c,
        "d2",
        "document",
        "text/markdown",
        "more.md",
        over.as_bytes(),
    )
    .await;
    send(&mut c, "and this?", &["d2"]).await;
    let asked = text_of(&last_user(r.llm.requests().last().unwrap())["content"]);
    assert_eq!(
        asked,
        "and this?\n[attached: more.md (text/markdown, 65537 bytes): not read: larger than the 64 KiB the gateway inlines (limits.agent_document_bytes)]"
    );
}

// ---------------------------------------------------------------------------------------------
// OpenAI-compatible backend
// ---------------------------------------------------------------------------------------------

fn openai_gateway(dir: &Path, llm: &MockLlm, limits: &str) -> Gateway {
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nbackend = \"openai\"\nurl = \"{}\"\n\n[limits]\n{limits}",
            llm.url()
        ),
    )
    .unwrap();
    Gateway::start(&dir.join("data"), &["--config", config.to_str().unwrap()])
}

#[tokio::test]
async fn openai_a_photo_is_content_parts_once_and_a_name_in_history() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = openai_gateway(dir.path(), &llm, "");
    let p = pair(&dir.path().join("data"), "phone");
    let (mut c, _) = connect(&gw, &p).await;

    let png = encoded(&picture(64, 48, 255), ImageFormat::Png);
    upload_file(&mut c, "m1", "image", "image/png", "plant.png", &png).await;
    send(&mut c, "what plant is this?", &["m1"]).await;
    let req = llm.requests().pop().unwrap();
    assert_eq!(
        last_user(&req)["content"][0],
        json!({"type": "text", "text": "what plant is this?\n[image: plant.png]"})
    );
    assert_eq!(images_in(&req), [("image/png".to_owned(), png)]);

    // A large photo as a phone takes it (a 12-megapixel JPEG): scaled and re-encoded to the
    // default limits.
    let big = encoded(&picture(4000, 3000, 31), ImageFormat::Jpeg);
    assert!(big.len() > 1 << 20);
    upload_file(&mut c, "m2", "image", "image/jpeg", "garden.jpg", &big).await;
    send(&mut c, "and this?", &["m2"]).await;
    let req = llm.requests().pop().unwrap();
    let sent = images_in(&req);
    assert_eq!(sent.len(), 1, "only the new message's photo is sent");
    assert_within_defaults(&sent[0].0, &sent[0].1);
    assert_aspect(&sent[0].1, 4000, 3000);
    // History: the earlier message as text, with its photo's name.
    let users: Vec<String> = req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| text_of(&m["content"]))
        .collect();
    assert_eq!(users[0], "what plant is this?\n[image: plant.png]");
    let messages = req["messages"].as_array().unwrap();
    assert!(messages[..messages.len() - 1]
        .iter()
        .all(|m| m["content"].is_string()));

    let _ = llm.requests();
    send(&mut c, "thanks", &[]).await;
    assert!(images_in(&llm.requests().pop().unwrap()).is_empty());
}

#[tokio::test]
async fn openai_image_limits_at_and_over() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    // A PNG exactly at the byte limit, and one at the side limit.
    let at_bytes = encoded(&picture(120, 100, 255), ImageFormat::Png);
    let limits = format!(
        "agent_image_side = 200\nagent_image_bytes = {}\n",
        at_bytes.len()
    );
    let gw = openai_gateway(dir.path(), &llm, &limits);
    let p = pair(&dir.path().join("data"), "phone");
    let (mut c, _) = connect(&gw, &p).await;

    upload_file(&mut c, "a", "image", "image/png", "a.png", &at_bytes).await;
    send(&mut c, "at the byte limit", &["a"]).await;
    assert_eq!(
        images_in(&llm.requests().pop().unwrap()),
        [("image/png".to_owned(), at_bytes.clone())]
    );

    // One byte over: still sent, re-encoded smaller.
    let over_bytes = [at_bytes.as_slice(), b"\0"].concat(); // a trailing byte PNG readers skip
    upload_file(&mut c, "b", "image", "image/png", "b.png", &over_bytes).await;
    send(&mut c, "one byte over", &["b"]).await;
    let sent = images_in(&llm.requests().pop().unwrap());
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, "image/jpeg");
    assert!(sent[0].1.len() <= at_bytes.len());

    // At the side limit (and small): as it is; one pixel over: scaled down to the limit.
    let at_side = encoded(&picture(200, 20, 0), ImageFormat::Png);
    upload_file(&mut c, "c", "image", "image/png", "c.png", &at_side).await;
    send(&mut c, "at the side limit", &["c"]).await;
    assert_eq!(
        images_in(&llm.requests().pop().unwrap()),
        [("image/png".to_owned(), at_side)]
    );
    let over_side = encoded(&picture(201, 20, 0), ImageFormat::Png);
    upload_file(&mut c, "d", "image", "image/png", "d.png", &over_side).await;
    send(&mut c, "one pixel over", &["d"]).await;
    let sent = images_in(&llm.requests().pop().unwrap());
    let img = image::load_from_memory(&sent[0].1).unwrap();
    assert_eq!(sent[0].0, "image/jpeg");
    assert_eq!(img.width(), 200);

    // Not an image the gateway reads (HEIC): an attachment line, the turn goes on.
    let heic = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic";
    upload_file(&mut c, "e", "image", "image/heic", "e.heic", heic).await;
    let stop = send(&mut c, "and this", &["e"]).await;
    let req = llm.requests().pop().unwrap();
    assert!(images_in(&req).is_empty());
    assert_eq!(
        text_of(&last_user(&req)["content"]),
        "and this\n[attached: e.heic (image/heic, 24 bytes): not sent: not an image the gateway can read (it reads JPEG, PNG, WebP and GIF; HEIC and RAW are not)]"
    );
    assert!(pstr(&stop, "final_text").starts_with("Echo: and this"));
}

#[tokio::test]
async fn openai_documents_at_and_over_the_limit_and_not_text() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = openai_gateway(dir.path(), &llm, "agent_document_bytes = 1024\n");
    let p = pair(&dir.path().join("data"), "phone");
    let (mut c, _) = connect(&gw, &p).await;

    let at = "x".repeat(1023) + "\n";
    upload_file(
        &mut c,
        "a",
        "document",
        "text/plain",
        "a.txt",
        at.as_bytes(),
    )
    .await;
    send(&mut c, "at", &["a"]).await;
    assert_eq!(
        text_of(&last_user(&llm.requests().pop().unwrap())["content"]),
        format!(
            "at\n[file: a.txt (text/plain, 1024 bytes)]\n{}\n[end of file: a.txt]",
            "x".repeat(1023)
        )
    );

    let over = "y".repeat(1025);
    upload_file(
        &mut c,
        "b",
        "document",
        "application/json",
        "b.json",
        over.as_bytes(),
    )
    .await;
    send(&mut c, "over", &["b"]).await;
    assert_eq!(
        text_of(&last_user(&llm.requests().pop().unwrap())["content"]),
        "over\n[attached: b.json (application/json, 1025 bytes): not read: larger than the 1 KiB the gateway inlines (limits.agent_document_bytes)]"
    );

    upload_file(&mut c, "c", "document", "text/csv", "c.csv", b"caf\xe9;1\n").await;
    upload_file(
        &mut c,
        "d",
        "document",
        "application/pdf",
        "d.pdf",
        b"%PDF-1.4\n",
    )
    .await;
    upload_file(&mut c, "e", "voice", "audio/ogg", "e.ogg", b"OggS\0").await;
    send(&mut c, "others", &["c", "d", "e"]).await;
    assert_eq!(
        text_of(&last_user(&llm.requests().pop().unwrap())["content"]),
        "others\n[attached: c.csv (text/csv, 7 bytes): not read: not UTF-8 text]\
         \n[attached: d.pdf (application/pdf, 9 bytes): not read: not a text document or an image]\
         \n[attached: e.ogg (audio/ogg, 5 bytes): not read: the gateway sends the agent no audio]"
    );
}

/// The most the gateway may hold resident while four turns look at large photos at once.
const PEAK_MIB: u64 = 160;

/// Four channels at once, each sent the two `photos` (`w`×`h`, of type `mime`): every photo
/// reaches the model scaled to the limits, and the gateway's peak resident memory (`VmHWM`)
/// stays within [`PEAK_MIB`].
async fn four_channels_at_once(photos: &[Vec<u8>], mime: &str, (w, h): (u32, u32)) {
    use common::proc::proc_status_kib;
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    // The uploads at once: more than a phone's sustained rate.
    let gw = openai_gateway(
        dir.path(),
        &llm,
        "bytes_per_second = 100000000\nbyte_burst = 100000000\n",
    );
    let p = pair(&dir.path().join("data"), "phone");
    let (mut c, _) = connect(&gw, &p).await;
    // Eight large photos on a debug build and a shared machine: more than the usual wait for a
    // frame.
    c.timeout = std::time::Duration::from_secs(120);
    let mut chats = Vec::new();
    for n in 0..4 {
        let chat = common::create_channel(&mut c, &format!("photos {n}")).await;
        for (k, photo) in photos.iter().enumerate() {
            let r = format!("p{n}-{k}");
            upload_file(&mut c, &r, "image", mime, &format!("{r}.img"), photo).await;
        }
        chats.push(chat);
    }
    let [before] = proc_status_kib(gw.pid(), ["VmHWM"]);
    let started = std::time::Instant::now();
    for (n, chat) in chats.iter().enumerate() {
        c.request(
            "message.send",
            Some(chat),
            None,
            json!({ "text": format!("photos {n}"), "media_refs": [format!("p{n}-0"), format!("p{n}-1")] }),
        )
        .await;
    }
    let mut stops = 0;
    while stops < chats.len() {
        let f = c.recv().await;
        assert_ne!(frame_type(&f), "error", "{f}");
        stops += usize::from(frame_type(&f) == "message.stop");
    }
    let [peak] = proc_status_kib(gw.pid(), ["VmHWM"]);
    let turns: Vec<Value> = llm
        .requests()
        .into_iter()
        .filter(|r| text_of(&last_user(r)["content"]).starts_with("photos "))
        .collect();
    assert_eq!(turns.len(), 4);
    for turn in &turns {
        let sent = images_in(turn);
        assert_eq!(sent.len(), 2, "{}", text_of(&last_user(turn)["content"]));
        for (mime, bytes) in &sent {
            assert_within_defaults(mime, bytes);
            assert_aspect(bytes, w, h);
        }
    }
    eprintln!(
        "VmHWM {} MiB before the turns, {} MiB after; the turns took {:?}",
        before >> 10,
        peak >> 10,
        started.elapsed()
    );
    assert!(
        peak <= PEAK_MIB << 10,
        "peak resident memory {} MiB, over {PEAK_MIB} MiB",
        peak >> 10
    );
}

/// Raw pixels of `w`×`h` with `channels` samples, in bands of 500 rows alike (built a row at a
/// time: quick in a debug build), so they compress to little.
fn banded(w: u32, h: u32, channels: usize, tint: u8) -> Vec<u8> {
    let mut raw = Vec::with_capacity(w as usize * h as usize * channels);
    let mut row = Vec::new();
    for y in 0..h {
        if y % 500 == 0 {
            row = (0..w)
                .flat_map(|x| [(x / 500 * 20) as u8, (y / 500 * 20) as u8, tint, 200])
                .enumerate()
                .filter(|(i, _)| i % 4 < channels)
                .map(|(_, v)| v)
                .collect();
        }
        raw.extend_from_slice(&row);
    }
    raw
}

/// Four channels, each sent two 5500×5500 RGBA PNGs (a few hundred KB each, 115 MiB of pixels
/// each decoded) at once: within 160 MiB, as a PNG is scaled row by row as it is read.
#[tokio::test]
async fn openai_four_channels_of_large_photos_at_once_stay_within_160_mib() {
    const SIDE: u32 = 5500;
    let photos: Vec<Vec<u8>> = [0u8, 200]
        .into_iter()
        .map(|tint| {
            let img = image::RgbaImage::from_raw(SIDE, SIDE, banded(SIDE, SIDE, 4, tint)).unwrap();
            encoded(&DynamicImage::ImageRgba8(img), ImageFormat::Png)
        })
        .collect();
    let sizes: Vec<usize> = photos.iter().map(Vec::len).collect();
    assert!(sizes.iter().all(|n| *n < 1 << 20), "small files: {sizes:?}");
    four_channels_at_once(&photos, "image/png", (SIDE, SIDE)).await;
}

/// Four channels, each sent two 24-megapixel JPEGs (69 MiB each decoded, a JPEG is decoded
/// whole) at once: within 160 MiB, as the decodes take turns within the gateway's budget.
#[tokio::test]
async fn openai_four_channels_of_24_megapixel_jpegs_at_once_take_turns_within_160_mib() {
    const W: u32 = 6000;
    const H: u32 = 4000;
    let photos: Vec<Vec<u8>> = [0u8, 200]
        .into_iter()
        .map(|tint| {
            let mut out = Vec::new();
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 80)
                .encode(&banded(W, H, 3, tint), W, H, image::ExtendedColorType::Rgb8)
                .unwrap();
            out
        })
        .collect();
    four_channels_at_once(&photos, "image/jpeg", (W, H)).await;
}

/// A JPEG cut in half (which a lenient decoder turns into a half-grey picture) is not sent to
/// the model as an image: it is told the image is damaged, and the message stands.
#[tokio::test]
async fn openai_a_jpeg_cut_in_half_is_found_damaged() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = openai_gateway(dir.path(), &llm, "");
    let p = pair(&dir.path().join("data"), "phone");
    let (mut c, _) = connect(&gw, &p).await;
    let jpg = encoded(&picture(800, 600, 31), ImageFormat::Jpeg);
    let half = &jpg[..jpg.len() / 2];
    upload_file(&mut c, "h", "image", "image/jpeg", "half.jpg", half).await;
    let stop = send(&mut c, "what is this?", &["h"]).await;
    let req = llm.requests().pop().unwrap();
    assert!(
        images_in(&req).is_empty(),
        "the damaged photo went as an image"
    );
    let text = text_of(&last_user(&req)["content"]);
    assert!(
        text.starts_with(&format!(
            "what is this?\n[attached: half.jpg (image/jpeg, {} bytes): not sent: the image is damaged and could not be read",
            half.len()
        )),
        "{text}"
    );
    assert!(pstr(&stop, "final_text").starts_with("Echo: what is this?"));
}
