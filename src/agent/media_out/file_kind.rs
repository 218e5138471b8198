//! What a file from the agent is (mime type and media kind), from its name and its bytes.

use crate::agent::media_in::verify_image;

/// Mime type and media kind of a file: from its extension, and for images from its bytes. A file
/// named as an image is offered as one only once it decodes in full (within the photo decoder's
/// pixel limit and budget), as the type the decoder found: first bytes prove nothing (`BM` before
/// HTML, a PNG signature before junk), and a phone shows an image kind in a viewer. Anything else
/// named as an image (BMP, TIFF, SVG, damaged, too large) goes as an opaque document.
/// Blocking (a full decode): called where the file is read, on a worker thread.
pub(super) fn kind_of(filename: &str, bytes: &[u8], voice: bool) -> (String, String) {
    let ext = filename
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let by_ext = match ext.as_str() {
        "png" | "jpg" | "jpeg" | "gif" | "webp" | "bmp" | "tif" | "tiff" | "svg" => "image/*",
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
    let (mime, kind) = if by_ext == "image/*" {
        match verify_image(bytes) {
            Ok((mime, _, _)) => (mime.to_owned(), "image"),
            Err(_) => ("application/octet-stream".to_owned(), "document"),
        }
    } else if by_ext.starts_with("audio/") {
        (by_ext.to_owned(), if voice { "voice" } else { "audio" })
    } else if by_ext.starts_with("video/") {
        (by_ext.to_owned(), "video")
    } else {
        (by_ext.to_owned(), "document")
    };
    (mime, kind.to_owned())
}
