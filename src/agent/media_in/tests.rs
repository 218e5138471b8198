use std::io::Write;

use image::codecs::jpeg::JpegEncoder;
use image::{DynamicImage, ImageFormat};

use super::*;

fn media(
    name: &str,
    kind: &str,
    mime: &str,
    bytes: &[u8],
) -> (MediaRef, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    let m = MediaRef {
        media_id: "med_1".into(),
        kind: kind.into(),
        mime: mime.into(),
        size: bytes.len() as i64,
        filename: name.into(),
        message_id: None,
    };
    (m, path, dir)
}

fn one(
    text: &str,
    name: &str,
    kind: &str,
    mime: &str,
    bytes: &[u8],
    l: &MediaLimits,
) -> AgentInput {
    let (m, p, _dir) = media(name, kind, mime, bytes);
    prepare(text, &[(m, p)], &[], l)
}

fn encoded(img: &DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// A noisy picture (so it does not compress to nothing).
fn noise(w: u32, h: u32) -> DynamicImage {
    let mut s = 0x2545_f491_u32;
    DynamicImage::ImageRgb8(image::RgbImage::from_fn(w, h, |_, _| {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        image::Rgb([s as u8, (s >> 8) as u8, (s >> 16) as u8])
    }))
}

#[test]
fn a_small_image_goes_as_it_is() {
    let png = encoded(&noise(40, 30), ImageFormat::Png);
    let got = one(
        "what is it?",
        "p.png",
        "image",
        "image/png",
        &png,
        &MediaLimits::default(),
    );
    assert_eq!(got.text, "what is it?\n[image: p.png]");
    assert_eq!(got.images.len(), 1);
    assert_eq!(got.images[0].bytes, png);
    assert_eq!(got.images[0].mime, "image/png");
    assert!(got.images[0]
        .data_url()
        .starts_with("data:image/png;base64,iVBOR"));
}

#[test]
fn the_type_comes_from_the_bytes_not_the_claim() {
    let jpg = encoded(&noise(20, 20), ImageFormat::Jpeg);
    let got = one(
        "",
        "x.png",
        "image",
        "image/png",
        &jpg,
        &MediaLimits::default(),
    );
    assert_eq!(got.images[0].mime, "image/jpeg");
}

#[test]
fn a_large_image_is_scaled_and_reencoded_within_both_limits() {
    let l = MediaLimits {
        image_side: 100,
        image_bytes: 6_000,
        document_bytes: 10,
    };
    let png = encoded(&noise(400, 200), ImageFormat::Png);
    let got = one("", "big.png", "image", "image/png", &png, &l);
    let img = &got.images[0];
    assert_eq!(img.mime, "image/jpeg");
    assert!(img.bytes.len() <= 6_000, "{}", img.bytes.len());
    let back = image::load_from_memory(&img.bytes).unwrap();
    assert!(back.width().max(back.height()) <= 100);
    assert_eq!(back.width(), 2 * back.height(), "the aspect ratio is kept");
    assert_eq!((img.width, img.height), (back.width(), back.height()));
}

#[test]
fn a_photo_stored_sideways_is_turned_upright() {
    use image::ImageEncoder;
    // EXIF (TIFF, big-endian) with one entry: Orientation (0x0112) = 6, turn 90° clockwise.
    let exif = [
        b"MM\0*\0\0\0\x08\0\x01".as_slice(),
        &[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0],
        &[0, 0, 0, 0],
    ]
    .concat();
    let img = noise(40, 20);
    let mut jpg = Vec::new();
    let mut enc = JpegEncoder::new_with_quality(&mut jpg, 90);
    enc.set_exif_metadata(exif).unwrap();
    enc.write_image(img.as_bytes(), 40, 20, image::ExtendedColorType::Rgb8)
        .unwrap();
    let got = one(
        "",
        "side.jpg",
        "image",
        "image/jpeg",
        &jpg,
        &MediaLimits::default(),
    );
    let sent = &got.images[0];
    assert_ne!(
        sent.bytes, jpg,
        "re-encoded, so the EXIF note is not needed"
    );
    assert_eq!((sent.width, sent.height), (20, 40));
}

#[test]
fn every_format_the_agent_takes_goes_as_it_is() {
    let img = noise(30, 20);
    for (format, mime) in [
        (ImageFormat::Png, "image/png"),
        (ImageFormat::Jpeg, "image/jpeg"),
        (ImageFormat::WebP, "image/webp"),
        (ImageFormat::Gif, "image/gif"),
    ] {
        let bytes = encoded(&img, format);
        let got = one(
            "",
            "x",
            "image",
            "application/octet-stream",
            &bytes,
            &MediaLimits::default(),
        );
        assert_eq!(got.images.len(), 1, "{format:?}: {}", got.text);
        assert_eq!((got.images[0].mime, &got.images[0].bytes), (mime, &bytes));
    }
}

#[test]
fn an_image_at_the_byte_limit_goes_as_it_is_and_one_byte_less_is_reencoded() {
    let png = encoded(&noise(60, 60), ImageFormat::Png);
    let at = MediaLimits {
        image_bytes: png.len(),
        ..MediaLimits::default()
    };
    assert_eq!(
        one("", "a.png", "image", "image/png", &png, &at).images[0].bytes,
        png
    );
    let under = MediaLimits {
        image_bytes: png.len() - 1,
        ..MediaLimits::default()
    };
    let got = one("", "a.png", "image", "image/png", &png, &under);
    assert_eq!(got.images[0].mime, "image/jpeg");
    assert!(got.images[0].bytes.len() < png.len());
}

#[test]
fn an_image_that_cannot_fit_is_an_attachment_line() {
    let l = MediaLimits {
        image_side: 1568,
        image_bytes: 100,
        document_bytes: 10,
    };
    let png = encoded(&noise(300, 300), ImageFormat::Png);
    let got = one("hi", "n.png", "image", "image/png", &png, &l);
    assert!(got.images.is_empty());
    assert!(
        got.text
            .contains("could not be made smaller than 100 bytes"),
        "{}",
        got.text
    );
}

#[test]
fn alpha_is_flattened_over_white() {
    let clear = DynamicImage::ImageRgba8(image::RgbaImage::from_pixel(
        300,
        300,
        image::Rgba([0, 0, 0, 0]),
    ));
    let png = encoded(&clear, ImageFormat::Png);
    let l = MediaLimits {
        image_side: 100,
        ..MediaLimits::default()
    };
    let got = one("", "c.png", "image", "image/png", &png, &l);
    let back = image::load_from_memory(&got.images[0].bytes)
        .unwrap()
        .into_rgb8();
    assert!(back.get_pixel(50, 50).0.iter().all(|c| *c > 245));
}

#[test]
fn undecodable_images_are_attachment_lines_saying_why() {
    let l = MediaLimits::default();
    // HEIC: an ISO box header no decoder here reads.
    let heic = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic";
    let got = one("look", "p.heic", "image", "image/heic", heic, &l);
    assert!(got.images.is_empty());
    assert_eq!(
        got.text,
        "look\n[attached: p.heic (image/heic, 24 bytes): not sent: not an image the gateway can read (it reads JPEG, PNG, WebP and GIF; HEIC and RAW are not)]"
    );
    // A PNG cut short: the header reads, the pixels do not.
    let png = encoded(&noise(50, 50), ImageFormat::Png);
    let got = one(
        "",
        "cut.png",
        "image",
        "image/png",
        &png[..png.len() / 2],
        &l,
    );
    assert!(got.images.is_empty());
    assert!(
        got.text
            .contains("not sent: the image is damaged and could not be read"),
        "{}",
        got.text
    );
    // A format the gateway knows of but does not decode.
    let bmp = b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0\x28\0\0\0";
    let got = one("", "x.bmp", "image", "image/bmp", bmp, &l);
    assert!(
        got.text.contains("does not read Bmp images"),
        "{}",
        got.text
    );
}

#[test]
fn a_huge_image_is_refused_before_it_is_decoded() {
    // A PNG claiming 16000×16000 RGBA (1 GB of pixels), with no pixel data.
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&16_000u32.to_be_bytes());
    ihdr.extend_from_slice(&16_000u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    for (kind, data) in [(&b"IHDR"[..], &ihdr[..]), (b"IDAT", b""), (b"IEND", b"")] {
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let chunk = [kind, data].concat();
        png.extend_from_slice(&chunk);
        png.extend_from_slice(&crc32(&chunk).to_be_bytes());
    }
    let got = one(
        "",
        "huge.png",
        "image",
        "image/png",
        &png,
        &MediaLimits::default(),
    );
    assert!(got.images.is_empty());
    assert!(
        got.text
            .contains("16000×16000 pixels is more than the gateway decodes"),
        "{}",
        got.text
    );
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in data {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn text_documents_are_inlined_under_their_name_up_to_the_limit() {
    let l = MediaLimits {
        document_bytes: 12,
        ..MediaLimits::default()
    };
    let got = one(
        "read this",
        "notes.md",
        "document",
        "application/octet-stream",
        b"# Title\nbody\n",
        &l,
    );
    assert!(
        got.text.contains("[attached: notes.md"),
        "13 bytes is over 12: {}",
        got.text
    );
    assert!(got
        .text
        .contains("larger than the 12 bytes the gateway inlines"));
    let got = one(
        "read this",
        "notes.md",
        "document",
        "application/octet-stream",
        b"# Title\nbody",
        &l,
    );
    assert_eq!(
        got.text,
        "read this\n[file: notes.md (application/octet-stream, 12 bytes)]\n# Title\nbody\n[end of file: notes.md]"
    );
}

#[test]
fn text_that_is_not_utf8_or_has_nul_is_not_inlined() {
    let l = MediaLimits::default();
    let got = one("", "latin1.txt", "document", "text/plain", b"caf\xe9", &l);
    assert!(
        got.text
            .ends_with("latin1.txt (text/plain, 4 bytes): not read: not UTF-8 text]"),
        "{}",
        got.text
    );
    let got = one("", "x.json", "document", "application/json", b"{\0}", &l);
    assert!(got.text.contains("not read: binary data"), "{}", got.text);
    // A byte-order mark is not content.
    let got = one(
        "",
        "b.txt",
        "document",
        "text/plain",
        "\u{feff}hi".as_bytes(),
        &l,
    );
    assert!(
        got.text.contains("]\nhi\n[end of file: b.txt]"),
        "{}",
        got.text
    );
}

#[test]
fn what_counts_as_text() {
    for (mime, name) in [
        ("text/plain", "a"),
        ("text/csv; charset=utf-8", "a"),
        ("application/json", "a"),
        ("application/vnd.api+json", "a"),
        ("application/octet-stream", "main.RS"),
        ("application/octet-stream", "data.yaml"),
        ("", "Makefile"),
        ("", ".env"),
        ("", ".gitignore"),
        ("image/svg+xml", "logo.svg"),
    ] {
        assert!(is_text_like(mime, name), "{mime} {name}");
    }
    for (mime, name) in [
        ("application/pdf", "doc.pdf"),
        ("application/octet-stream", "archive.zip"),
        ("image/png", "p.png"),
        ("application/octet-stream", "md"),
        ("audio/ogg", "voice.ogg"),
    ] {
        assert!(!is_text_like(mime, name), "{mime} {name}");
    }
}

#[test]
fn audio_video_and_other_files_are_attachment_lines() {
    let l = MediaLimits::default();
    let got = one("", "v.ogg", "voice", "audio/ogg", b"OggS", &l);
    assert_eq!(
        got.text,
        "[attached: v.ogg (audio/ogg, 4 bytes): not read: the gateway sends the agent no audio]"
    );
    let got = one("", "c.mp4", "video", "video/mp4", b"....", &l);
    assert!(got
        .text
        .ends_with("not read: the gateway sends the agent no video]"));
    let got = one("", "d.pdf", "document", "application/pdf", b"%PDF", &l);
    assert!(got
        .text
        .ends_with("not read: not a text document or an image]"));
}

#[test]
fn a_message_s_images_share_one_budget() {
    let l = MediaLimits::default();
    let png = encoded(&noise(580, 580), ImageFormat::Png);
    assert!(png.len() <= l.image_bytes && png.len() * 7 > TURN_IMAGE_BYTES);
    let files: Vec<_> = (0..7)
        .map(|i| media(&format!("{i}.png"), "image", "image/png", &png))
        .collect();
    let refs: Vec<_> = files
        .iter()
        .map(|(m, p, _)| (m.clone(), p.clone()))
        .collect();
    let got = prepare("", &refs, &[], &l);
    assert_eq!(got.images.len(), TURN_IMAGE_BYTES / png.len());
    assert!(
        got.text
            .contains("over the 6 MiB the agent is sent at once"),
        "{}",
        got.text
    );
}

#[test]
fn history_names_files_without_their_contents() {
    let (img, _, _d1) = media("p.png", "image", "image/png", b"x");
    let (doc, _, _d2) = media("n.txt", "document", "text/plain", b"y");
    assert_eq!(
        history_text("see", &[img, doc]),
        "see\n[image: p.png]\n[attached: n.txt (text/plain, 1 bytes)]"
    );
    let (img, _, _d3) = media("p.png", "image", "image/png", b"x");
    assert_eq!(history_text("", &[img]), "[image: p.png]");
}

#[test]
fn dimensions_come_from_the_header() {
    let (_, p, _d) = media(
        "p.png",
        "image",
        "image/png",
        &encoded(&noise(7, 5), ImageFormat::Png),
    );
    assert_eq!(image_dimensions(&p), Some((7, 5)));
    let (_, p, _d) = media("t.txt", "document", "text/plain", b"hello");
    assert_eq!(image_dimensions(&p), None);
}

#[test]
fn a_jpeg_cut_short_is_damaged_not_an_image() {
    let jpg = encoded(&noise(64, 64), ImageFormat::Jpeg);
    let half = &jpg[..jpg.len() / 2];
    // What the lenient decoder makes of it: a picture, grey where the data ran out.
    assert!(image::load_from_memory(half).is_ok());
    let got = one(
        "see",
        "cut.jpg",
        "image",
        "image/jpeg",
        half,
        &MediaLimits::default(),
    );
    assert!(got.images.is_empty(), "{}", got.text);
    assert!(
        got.text.starts_with(&format!(
            "see\n[attached: cut.jpg (image/jpeg, {} bytes): not sent: the image is damaged and could not be read",
            half.len()
        )),
        "{}",
        got.text
    );
    // And whole, it goes as it is.
    let got = one(
        "",
        "ok.jpg",
        "image",
        "image/jpeg",
        &jpg,
        &MediaLimits::default(),
    );
    assert_eq!(got.images[0].bytes, jpg);
}

#[test]
fn a_large_png_is_scaled_as_it_is_read_and_keeps_its_shape_and_colour() {
    // Two halves, red over blue, with a transparent band at the bottom (over white).
    let img = image::RgbaImage::from_fn(3000, 2000, |_, y| match y {
        0..1000 => image::Rgba([255, 0, 0, 255]),
        1000..1900 => image::Rgba([0, 0, 255, 255]),
        _ => image::Rgba([0, 0, 0, 0]),
    });
    let png = encoded(&DynamicImage::ImageRgba8(img), ImageFormat::Png);
    let l = MediaLimits {
        image_side: 300,
        ..MediaLimits::default()
    };
    let got = one("", "big.png", "image", "image/png", &png, &l);
    let sent = &got.images[0];
    assert_eq!((sent.width, sent.height), (300, 200), "{}", got.text);
    let back = image::load_from_memory(&sent.bytes).unwrap().into_rgb8();
    let near = |p: [u8; 3], want: [u8; 3]| p.iter().zip(want).all(|(a, b)| a.abs_diff(b) < 40);
    assert!(near(back.get_pixel(150, 50).0, [255, 0, 0]));
    assert!(near(back.get_pixel(150, 150).0, [0, 0, 255]));
    assert!(near(back.get_pixel(150, 197).0, [255, 255, 255]));
}

#[test]
fn decodes_wait_their_turn_within_the_budget() {
    use std::sync::mpsc;
    static BUDGET: images::DecodeBudget = images::DecodeBudget::new(100);
    let first = BUDGET.reserve(70);
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let share = BUDGET.reserve(50);
        tx.send(BUDGET.in_use()).unwrap();
        drop(share);
    });
    // 70 + 50 is over 100: the second queues (it checks under the lock it queued under, so
    // once it is seen queued it is waiting) until the first gives its share back.
    while BUDGET.waiting() == 0 {
        std::thread::yield_now();
    }
    assert!(rx.try_recv().is_err());
    assert_eq!(BUDGET.in_use(), 70);
    drop(first);
    assert_eq!(rx.recv().unwrap(), 50);
    waiter.join().unwrap();
    assert_eq!(BUDGET.in_use(), 0);
    // More than the whole budget takes the whole budget, and still runs.
    drop(BUDGET.reserve(1_000));
}
