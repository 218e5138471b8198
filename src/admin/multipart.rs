//! `multipart/form-data` bodies, for the one form that carries a file (the Push page's FCM
//! key): the whole body is already read and bounded by `limits.admin_max_form_bytes`, so this
//! only splits it into fields. Files are taken as text (a key is JSON); anything else refuses.

use super::Form;

/// The boundary a `Content-Type` header names, if it is a multipart form's.
pub(super) fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        let v = v.trim().trim_matches('"');
        (k.trim().eq_ignore_ascii_case("boundary") && !v.is_empty() && v.len() <= 70)
            .then(|| v.to_owned())
    })
}

/// The fields of a multipart body; `None` if it is not one, or a part is not UTF-8.
pub(super) fn parse(body: &[u8], boundary: &str) -> Option<Form> {
    let body = std::str::from_utf8(body).ok()?;
    let delimiter = format!("--{boundary}");
    let mut parts = body.split(delimiter.as_str());
    // What comes before the first delimiter is a preamble, ignored.
    parts.next()?;
    let mut fields = Vec::new();
    let mut closed = false;
    for part in parts {
        if part.starts_with("--") {
            closed = true;
            break;
        }
        let part = part.strip_prefix("\r\n")?;
        let (head, value) = part.split_once("\r\n\r\n")?;
        let value = value.strip_suffix("\r\n")?;
        let name = head.split("\r\n").find_map(|line| {
            let (k, v) = line.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-disposition")
                .then(|| field_name(v))
                .flatten()
        })?;
        fields.push((name, value.to_owned()));
    }
    closed.then_some(Form(fields))
}

/// `name="…"` of a `Content-Disposition: form-data` header.
fn field_name(disposition: &str) -> Option<String> {
    let mut params = disposition.split(';');
    if !params.next()?.trim().eq_ignore_ascii_case("form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        (k.trim() == "name").then(|| v.trim().trim_matches('"').to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_a_file_come_out_as_sent() {
        let b = boundary("multipart/form-data; boundary=----x1").unwrap();
        let body = "preamble\r\n------x1\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\nabc\r\n\
                    ------x1\r\nContent-Disposition: form-data; name=\"fcm_key\"; filename=\"k.json\"\r\n\
                    Content-Type: application/json\r\n\r\n{\"a\":\r\n1}\r\n------x1--\r\n";
        let form = parse(body.as_bytes(), &b).unwrap();
        assert_eq!(form.get("csrf"), "abc");
        assert_eq!(form.get("fcm_key"), "{\"a\":\r\n1}");
        assert!(parse(b"------x1\r\nno head", &b).is_none());
        assert!(boundary("application/x-www-form-urlencoded").is_none());
    }
}
