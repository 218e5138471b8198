//! Which files are text documents, and a document's content when it may be inlined.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::{human_bytes, mime_base};

/// Mime types of text that are not `text/*`.
const TEXT_MIMES: &[&str] = &[
    "application/json",
    "application/xml",
    "application/yaml",
    "application/x-yaml",
    "application/toml",
    "application/x-toml",
    "application/csv",
    "application/x-csv",
    "application/javascript",
    "application/x-javascript",
    "application/ecmascript",
    "application/typescript",
    "application/x-sh",
    "application/x-shellscript",
    "application/sql",
    "application/x-python",
    "application/x-python-code",
    "application/x-tex",
    "application/x-latex",
    "application/graphql",
    "application/x-ndjson",
    "application/x-subrip",
];

/// File name endings of text files a phone may label `application/octet-stream`.
const TEXT_EXTENSIONS: &[&str] = &[
    "txt",
    "text",
    "md",
    "markdown",
    "rst",
    "adoc",
    "org",
    "csv",
    "tsv",
    "json",
    "jsonl",
    "ndjson",
    "geojson",
    "xml",
    "yaml",
    "yml",
    "toml",
    "ini",
    "cfg",
    "conf",
    "properties",
    "env",
    "log",
    "html",
    "htm",
    "css",
    "scss",
    "js",
    "mjs",
    "cjs",
    "ts",
    "tsx",
    "jsx",
    "vue",
    "svelte",
    "py",
    "rs",
    "go",
    "c",
    "h",
    "cc",
    "cpp",
    "cxx",
    "hpp",
    "hh",
    "java",
    "kt",
    "kts",
    "swift",
    "m",
    "mm",
    "rb",
    "php",
    "pl",
    "pm",
    "lua",
    "r",
    "scala",
    "cs",
    "fs",
    "hs",
    "ex",
    "exs",
    "erl",
    "clj",
    "dart",
    "zig",
    "nim",
    "sh",
    "bash",
    "zsh",
    "fish",
    "ps1",
    "bat",
    "sql",
    "graphql",
    "proto",
    "tex",
    "bib",
    "srt",
    "vtt",
    "diff",
    "patch",
    "gradle",
    "cmake",
    "mk",
    "dockerfile",
    "tf",
    "nix",
    "ics",
    "vcf",
    "gpx",
    "svg",
];

/// File names without an extension that are text.
const TEXT_NAMES: &[&str] = &[
    "makefile",
    "dockerfile",
    "readme",
    "license",
    "changelog",
    "gemfile",
    "rakefile",
    "procfile",
    "justfile",
];

/// Whether a file is a text document, by its mime type or, failing that, its name.
pub fn is_text_like(mime: &str, filename: &str) -> bool {
    let base = mime_base(mime);
    if base.starts_with("text/")
        || TEXT_MIMES.contains(&base.as_str())
        || base.ends_with("+json")
        || base.ends_with("+xml")
        || base.ends_with("+yaml")
    {
        return true;
    }
    let name = filename.rsplit(['/', '\\']).next().unwrap_or("");
    let lower = name.to_ascii_lowercase();
    match lower.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => TEXT_EXTENSIONS.contains(&ext),
        // A dot file (`.env`, `.gitignore`) or no extension: the whole name decides.
        Some(("", rest)) => TEXT_EXTENSIONS.contains(&rest) || rest.starts_with("git"),
        _ => TEXT_NAMES.contains(&lower.as_str()),
    }
}

/// A text document's content, or why it is not inlined.
pub(super) fn read_document(path: &Path, limit: usize) -> Result<String, String> {
    let file = File::open(path).map_err(|e| format!("not read: the stored file is gone ({e})"))?;
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("not read: {e}"))?;
    if bytes.len() > limit {
        return Err(format!(
            "not read: larger than the {} the gateway inlines (limits.agent_document_bytes)",
            human_bytes(limit)
        ));
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| "not read: not UTF-8 text".to_owned())?
        .trim_start_matches('\u{feff}');
    if text.contains('\0') {
        return Err("not read: binary data, not text".to_owned());
    }
    Ok(text.to_owned())
}
