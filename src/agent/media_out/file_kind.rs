//! What a file from the agent is (mime type and media kind), from its name and its bytes.

/// The image type the bytes say, from their magic numbers.
pub(super) fn sniff_image(b: &[u8]) -> Option<&'static str> {
    Some(if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if b.starts_with(&[0xff, 0xd8, 0xff]) {
        "image/jpeg"
    } else if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        "image/gif"
    } else if b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP" {
        "image/webp"
    } else if b.starts_with(b"BM") {
        "image/bmp"
    } else if b.starts_with(b"II*\0") || b.starts_with(b"MM\0*") {
        "image/tiff"
    } else {
        return None;
    })
}

/// Mime type and media kind of a file: from its extension, and for images from its bytes
/// (a `.png` that is not an image is sent as a document, not shown as a broken picture).
pub(super) fn kind_of(filename: &str, bytes: &[u8], voice: bool) -> (String, String) {
    let ext = filename
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let by_ext = match ext.as_str() {
        "png" | "jpg" | "jpeg" | "gif" | "webp" | "bmp" | "tif" | "tiff" => "image/raster",
        "svg" => "image/svg+xml",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        "ogg" | "oga" => "audio/ogg",
        "opus" => "audio/opus",
        "m4a" => "audio/mp4",
        "flac" => "audio/flac",
        "aac" => "audio/aac",
        "mp4" | "m4v" => "video/mp4",
        "mov" => "video/quicktime",
        "avi" => "video/x-msvideo",
        "mkv" => "video/x-matroska",
        "webm" => "video/webm",
        "pdf" => "application/pdf",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "html" | "htm" => "text/html",
        "rtf" => "application/rtf",
        "epub" => "application/epub+zip",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "doc" => "application/msword",
        "xls" => "application/vnd.ms-excel",
        "ppt" => "application/vnd.ms-powerpoint",
        "odt" => "application/vnd.oasis.opendocument.text",
        "ods" => "application/vnd.oasis.opendocument.spreadsheet",
        "odp" => "application/vnd.oasis.opendocument.presentation",
        _ => "application/octet-stream",
    };
    let (mime, kind) = if by_ext == "image/raster" {
        match sniff_image(bytes) {
            Some(m) => (m.to_owned(), "image"),
            None => ("application/octet-stream".to_owned(), "document"),
        }
    } else if by_ext == "image/svg+xml" {
        (by_ext.to_owned(), "image")
    } else if by_ext.starts_with("audio/") {
        (by_ext.to_owned(), if voice { "voice" } else { "audio" })
    } else if by_ext.starts_with("video/") {
        (by_ext.to_owned(), "video")
    } else {
        (by_ext.to_owned(), "document")
    };
    (mime, kind.to_owned())
}
