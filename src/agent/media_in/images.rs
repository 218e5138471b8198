//! An image made fit for the agent: as it is when within the limits, else decoded (within
//! bounds set before decoding starts), turned upright, scaled and re-encoded until it fits.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use image::codecs::jpeg::JpegEncoder;
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

use super::{human_bytes, AgentImage, MediaLimits};

/// The most a decoded image may take in memory (its pixels, before scaling). A 24-megapixel
/// photo is 72 MB as RGB; a larger one is named in an attachment line instead of risking a
/// small board's memory with several turns decoding at once.
pub const DECODE_MAX_BYTES: u64 = 128 << 20;
/// The longest side a decoder is allowed to start on, whatever the byte count says.
const DECODE_MAX_SIDE: u32 = 16_384;
/// JPEG qualities tried at each size, best first.
const QUALITIES: [u8; 4] = [85, 75, 60, 45];
/// Below this longest side an image stops being worth sending.
const MIN_SIDE: u32 = 64;

/// An image's width and height from its header alone (cheap: nothing is decoded), for a
/// description of the file; `None` when it is not an image the gateway reads.
pub fn image_dimensions(path: &Path) -> Option<(u32, u32)> {
    ImageReader::open(path)
        .ok()?
        .with_guessed_format()
        .ok()?
        .into_dimensions()
        .ok()
}

/// An image within the limits, or why it cannot be sent.
pub(super) fn image_for_agent(
    filename: &str,
    path: &Path,
    limits: &MediaLimits,
) -> Result<AgentImage, String> {
    let file = File::open(path).map_err(|e| format!("not read: the stored file is gone ({e})"))?;
    let size = file.metadata().map(|md| md.len()).unwrap_or(u64::MAX);
    let mut reader = ImageReader::new(BufReader::new(file))
        .with_guessed_format()
        .map_err(|e| format!("not read: {e}"))?;
    let format = match reader.format() {
        Some(f @ (ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP | ImageFormat::Gif)) => f,
        Some(other) => {
            return Err(format!(
                "not sent: the gateway does not read {other:?} images (it reads JPEG, PNG, WebP and GIF)"
            ))
        }
        None => {
            return Err(
                "not sent: not an image the gateway can read (it reads JPEG, PNG, WebP and GIF; HEIC and RAW are not)"
                    .to_owned(),
            )
        }
    };
    let mut bounds = image::Limits::default();
    bounds.max_alloc = Some(DECODE_MAX_BYTES);
    bounds.max_image_width = Some(DECODE_MAX_SIDE);
    bounds.max_image_height = Some(DECODE_MAX_SIDE);
    reader.limits(bounds);
    let undecodable = |e: image::ImageError| format!("not sent: the image cannot be decoded ({e})");
    let mut decoder = reader.into_decoder().map_err(undecodable)?;
    let (width, height) = decoder.dimensions();
    if decoder.total_bytes() > DECODE_MAX_BYTES {
        return Err(format!(
            "not sent: {width}×{height} pixels is more than the gateway decodes"
        ));
    }
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    // Decoded in full even when the file goes as it is: a damaged file would make the model's
    // server refuse the whole turn.
    let mut img = DynamicImage::from_decoder(decoder).map_err(undecodable)?;
    let within = width.max(height) <= limits.image_side
        && usize::try_from(size).is_ok_and(|s| s <= limits.image_bytes)
        && orientation == Orientation::NoTransforms;
    if within {
        let bytes = std::fs::read(path).map_err(|e| format!("not read: {e}"))?;
        if bytes.len() <= limits.image_bytes {
            return Ok(AgentImage {
                filename: filename.to_owned(),
                mime: mime_of(format),
                bytes,
                width,
                height,
            });
        }
    }
    // A camera photo is stored sideways with an EXIF note; re-encoding drops the note, so the
    // pixels are turned first.
    img.apply_orientation(orientation);
    let img = flatten(img);
    shrink_to_fit(filename, img, limits)
}

fn mime_of(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Png => "image/png",
        ImageFormat::WebP => "image/webp",
        ImageFormat::Gif => "image/gif",
        _ => "image/jpeg",
    }
}

/// RGB for the JPEG encoder: transparent parts over white (what a chat shows them on).
fn flatten(img: DynamicImage) -> DynamicImage {
    if !img.color().has_alpha() {
        return DynamicImage::ImageRgb8(img.into_rgb8());
    }
    let rgba = img.into_rgba8();
    let (w, h) = rgba.dimensions();
    let rgb = image::RgbImage::from_fn(w, h, |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        let over = |c: u8| ((u16::from(c) * u16::from(a) + 255 * (255 - u16::from(a))) / 255) as u8;
        image::Rgb([over(r), over(g), over(b)])
    });
    DynamicImage::ImageRgb8(rgb)
}

/// Scales to the side limit and encodes JPEG at falling quality, then at smaller sides, until
/// the bytes fit.
fn shrink_to_fit(
    filename: &str,
    img: DynamicImage,
    limits: &MediaLimits,
) -> Result<AgentImage, String> {
    let mut side = limits.image_side.min(img.width().max(img.height()));
    let mut current = img;
    loop {
        if current.width().max(current.height()) > side {
            current = current.thumbnail(side, side);
        }
        for quality in QUALITIES {
            let mut out = Vec::new();
            JpegEncoder::new_with_quality(&mut out, quality)
                .encode_image(&current)
                .map_err(|e| format!("not sent: the image could not be re-encoded ({e})"))?;
            if out.len() <= limits.image_bytes {
                return Ok(AgentImage {
                    filename: filename.to_owned(),
                    mime: "image/jpeg",
                    bytes: out,
                    width: current.width(),
                    height: current.height(),
                });
            }
        }
        if side <= MIN_SIDE {
            return Err(format!(
                "not sent: it could not be made smaller than {} (limits.agent_image_bytes)",
                human_bytes(limits.image_bytes)
            ));
        }
        side = (side * 3 / 4).max(MIN_SIDE);
    }
}
