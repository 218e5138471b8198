//! Mime types as the app announces them (`media.upload.start.mime`): checked against RFC 6838's
//! grammar before one is stored, because a stored mime type is later written into headers (the
//! transcription request's multipart part) and into the agent's text. The same check guards
//! those points of use, so a type stored before it existed cannot reach a header either.

/// Longest mime type accepted, parameters included (`limits.md`). RFC 6838 allows 127
/// characters for the type and for the subtype; real types with a parameter or two stay far
/// below this.
pub const MAX_MIME_BYTES: usize = 255;

/// RFC 6838 §4.2: a type or subtype name is at most 127 characters.
const MAX_NAME_BYTES: usize = 127;

/// What sends in place of a mime type that fails the check.
pub const UNKNOWN_MIME: &str = "application/octet-stream";

/// Why a mime type was refused, in words an app developer can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MimeError {
    #[error("the mime type is {0} bytes; at most {MAX_MIME_BYTES} are accepted")]
    TooLong(usize),
    #[error("the mime type contains a control character (a line break, a tab, …)")]
    Control,
    #[error("the mime type must be `type/subtype` (RFC 6838), optionally with `; name=value` parameters")]
    Shape,
    #[error("`{0}` is not a valid type or subtype name (RFC 6838: 1-127 of A-Z a-z 0-9 ! # $ & - ^ _ . +, starting with a letter or digit)")]
    Name(String),
    #[error("`{0}` is not a valid parameter (`name=value`, both of RFC 6838's name characters)")]
    Parameter(String),
}

/// Checks `mime` against RFC 6838: `type/subtype`, each a restricted name, then optional
/// `; name=value` parameters whose name and value are restricted names too (no quoted strings:
/// no audio or image type an app sends needs one). Empty is accepted: the app did not say, and
/// the gateway then treats the file as `application/octet-stream`.
pub fn check(mime: &str) -> Result<(), MimeError> {
    if mime.len() > MAX_MIME_BYTES {
        return Err(MimeError::TooLong(mime.len()));
    }
    if mime.chars().any(char::is_control) {
        return Err(MimeError::Control);
    }
    if mime.is_empty() {
        return Ok(());
    }
    let mut parts = mime.split(';');
    let essence = parts.next().unwrap_or("").trim();
    let (kind, subtype) = essence.split_once('/').ok_or(MimeError::Shape)?;
    for name in [kind, subtype] {
        if !is_restricted_name(name) {
            return Err(MimeError::Name(shown(name)));
        }
    }
    for param in parts {
        let param = param.trim();
        let ok = param
            .split_once('=')
            .is_some_and(|(k, v)| is_restricted_name(k) && is_restricted_name(v));
        if !ok {
            return Err(MimeError::Parameter(shown(param)));
        }
    }
    Ok(())
}

/// `mime` when it passes [`check`] and is not empty, else [`UNKNOWN_MIME`]: what may be written
/// into a header.
pub fn header_safe(mime: &str) -> &str {
    let mime = mime.trim();
    if mime.is_empty() || check(mime).is_err() {
        UNKNOWN_MIME
    } else {
        mime
    }
}

/// RFC 6838 §4.2 `restricted-name`: a letter or digit, then up to 126 of
/// `A-Z a-z 0-9 ! # $ & - ^ _ . +`.
fn is_restricted_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAME_BYTES
        && bytes[0].is_ascii_alphanumeric()
        && bytes[1..].iter().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#' | b'$' | b'&' | b'-' | b'^' | b'_' | b'.' | b'+'
                )
        })
}

/// A refused part as an error shows it: short and printable.
fn shown(part: &str) -> String {
    part.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_types_pass() {
        for ok in [
            "audio/ogg",
            "audio/ogg; codecs=opus",
            "image/svg+xml",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            "text/plain;charset=utf-8",
            "",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn injections_and_malformed_types_are_refused() {
        assert_eq!(
            check("audio/ogg\r\nX-Injected: yes"),
            Err(MimeError::Control)
        );
        assert_eq!(check("audio/ogg\0"), Err(MimeError::Control));
        assert_eq!(check("audio"), Err(MimeError::Shape));
        assert!(matches!(check("audio/og g"), Err(MimeError::Name(_))));
        assert!(matches!(check("audio/\"ogg\""), Err(MimeError::Name(_))));
        assert!(matches!(check("/ogg"), Err(MimeError::Name(_))));
        assert!(matches!(
            check("audio/ogg; x"),
            Err(MimeError::Parameter(_))
        ));
        assert!(matches!(
            check("audio/ogg; a=\"b\""),
            Err(MimeError::Parameter(_))
        ));
        let long_name = format!("audio/{}", "a".repeat(128));
        assert!(matches!(check(&long_name), Err(MimeError::Name(_))));
        let at_name_limit = format!("audio/{}", "a".repeat(127));
        assert_eq!(check(&at_name_limit), Ok(()));
        let too_long = format!("audio/ogg; {}", "a=b; ".repeat(60));
        assert_eq!(check(&too_long), Err(MimeError::TooLong(too_long.len())));
    }

    #[test]
    fn only_checked_types_reach_a_header() {
        assert_eq!(header_safe(" audio/ogg "), "audio/ogg");
        assert_eq!(header_safe("audio/ogg\r\nX-Injected: yes"), UNKNOWN_MIME);
        assert_eq!(header_safe(""), UNKNOWN_MIME);
    }
}
