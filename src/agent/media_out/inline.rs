//! Images put inline in the answer (`![alt](data:image/…;base64,…)`): decoded within the policy's
//! limit, and trusted only as the type their bytes say.

use base64::Engine;

use super::file_kind::sniff_image;
use super::policy::FilePolicy;
use super::{OutFile, Refusal};

impl FilePolicy {
    /// Decodes an inline image, within the limit.
    pub fn inline(&self, alt: &str, subtype: &str, base64: &str) -> Result<OutFile, Refusal> {
        use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
        // Models drop or add padding: either way the data is the same.
        let engine = GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
        );
        let bytes = engine.decode(base64).map_err(|_| Refusal::InlineDamaged)?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(Refusal::InlineTooLarge(self.max_bytes));
        }
        let declared = format!("image/{}", subtype.to_ascii_lowercase());
        let mime = match sniff_image(&bytes) {
            Some(m) => m.to_owned(),
            None if declared == "image/svg+xml" => declared,
            None => return Err(Refusal::InlineDamaged),
        };
        let ext = extension_for(&mime);
        let stem: String = alt
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .take(60)
            .collect::<String>()
            .trim()
            .replace(' ', "-");
        let stem = if stem.is_empty() {
            "image".into()
        } else {
            stem
        };
        Ok(OutFile {
            filename: format!("{stem}.{ext}"),
            mime,
            kind: "image".into(),
            bytes,
        })
    }
}

fn extension_for(mime: &str) -> &'static str {
    match mime {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/bmp" => "bmp",
        "image/tiff" => "tiff",
        "image/svg+xml" => "svg",
        _ => "bin",
    }
}
