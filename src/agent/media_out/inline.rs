//! Images put inline in the answer (`![alt](data:image/…;base64,…)`): decoded within the policy's
//! limit, and offered only once their bytes decode to an image (within the same pixel limits
//! and budget as photos for the agent), as the type the decoder found.

use base64::Engine;

use super::policy::FilePolicy;
use super::{OutFile, Refusal};
use crate::agent::media_in::verify_image;

impl FilePolicy {
    /// Decodes an inline image, within the limit.
    pub fn inline(&self, alt: &str, base64: &str) -> Result<OutFile, Refusal> {
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
        // Offered as an image only once it decodes as one, whatever its first bytes or its
        // declared subtype say (`BM` followed by HTML is no bitmap).
        let (mime, _, _) =
            verify_image(&bytes).map_err(|e| Refusal::InlineUnreadable(e.to_string()))?;
        let ext = extension_for(mime);
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
            mime: mime.to_owned(),
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
        _ => "bin",
    }
}
