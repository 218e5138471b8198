use std::path::{Path, PathBuf};

use base64::Engine;

use super::file_kind::kind_of;
use super::tags::MAX_TAG_LINE;
use super::*;

/// Everything the filter gives for `deltas`, then its end: (text, tags).
fn run(deltas: &[&str]) -> (String, Vec<Tag>) {
    let mut f = MediaTags::new(1 << 20);
    let mut pieces = Vec::new();
    for d in deltas {
        pieces.extend(f.push(d));
    }
    pieces.extend(f.finish());
    split(pieces)
}

fn split(pieces: Vec<Piece>) -> (String, Vec<Tag>) {
    let mut text = String::new();
    let mut tags = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => text.push_str(&t),
            Piece::Tag(t) => tags.push(t),
        }
    }
    (text, tags)
}

fn path(p: &str, line: bool) -> Tag {
    Tag::Path {
        path: p.into(),
        line,
    }
}

/// The text cut at every byte boundary (on char boundaries) into two deltas, and byte by
/// byte, gives what the whole text gives.
fn same_at_every_split(text: &str) -> (String, Vec<Tag>) {
    let whole = run(&[text]);
    for cut in 0..=text.len() {
        if !text.is_char_boundary(cut) {
            continue;
        }
        assert_eq!(
            run(&[&text[..cut], &text[cut..]]),
            whole,
            "cut at {cut} of {text:?}"
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(run(&refs), whole, "char by char: {text:?}");
    whole
}

#[test]
fn a_media_line_is_cut_out_at_every_split() {
    let (text, tags) = same_at_every_split("Here it is.\nMEDIA:/tmp/cat.png\nEnjoy!");
    assert_eq!(text, "Here it is.\nEnjoy!");
    assert_eq!(tags, [path("/tmp/cat.png", true)]);
}

#[test]
fn hermes_forms_of_the_tag() {
    let cases = [
        ("MEDIA: /a/b.ogg", "/a/b.ogg", ""),
        ("MEDIA:`/a/b c.png`", "/a/b c.png", ""),
        ("\"MEDIA:/a/b.pdf\" done", "/a/b.pdf", " done"),
        (
            "See MEDIA:/a/report final.pdf, ok",
            "/a/report final.pdf",
            "See , ok",
        ),
        ("MEDIA:/a/Caddyfile.", "/a/Caddyfile", ""),
        ("MEDIA:'/a/x.mp3'", "/a/x.mp3", ""),
    ];
    for (input, want_path, want_text) in cases {
        let (text, tags) = same_at_every_split(input);
        assert_eq!(text, want_text, "{input}");
        assert_eq!(tags.len(), 1, "{input}: {tags:?}");
        let Tag::Path { path, .. } = &tags[0] else {
            panic!("{input}: {tags:?}")
        };
        assert_eq!(path, want_path, "{input}");
    }
}

#[test]
fn text_without_tags_passes_unchanged_and_at_once() {
    let text = "Plain words, MEDIA without colon, ![a link](https://x.y/z.png), \
                a \"quote\" and it's [[fine]]. Ünïcödé ✓\nNext line.";
    let (out, tags) = same_at_every_split(text);
    assert_eq!(out, text);
    assert!(tags.is_empty());
    // Fed whole, nothing is held back but a trailing maybe-tag start.
    let mut f = MediaTags::new(1 << 20);
    let got = split(f.push("Hello there, friend.\nNext"));
    assert_eq!(got.0, "Hello there, friend.\nNext");
    assert_eq!(f.held(), 0);
    let got = split(f.push(" and ME"));
    assert_eq!(got.0, " and ", "a possible `MEDIA:` start waits");
    assert_eq!(f.held(), 2);
    let got = split(f.push("AT!"));
    assert_eq!(got.0, "MEAT");
    assert_eq!(f.held(), 1, "`!` may start an inline image");
}

#[test]
fn tags_in_code_and_quotes_are_text() {
    let text =
        "```\nMEDIA:/tmp/a.png\n```\n`MEDIA:/tmp/b.png`\n> MEDIA:/tmp/c.png\nMEDIA:/tmp/d.png\n";
    let (out, tags) = same_at_every_split(text);
    assert_eq!(tags, [path("/tmp/d.png", true)]);
    assert_eq!(
        out,
        "```\nMEDIA:/tmp/a.png\n```\n`MEDIA:/tmp/b.png`\n> MEDIA:/tmp/c.png\n"
    );
    // Glued to a word: not a tag.
    let (out, tags) = same_at_every_split("xMEDIA:/tmp/a.png");
    assert!(tags.is_empty());
    assert_eq!(out, "xMEDIA:/tmp/a.png");
}

#[test]
fn not_a_path_is_text() {
    for t in ["MEDIA: see below", "MEDIA:relative/x.png", "MEDIA:"] {
        let (out, tags) = same_at_every_split(t);
        assert!(tags.is_empty(), "{t}");
        assert_eq!(out, t);
    }
}

#[test]
fn inline_images_are_cut_out_at_every_split() {
    let text = "Look: ![a cat](data:image/png;base64,iVBORw0KGgo=) nice";
    let (out, tags) = same_at_every_split(text);
    assert_eq!(out, "Look:  nice");
    assert_eq!(
        tags,
        [Tag::Inline {
            alt: "a cat".into(),
            subtype: "png".into(),
            base64: "iVBORw0KGgo=".into()
        }]
    );
    let (_, tags) = same_at_every_split("![x](data:image/png;base64,AAAA");
    assert_eq!(tags, [Tag::InlineCut]);
}

#[test]
fn an_oversized_inline_image_is_dropped_as_it_comes_and_held_within_its_bound() {
    let mut f = MediaTags::new(30); // 40 base64 characters at most
    let mut pieces = f.push("a ![x](data:image/png;base64,");
    for _ in 0..100 {
        pieces.extend(f.push("AAAA"));
        assert!(f.held() <= 80, "held {}", f.held());
    }
    pieces.extend(f.push("AA==) b"));
    pieces.extend(f.finish());
    let (text, tags) = split(pieces);
    assert_eq!(text, "a  b");
    assert_eq!(tags, [Tag::InlineTooLarge]);
    // At the limit exactly: kept.
    let mut f = MediaTags::new(30);
    let (_, tags) = split(f.push(&format!("![x](data:image/png;base64,{})", "A".repeat(40))));
    assert!(matches!(tags[..], [Tag::Inline { .. }]), "{tags:?}");
}

#[test]
fn a_large_inline_image_streamed_in_small_deltas_costs_its_length_once() {
    // 3 MB of base64 in 4-byte deltas: rescanning the held data at every delta would take
    // minutes; resuming where the last delta ended takes well under a second.
    let mut f = MediaTags::new(4 << 20);
    let started = std::time::Instant::now();
    let mut pieces = f.push("See ![big](data:image/png;base64,");
    let chunk = "QUJD";
    for _ in 0..(3 << 20) / chunk.len() {
        pieces.extend(f.push(chunk));
    }
    pieces.extend(f.push(") done"));
    pieces.extend(f.finish());
    let (text, tags) = split(pieces);
    assert_eq!(text, "See  done");
    assert!(matches!(&tags[..], [Tag::Inline { base64, .. }] if base64.len() == 3 << 20));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn directives_are_hidden_and_mark_voice() {
    let mut f = MediaTags::new(1 << 20);
    let mut pieces = f.push("[[audio_");
    pieces.extend(f.push("as_voice]]\nMEDIA:/a/b.ogg\n"));
    pieces.extend(f.finish());
    let (text, tags) = split(pieces);
    assert_eq!(text, "\n");
    assert_eq!(tags, [path("/a/b.ogg", true)]);
    assert!(f.voice);
}

#[test]
fn a_held_line_is_bounded() {
    let mut f = MediaTags::new(1 << 20);
    f.push("MEDIA:/");
    for _ in 0..100 {
        f.push(&"a".repeat(100));
        assert!(f.held() <= MAX_TAG_LINE + 100);
    }
}

#[test]
fn urls_on_this_machine() {
    for (url, local) in [
        ("http://127.0.0.1:8642", true),
        ("http://localhost:8642/v1", true),
        ("http://[::1]:8642", true),
        ("http://user:pw@127.0.0.2/", true),
        ("http://studio.local:8642", false),
        ("http://192.168.1.20:8642", false),
    ] {
        assert_eq!(url_is_local(url), local, "{url}");
    }
}

#[test]
fn the_default_folders_follow_where_the_agent_runs() {
    let mut config = crate::config::Config::default();
    config.agent.backend = "hermes".into();
    config.agent.hermes_home = Some("/srv/hermes".into());
    let local = FilePolicy::from_config(&config);
    assert!(!local.remote);
    assert_eq!(local.dirs.len(), HERMES_OUTPUT_DIRS.len());
    assert!(local
        .dirs
        .contains(&PathBuf::from("/srv/hermes/cache/images")));
    assert_eq!(local.max_bytes, 32 << 20);
    config.agent.url = "http://studio.local:8642".into();
    let far = FilePolicy::from_config(&config);
    assert!(far.remote && far.dirs.is_empty());
    assert!(far.describe().contains("only images it puts inline"));
    // Folders named by the owner are read whatever the URL (a mount of the agent's files).
    config.agent.media_dirs = Some(vec!["/mnt/hermes-cache".into()]);
    let mounted = FilePolicy::from_config(&config);
    assert!(!mounted.remote);
    assert_eq!(mounted.dirs, [PathBuf::from("/mnt/hermes-cache")]);
    config.limits.max_media_bytes = 1000;
    assert_eq!(FilePolicy::from_config(&config).max_bytes, 1000);
    config.agent.media_dirs = Some(vec!["relative".into()]);
    assert!(config.validate().is_err());
}

#[test]
fn kinds_come_from_the_extension_and_image_bytes() {
    let png = &tiny_png()[..];
    assert_eq!(
        kind_of("a.png", png, false),
        ("image/png".into(), "image".into())
    );
    assert_eq!(
        kind_of("a.jpg", png, false),
        ("image/png".into(), "image".into()),
        "the bytes win for images"
    );
    // Named as images, starting like one, but not decoding to one: opaque documents.
    for (name, bytes) in [
        ("a.png", &b"not an image"[..]),
        ("a.png", &[&png[..8], &[0x42; 300][..]].concat()[..]),
        ("a.png", &png[..png.len() - 20]),
        ("a.bmp", &b"BM<html><script>alert(1)</script></html>"[..]),
        (
            "a.svg",
            &b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>"[..],
        ),
    ] {
        assert_eq!(
            kind_of(name, bytes, false),
            ("application/octet-stream".into(), "document".into()),
            "{name}: {bytes:?}"
        );
    }
    assert_eq!(kind_of("a.ogg", b"", true).1, "voice");
    assert_eq!(kind_of("a.ogg", b"", false).1, "audio");
    assert_eq!(
        kind_of("a.pdf", b"", false),
        ("application/pdf".into(), "document".into())
    );
}

fn policy(dir: &Path, max: u64) -> FilePolicy {
    FilePolicy {
        dirs: vec![dir.join("allowed")],
        max_bytes: max,
        ..FilePolicy::default()
    }
}

#[test]
fn reading_stays_inside_the_allowed_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let allowed = tmp.path().join("allowed");
    std::fs::create_dir_all(allowed.join(".ssh")).unwrap();
    std::fs::write(allowed.join("ok.txt"), b"hello").unwrap();
    std::fs::write(allowed.join("big.txt"), b"hello!").unwrap();
    std::fs::write(allowed.join(".ssh/id"), b"k").unwrap();
    std::fs::write(allowed.join(".env"), b"k").unwrap();
    std::fs::write(tmp.path().join("secret.txt"), b"s").unwrap();
    std::os::unix::fs::symlink(tmp.path().join("secret.txt"), allowed.join("out.txt")).unwrap();
    let p = policy(tmp.path(), 5);
    let at = |n: &str| allowed.join(n).display().to_string();
    let f = p.read(&at("ok.txt"), false).unwrap();
    assert_eq!(
        (f.filename.as_str(), f.bytes.as_slice(), f.kind.as_str()),
        ("ok.txt", &b"hello"[..], "document")
    );
    assert!(matches!(
        p.read(&at("big.txt"), false),
        Err(Refusal::TooLarge { size: 6, .. })
    ));
    assert!(matches!(
        p.read(&at("out.txt"), false),
        Err(Refusal::Outside(_))
    ));
    assert!(matches!(
        p.read(&at(".ssh/id"), false),
        Err(Refusal::Denied(_))
    ));
    assert!(matches!(
        p.read(&at(".env"), false),
        Err(Refusal::Denied(_))
    ));
    assert!(matches!(
        p.read(&at("gone.txt"), false),
        Err(Refusal::Missing(_))
    ));
    assert!(
        matches!(p.read(&at(""), false), Err(Refusal::Outside(_))),
        "the folder itself"
    );
    assert!(matches!(
        p.read("/etc/passwd", false),
        Err(Refusal::Outside(_))
    ));
    assert!(matches!(
        p.read("rel/x.png", false),
        Err(Refusal::NotAbsolute(_))
    ));
    let remote = FilePolicy {
        remote: true,
        ..p.clone()
    };
    assert!(matches!(
        remote.read(&at("ok.txt"), false),
        Err(Refusal::Remote(_))
    ));
    assert!(Refusal::Outside("/etc/passwd".into())
        .note()
        .starts_with("[file not sent: /etc/passwd is outside"));
}

#[test]
fn a_fifo_or_folder_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let allowed = tmp.path().join("allowed");
    std::fs::create_dir_all(allowed.join("sub")).unwrap();
    let fifo = allowed.join("pipe.ogg");
    let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let p = policy(tmp.path(), 100);
    assert!(matches!(
        p.read(&fifo.display().to_string(), false),
        Err(Refusal::NotRegular(_))
    ));
    assert!(matches!(
        p.read(&allowed.join("sub").display().to_string(), false),
        Err(Refusal::NotRegular(_))
    ));
}

/// A real 3×2 PNG.
fn tiny_png() -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgba8(image::RgbaImage::new(3, 2))
        .write_to(&mut out, image::ImageFormat::Png)
        .unwrap();
    out.into_inner()
}

#[test]
fn inline_images_decode_within_the_limit() {
    let png = tiny_png();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let p = FilePolicy {
        max_bytes: png.len() as u64,
        ..FilePolicy::default()
    };
    let f = p.inline("a cat!", &b64).unwrap();
    assert_eq!(
        (f.filename.as_str(), f.mime.as_str()),
        ("a-cat.png", "image/png")
    );
    assert_eq!(f.bytes, png);
    let smaller = FilePolicy {
        max_bytes: png.len() as u64 - 1,
        ..FilePolicy::default()
    };
    assert!(matches!(
        smaller.inline("", &b64),
        Err(Refusal::InlineTooLarge(_))
    ));
    assert!(matches!(
        p.inline("", "*not base64*"),
        Err(Refusal::InlineDamaged)
    ));
}

#[test]
fn an_inline_image_is_offered_only_when_it_decodes() {
    let p = FilePolicy {
        max_bytes: 1 << 20,
        ..FilePolicy::default()
    };
    let png = tiny_png();
    let cut = &png[..png.len() - 20];
    for bytes in [
        &b"BM<html><script>alert(1)</script></html>"[..],
        b"\x89PNG\r\n\x1a\n0123456789 junk",
        b"hello",
        cut,
    ] {
        let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
        let refusal = p.inline("x", &b64).unwrap_err();
        assert!(
            matches!(refusal, Refusal::InlineUnreadable(_)),
            "{bytes:?}: {refusal:?}"
        );
        assert!(refusal
            .note()
            .starts_with("[image not sent: an inline image could not be read"));
    }
}

#[test]
fn inline_base64_wrapped_across_lines_is_one_image() {
    let b64 = base64::engine::general_purpose::STANDARD.encode(tiny_png());
    let wrapped: Vec<String> = b64
        .as_bytes()
        .chunks(20)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    let text = format!(
        "Look: ![a](data:image/png;base64,{}\r\n\t) done",
        wrapped.join("\n")
    );
    let (out, tags) = same_at_every_split(&text);
    assert_eq!(out, "Look:  done");
    assert_eq!(
        tags,
        [Tag::Inline {
            alt: "a".into(),
            subtype: "png".into(),
            base64: b64
        }]
    );
}

#[test]
fn the_joined_filter_gives_files_and_notes_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let allowed = tmp.path().join("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::write(allowed.join("a.txt"), b"A").unwrap();
    let mut f = OutFilter::new(Arc::new(policy(tmp.path(), 100)));
    let text = format!(
        "One.\nMEDIA:{}\nTwo.\nMEDIA:/etc/passwd\nThree.",
        allowed.join("a.txt").display()
    );
    let events = f.whole(&text);
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0], AgentEvent::Text("One.\n".into()));
    assert!(matches!(&events[1], AgentEvent::File { filename, .. } if filename == "a.txt"));
    assert_eq!(
        events[2],
        AgentEvent::Text(
            "Two.\n[file not sent: /etc/passwd is outside the folders the gateway may read (agent.media_dirs)]\nThree."
                .into()
        )
    );
}

#[test]
fn a_folder_swapped_for_a_symlink_after_the_check_is_not_followed() {
    use super::policy::{open_beneath, walk_beneath, OpenError};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join("real")).unwrap();
    std::fs::create_dir_all(root.join("keys")).unwrap();
    std::fs::write(root.join("real/a.txt"), b"ok").unwrap();
    std::fs::write(root.join("keys/a.txt"), b"secret").unwrap();
    // What was checked: root/x/a.txt with x a folder; what is there at the open: a symlink.
    std::os::unix::fs::symlink(root.join("keys"), root.join("x")).unwrap();
    let swapped = root.join("x/a.txt");
    assert!(matches!(
        open_beneath(&root, &swapped),
        Err(OpenError::Symlink)
    ));
    let root_fd = || {
        std::fs::File::open(&root)
            .map(std::os::fd::OwnedFd::from)
            .unwrap()
    };
    assert!(matches!(
        walk_beneath(root_fd(), Path::new("x/a.txt")),
        Err(OpenError::Symlink)
    ));
    // The file itself a symlink: not followed either way.
    std::os::unix::fs::symlink(root.join("keys/a.txt"), root.join("real/b.txt")).unwrap();
    assert!(matches!(
        open_beneath(&root, &root.join("real/b.txt")),
        Err(OpenError::Symlink)
    ));
    assert!(matches!(
        walk_beneath(root_fd(), Path::new("real/b.txt")),
        Err(OpenError::Symlink)
    ));
    // A plain path opens both ways, to the same bytes.
    let read = |f: std::fs::File| std::io::read_to_string(f).unwrap();
    assert_eq!(
        read(open_beneath(&root, &root.join("real/a.txt")).unwrap()),
        "ok"
    );
    assert_eq!(
        read(walk_beneath(root_fd(), Path::new("real/a.txt")).unwrap()),
        "ok"
    );
}

#[test]
fn hermes_speech_is_a_voice_and_other_audio_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let allowed = tmp.path().join("allowed");
    for dir in ["cache/audio", "audio_cache", "music"] {
        std::fs::create_dir_all(allowed.join(dir)).unwrap();
    }
    std::fs::write(allowed.join("cache/audio/tts_20261207_101500.mp3"), b"ID3a").unwrap();
    std::fs::write(allowed.join("audio_cache/tts_20261207_101501.ogg"), b"OggS").unwrap();
    std::fs::write(allowed.join("cache/audio/song.mp3"), b"ID3b").unwrap();
    std::fs::write(allowed.join("music/tts_1.mp3"), b"ID3c").unwrap();
    let p = policy(tmp.path(), 100);
    let kind = |n: &str| {
        let f = p
            .read(&allowed.join(n).display().to_string(), false)
            .unwrap();
        (f.kind, f.mime)
    };
    assert_eq!(
        kind("cache/audio/tts_20261207_101500.mp3"),
        ("voice".into(), "audio/mpeg".into())
    );
    assert_eq!(
        kind("audio_cache/tts_20261207_101501.ogg"),
        ("voice".into(), "audio/ogg".into())
    );
    assert_eq!(kind("cache/audio/song.mp3").0, "audio");
    assert_eq!(kind("music/tts_1.mp3").0, "audio");
}
