//! An image made fit for the agent: as it is when within the limits (after a full, strict
//! decode: a damaged file is not sent), else decoded at a reduced size, turned upright and
//! re-encoded until it fits. Decoding is bounded before it starts: a pixel limit read from the
//! header, and one gateway-wide budget of decoded bytes ([`DecodeBudget`]) that every decode
//! takes its share of first, waiting its turn when other turns hold it.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Cursor, Read, Seek};
use std::path::Path;
use std::sync::{Condvar, Mutex};

use image::codecs::jpeg::JpegEncoder;
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, RgbImage};

use super::{human_bytes, AgentImage, MediaLimits};

/// Most pixels an image may have to be looked at: a larger one is named in an attachment line
/// (too large to view), never decoded. 40 megapixels covers phone cameras' full-resolution
/// modes short of their 48/50-megapixel ones.
pub const DECODE_MAX_PIXELS: u64 = 40_000_000;
/// Decoded pixels held at once, over every turn (four turns may decode together): a decode
/// that would pass it waits until earlier ones are done. A PNG is read row by row into its
/// reduced size and needs little of it; a JPEG, WebP or GIF is decoded whole first, so one whose
/// decoded size is over the whole budget is too large to view. 72 MiB holds a 24-megapixel
/// photo as RGB (69 MiB); with the gateway's own ~20 MiB it keeps the peak under 160 MiB
/// whatever the phones send (docs/media.md, "Decoding within a budget").
pub const DECODE_BUDGET_BYTES: u64 = 72 << 20;
/// The longest side a decoder is allowed to start on, whatever the pixel count says.
const DECODE_MAX_SIDE: u32 = 16_384;
/// JPEG qualities tried at each size, best first.
const QUALITIES: [u8; 4] = [85, 75, 60, 45];
/// Below this longest side an image stops being worth sending.
const MIN_SIDE: u32 = 64;

/// The gateway's one budget of decoded bytes.
static BUDGET: DecodeBudget = DecodeBudget::new(DECODE_BUDGET_BYTES);

/// A budget of bytes that decodes reserve before they allocate, first come first served.
/// Waiting blocks the caller: decodes run on turns' worker threads, never on the event loop.
pub struct DecodeBudget {
    capacity: u64,
    state: Mutex<Reserved>,
    changed: Condvar,
}

#[derive(Default)]
struct Reserved {
    in_use: u64,
    /// Tickets waiting, oldest first: only the oldest may take its share.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

/// A share of the budget, given back when dropped.
pub struct Reservation<'a> {
    budget: &'a DecodeBudget,
    bytes: u64,
}

impl DecodeBudget {
    pub(super) const fn new(capacity: u64) -> DecodeBudget {
        DecodeBudget {
            capacity,
            state: Mutex::new(Reserved {
                in_use: 0,
                queue: VecDeque::new(),
                next_ticket: 0,
            }),
            changed: Condvar::new(),
        }
    }

    /// Waits until `bytes` (at most the whole budget) are free, then holds them.
    pub(super) fn reserve(&self, bytes: u64) -> Reservation<'_> {
        let bytes = bytes.min(self.capacity);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.queue.push_back(ticket);
        while state.queue.front() != Some(&ticket) || state.in_use + bytes > self.capacity {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.queue.pop_front();
        state.in_use += bytes;
        // The next in line may fit beside this one.
        self.changed.notify_all();
        Reservation {
            budget: self,
            bytes,
        }
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(super) fn in_use(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).in_use
    }

    /// Reservations waiting now.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queue
            .len()
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut state = self.budget.state.lock().unwrap_or_else(|e| e.into_inner());
        state.in_use -= self.bytes;
        self.budget.changed.notify_all();
    }
}

/// Why an image could not be looked at.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not an image the gateway can read (it reads JPEG, PNG, WebP and GIF; HEIC and RAW are not)")]
    Unknown,
    #[error("the gateway does not read {0:?} images (it reads JPEG, PNG, WebP and GIF)")]
    Unsupported(ImageFormat),
    #[error("too large to view: {width}×{height} pixels is more than the gateway decodes ({max_mpx} megapixels, {budget_mib} MiB decoded)")]
    TooLarge {
        width: u32,
        height: u32,
        max_mpx: u64,
        budget_mib: u64,
    },
    #[error("the image is damaged and could not be read ({0})")]
    Damaged(String),
}

impl DecodeError {
    fn too_large(width: u32, height: u32) -> DecodeError {
        DecodeError::TooLarge {
            width,
            height,
            max_mpx: DECODE_MAX_PIXELS / 1_000_000,
            budget_mib: DECODE_BUDGET_BYTES >> 20,
        }
    }

    fn damaged(e: impl std::fmt::Display) -> DecodeError {
        DecodeError::Damaged(e.to_string())
    }
}

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

/// Whether `bytes` are an image the gateway reads, decoded in full within the same limits and
/// budget as a photo for the agent: its type, width and height. For images the agent puts
/// inline in its answer: one that does not decode is not offered to the phone as an image.
pub fn verify_image(bytes: &[u8]) -> Result<(&'static str, u32, u32), DecodeError> {
    let (format, width, height) = header(Cursor::new(bytes))?;
    decode_scaled(Cursor::new(bytes), format, (width, height), MIN_SIDE)?;
    Ok((mime_of(format), width, height))
}

/// An image within the limits, or why it cannot be sent.
pub(super) fn image_for_agent(
    filename: &str,
    path: &Path,
    limits: &MediaLimits,
) -> Result<AgentImage, String> {
    let open = || {
        File::open(path)
            .map(BufReader::new)
            .map_err(|e| format!("not read: the stored file is gone ({e})"))
    };
    let not_sent = |e: DecodeError| format!("not sent: {e}");
    let size = std::fs::metadata(path)
        .map(|md| md.len())
        .unwrap_or(u64::MAX);
    let (format, width, height) = header(open()?).map_err(not_sent)?;
    let fits_as_is = width.max(height) <= limits.image_side
        && usize::try_from(size).is_ok_and(|s| s <= limits.image_bytes);
    // Decoded in full even when the file goes as it is: a damaged file would make the model's
    // server refuse the whole turn (a JPEG cut short decodes leniently to grey: strictly here).
    let (img, orientation) =
        decode_scaled(open()?, format, (width, height), limits.image_side).map_err(not_sent)?;
    if fits_as_is && orientation == Orientation::NoTransforms {
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
    // pixels are turned (once small).
    let mut img = DynamicImage::ImageRgb8(img);
    img.apply_orientation(orientation);
    shrink_to_fit(filename, img, limits)
}

/// The format and size from the header, refused before any pixel is decoded when over the
/// pixel limit.
fn header(source: impl BufRead + Seek) -> Result<(ImageFormat, u32, u32), DecodeError> {
    let reader = ImageReader::new(source)
        .with_guessed_format()
        .map_err(|_| DecodeError::Unknown)?;
    let format = match reader.format() {
        Some(f @ (ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP | ImageFormat::Gif)) => {
            f
        }
        Some(other) => return Err(DecodeError::Unsupported(other)),
        None => return Err(DecodeError::Unknown),
    };
    let (width, height) = reader.into_dimensions().map_err(DecodeError::damaged)?;
    if width.max(height) > DECODE_MAX_SIDE
        || u64::from(width) * u64::from(height) > DECODE_MAX_PIXELS
    {
        return Err(DecodeError::too_large(width, height));
    }
    Ok((format, width, height))
}

/// The whole image decoded strictly, as RGB no longer than `side` (smaller images keep their
/// size), and how it should be turned. The full-size pixels exist only within the budget, and
/// never beside a converted copy: a PNG is scaled row by row as it is read; other formats are
/// decoded whole, scaled, and only then flattened to RGB.
fn decode_scaled(
    mut source: impl BufRead + Seek,
    format: ImageFormat,
    (width, height): (u32, u32),
    side: u32,
) -> Result<(RgbImage, Orientation), DecodeError> {
    if format == ImageFormat::Png {
        if let Some(done) = png_rows_scaled(&mut source, side)? {
            return Ok(done);
        }
        source.rewind().map_err(DecodeError::damaged)?;
    }
    if format == ImageFormat::Jpeg {
        return jpeg_strict(source, (width, height), side);
    }
    let mut reader = ImageReader::with_format(source, format);
    let mut bounds = image::Limits::default();
    bounds.max_alloc = Some(DECODE_BUDGET_BYTES);
    bounds.max_image_width = Some(DECODE_MAX_SIDE);
    bounds.max_image_height = Some(DECODE_MAX_SIDE);
    reader.limits(bounds);
    let mut decoder = reader.into_decoder().map_err(DecodeError::damaged)?;
    let need = decoder.total_bytes();
    if need > DECODE_BUDGET_BYTES {
        return Err(DecodeError::too_large(width, height));
    }
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let _share = BUDGET.reserve(need);
    let full = DynamicImage::from_decoder(decoder).map_err(DecodeError::damaged)?;
    Ok((flatten(smaller(full, side)), orientation))
}

/// A JPEG decoded in strict mode (the `image` crate's decoder fills a file cut short with grey
/// and calls it an image), within the budget.
fn jpeg_strict(
    mut source: impl Read,
    (width, height): (u32, u32),
    side: u32,
) -> Result<(RgbImage, Orientation), DecodeError> {
    use zune_core::bytestream::ZCursor;
    use zune_core::colorspace::ColorSpace;
    use zune_core::options::DecoderOptions;
    // The RGB output, reserved before the file is read (a decode waiting its turn holds
    // nothing); a progressive JPEG also keeps its coefficients whole until its last scan (two
    // bytes a sample, up to three samples a pixel), known once its header is read.
    let pixels = u64::from(width) * u64::from(height);
    if pixels * 3 > DECODE_BUDGET_BYTES {
        return Err(DecodeError::too_large(width, height));
    }
    let mut share = BUDGET.reserve(pixels * 3);
    let mut file = Vec::new();
    source
        .read_to_end(&mut file)
        .map_err(DecodeError::damaged)?;
    let options = DecoderOptions::default()
        .set_strict_mode(true)
        .set_max_width(DECODE_MAX_SIDE as usize)
        .set_max_height(DECODE_MAX_SIDE as usize)
        .jpeg_set_out_colorspace(ColorSpace::RGB);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(&file), options);
    decoder.decode_headers().map_err(DecodeError::damaged)?;
    if decoder.info().is_some_and(|i| i.sof.is_progressive()) {
        let need = pixels * 9;
        if need > DECODE_BUDGET_BYTES {
            return Err(DecodeError::too_large(width, height));
        }
        drop(share);
        share = BUDGET.reserve(need);
    }
    let orientation = decoder
        .exif()
        .and_then(|exif| Orientation::from_exif_chunk(exif))
        .unwrap_or(Orientation::NoTransforms);
    let decoded = decoder.decode().map_err(DecodeError::damaged)?;
    let full = RgbImage::from_raw(width, height, decoded)
        .ok_or_else(|| DecodeError::damaged("fewer pixels than its header says"))?;
    let small = flatten(smaller(DynamicImage::ImageRgb8(full), side));
    drop(share);
    Ok((small, orientation))
}

/// A non-interlaced PNG read row by row straight into RGB no longer than `side`: the rows that
/// fall in one output row are gathered and averaged into it as soon as they are read (the
/// `image` crate's area-averaging thumbnail, on `DynamicImage` so it runs as that crate is
/// built, optimised: it sees every pixel of a photo). Memory for those few rows and the result,
/// whatever the image's size. `None` for an interlaced PNG, whose rows come in seven passes
/// (the caller decodes it whole).
fn png_rows_scaled(
    source: impl BufRead + Seek,
    side: u32,
) -> Result<Option<(RgbImage, Orientation)>, DecodeError> {
    let mut decoder = png::Decoder::new(source);
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().map_err(DecodeError::damaged)?;
    let info = reader.info();
    if info.interlaced {
        return Ok(None);
    }
    let (width, height) = (info.width, info.height);
    let orientation = info
        .exif_metadata
        .as_deref()
        .and_then(Orientation::from_exif_chunk)
        .unwrap_or(Orientation::NoTransforms);
    let channels = reader.output_color_type().0.samples();
    let (out_w, out_h) = fit_within(width, height, side);
    let rows_per_band = height.div_ceil(out_h);
    let band_bytes = u64::from(width) * channels as u64 * u64::from(rows_per_band);
    let out_bytes = u64::from(out_w) * u64::from(out_h) * 3;
    let _share = BUDGET.reserve(band_bytes + out_bytes);
    let mut out = Vec::with_capacity(out_bytes as usize);
    let mut band = Vec::with_capacity(band_bytes as usize);
    let output_row = |y: u32| u64::from(y) * u64::from(out_h) / u64::from(height);
    for y in 0..height {
        let row = reader
            .next_row()
            .map_err(DecodeError::damaged)?
            .ok_or_else(|| DecodeError::damaged("fewer rows than its header says"))?;
        band.extend_from_slice(row.data());
        if y + 1 < height && output_row(y + 1) == output_row(y) {
            continue;
        }
        let rows = (band.len() / (width as usize * channels)) as u32;
        let gathered = pixels(width, rows, channels, band)?;
        let line = gathered.thumbnail_exact(out_w, 1).into_rgba8();
        for px in line.pixels() {
            let [r, g, b, a] = px.0;
            out.extend([over_white(r, a), over_white(g, a), over_white(b, a)]);
        }
        band = gathered.into_bytes();
        band.clear();
    }
    // Reads to the end of the image data: a file cut short after its last row is damaged too.
    reader.finish().map_err(DecodeError::damaged)?;
    let small = RgbImage::from_raw(out_w, out_h, out)
        .ok_or_else(|| DecodeError::damaged("fewer rows than its header says"))?;
    Ok(Some((small, orientation)))
}

/// `rows` rows of 8-bit pixels of `channels` samples as an image.
fn pixels(
    width: u32,
    rows: u32,
    channels: usize,
    raw: Vec<u8>,
) -> Result<DynamicImage, DecodeError> {
    match channels {
        1 => image::GrayImage::from_raw(width, rows, raw).map(DynamicImage::ImageLuma8),
        2 => image::GrayAlphaImage::from_raw(width, rows, raw).map(DynamicImage::ImageLumaA8),
        3 => RgbImage::from_raw(width, rows, raw).map(DynamicImage::ImageRgb8),
        4 => image::RgbaImage::from_raw(width, rows, raw).map(DynamicImage::ImageRgba8),
        _ => None,
    }
    .ok_or_else(|| DecodeError::damaged("an unexpected pixel layout"))
}

/// The size of `width`×`height` scaled to fit `side`×`side`, shape kept; unchanged when it fits.
fn fit_within(width: u32, height: u32, side: u32) -> (u32, u32) {
    let long = width.max(height);
    if long <= side {
        return (width, height);
    }
    let scale = |n: u32| {
        ((u64::from(n) * u64::from(side) + u64::from(long) / 2) / u64::from(long)).max(1) as u32
    };
    (scale(width), scale(height))
}

/// A colour channel with alpha `a`, over white (what a chat shows a transparent image on).
fn over_white(c: u8, a: u8) -> u8 {
    ((u16::from(c) * u16::from(a) + 255 * (255 - u16::from(a))) / 255) as u8
}

/// Scaled down to `side` when longer; the full-size image is dropped here.
fn smaller(img: DynamicImage, side: u32) -> DynamicImage {
    if img.width().max(img.height()) > side {
        img.thumbnail(side, side)
    } else {
        img
    }
}

fn mime_of(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Png => "image/png",
        ImageFormat::WebP => "image/webp",
        ImageFormat::Gif => "image/gif",
        _ => "image/jpeg",
    }
}

/// RGB for the JPEG encoder: transparent parts over white.
fn flatten(img: DynamicImage) -> RgbImage {
    if !img.color().has_alpha() {
        return img.into_rgb8();
    }
    let rgba = img.into_rgba8();
    let (w, h) = rgba.dimensions();
    RgbImage::from_fn(w, h, |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        image::Rgb([over_white(r, a), over_white(g, a), over_white(b, a)])
    })
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
        current = smaller(current, side);
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
