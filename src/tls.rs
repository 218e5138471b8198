//! TLS (`wss://`) on the gateway's one port, beside plain `ws://`.
//!
//! The front (`front/mod.rs`) peeks at the first byte of every accepted connection:
//! `0x16` (a TLS handshake record, which no HTTP request can start with) goes through rustls
//! first, anything else is plain HTTP, served or refused as `[tls] allow_plain` says.
//!
//! The certificate is the user's (`[tls] cert_file`, `key_file`, PEM) or one the gateway makes
//! itself on first start and keeps in `DATA_DIR/tls/` (`cert.pem`, `key.pem` with mode 0600).
//! A self-signed certificate proves nothing by itself: the app trusts it because it pins its
//! SHA-256 fingerprint, which `iris-gateway pair` prints beside the token. See docs/security.md.
//!
//! Crypto is rustls on the `ring` provider (aws-lc-rs needs cmake and clang to cross-build).
//! Private keys are never logged and never leave this module except into rustls.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::config::TlsConfig;
use crate::lan;

/// The first byte of every TLS connection (a handshake record carrying the ClientHello).
pub const HANDSHAKE_RECORD: u8 = 0x16;

const CERT_FILE: &str = "cert.pem";
const KEY_FILE: &str = "key.pem";
/// What the last run served, for `pair` while the gateway is not running.
const SERVING_FILE: &str = "serving.json";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the TLS {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the TLS {what} {path} is not usable: {why}")]
    Unusable {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make a self-signed certificate: {0}")]
    Generate(String),
}

/// What the accept loop needs: the rustls acceptor and whether plain connections are served.
pub struct Tls {
    pub acceptor: TlsAcceptor,
    pub allow_plain: bool,
    /// SHA-256 of the leaf certificate's DER, as [`fingerprint`] formats it.
    pub fingerprint: String,
}

/// The TLS half of pairing information, as `pair` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advert {
    /// `wss://HOST:PORT`.
    pub url: String,
    /// SHA-256 of the certificate (DER), uppercase hex pairs joined by `:`.
    pub fingerprint: String,
    /// Whether plain `ws://` is served too.
    pub allow_plain: bool,
}

impl Tls {
    /// The TLS pairing information for a gateway listening on `local`.
    pub fn advert(&self, local: SocketAddr) -> Advert {
        Advert {
            url: wss_url(&crate::lan::pairing_url(local)),
            fingerprint: self.fingerprint.clone(),
            allow_plain: self.allow_plain,
        }
    }
}

/// `ws://…` → `wss://…` (anything else is returned unchanged).
pub fn wss_url(ws_url: &str) -> String {
    match ws_url.strip_prefix("ws://") {
        Some(rest) => format!("wss://{rest}"),
        None => ws_url.to_owned(),
    }
}

/// The form the gateway prints and apps pin: SHA-256 of the certificate's DER encoding, as 32
/// uppercase hex pairs joined by `:` (what `openssl x509 -noout -fingerprint -sha256` shows).
pub fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// `DATA_DIR/tls`: the self-signed certificate, its key and the record of what was served.
pub fn tls_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tls")
}

/// Loads (or on first start makes) the certificate and builds the acceptor. `None` when TLS
/// is off. Also records what is served, for `pair` while the gateway is stopped.
pub fn setup(config: &TlsConfig, data_dir: &Path) -> Result<Option<Tls>, TlsError> {
    if !config.enabled {
        let _ = std::fs::remove_file(tls_dir(data_dir).join(SERVING_FILE));
        return Ok(None);
    }
    let (chain, key, origin) = match (&config.cert_file, &config.key_file) {
        (Some(cert), Some(key)) => {
            warn_if_exposed(key);
            let (chain, k) = load(cert, key)?;
            (chain, k, format!("from {}", cert.display()))
        }
        // Config validation refuses one without the other.
        _ => {
            let (chain, key) = self_signed(data_dir)?;
            let origin = format!(
                "self-signed, {}",
                tls_dir(data_dir).join(CERT_FILE).display()
            );
            (chain, key, origin)
        }
    };
    let fingerprint = fingerprint(&chain[0]);
    let server = server_config(chain, key).map_err(|why| TlsError::Unusable {
        what: "certificate",
        path: config
            .cert_file
            .clone()
            .unwrap_or_else(|| tls_dir(data_dir).join(CERT_FILE)),
        why,
    })?;
    info!(%fingerprint, allow_plain = config.allow_plain, "TLS certificate ({origin})");
    let tls = Tls {
        acceptor: TlsAcceptor::from(Arc::new(server)),
        allow_plain: config.allow_plain,
        fingerprint,
    };
    Ok(Some(tls))
}

/// What pairing shows for a gateway listening on `local`: the URL an app without TLS uses
/// (`wss://` when plain is refused) and the TLS advert. Records the advert for offline `pair`.
pub fn pairing(tls: Option<&Tls>, local: SocketAddr, data_dir: &Path) -> (String, Option<Advert>) {
    let plain = crate::lan::pairing_url(local);
    let Some(tls) = tls else {
        return (plain, None);
    };
    let advert = tls.advert(local);
    record_serving(data_dir, &advert);
    let url = if advert.allow_plain {
        plain
    } else {
        advert.url.clone()
    };
    (url, Some(advert))
}

/// Remembers what the running gateway serves (no secrets: the fingerprint and the plain
/// setting), so `pair` can print it while the gateway is stopped. Best effort.
fn record_serving(data_dir: &Path, advert: &Advert) {
    let path = tls_dir(data_dir).join(SERVING_FILE);
    let _ = make_dir_private(&tls_dir(data_dir));
    let json = serde_json::json!({
        "fingerprint": advert.fingerprint,
        "allow_plain": advert.allow_plain,
    });
    if let Err(e) = crate::atomic_file::write(&path, json.to_string().as_bytes(), 0o644) {
        warn!(
            "could not record the TLS fingerprint in {}: {e}",
            path.display()
        );
    }
}

/// What the last run of the gateway served, for a gateway bound to `listen` (for `pair` while
/// the gateway is stopped). `None` when TLS was off or the gateway never ran.
pub fn last_served(data_dir: &Path, listen: SocketAddr) -> Option<Advert> {
    let text = std::fs::read_to_string(tls_dir(data_dir).join(SERVING_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(Advert {
        url: wss_url(&crate::lan::pairing_url(listen)),
        fingerprint: v["fingerprint"].as_str()?.to_owned(),
        allow_plain: v["allow_plain"].as_bool().unwrap_or(true),
    })
}

/// `72:0A:…` → `720A…`: the app compares fingerprints ignoring `:` and case, and 64 digits
/// keep the QR code (and the mDNS TXT record) smaller.
pub fn compact_fingerprint(fingerprint: &str) -> String {
    fingerprint
        .chars()
        .filter(|c| *c != ':')
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

/// A client configuration that accepts exactly the certificate with this SHA-256 fingerprint
/// (the `chat` command's `wss://`). Names and dates are not checked, the handshake signature is.
pub fn pinned_client_config(fingerprint: &str) -> Result<rustls::ClientConfig, String> {
    let hex: String = fingerprint.chars().filter(|c| *c != ':').collect();
    let sha256 = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("x"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .ok()
        .filter(|b| b.len() == 32 && hex.len() == 64)
        .ok_or_else(|| format!("`{fingerprint}` is not a SHA-256 fingerprint (64 hex digits)"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(
        rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned { sha256, provider }))
            .with_no_client_auth(),
    )
}

#[derive(Debug)]
struct Pinned {
    sha256: Vec<u8>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if Sha256::digest(end_entity.as_ref()).as_slice() == self.sha256.as_slice() {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the gateway's certificate ({}) is not the pinned one",
                fingerprint(end_entity.as_ref())
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<rustls::ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        // Also checks that the key belongs to the certificate. rustls errors never carry key bytes.
        .with_single_cert(chain, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                "the private key does not belong to the (first) certificate".into()
            }
            e => e.to_string(),
        })
}

/// Reads a PEM chain (leaf first) and a PEM private key (PKCS#8, PKCS#1 or SEC1).
fn load(
    cert_path: &Path,
    key_path: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let pem = std::fs::read(cert_path).map_err(|source| TlsError::Read {
        what: "certificate",
        path: cert_path.to_owned(),
        source,
    })?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Unusable {
            what: "certificate",
            path: cert_path.to_owned(),
            why: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Unusable {
            what: "certificate",
            path: cert_path.to_owned(),
            why: "no `BEGIN CERTIFICATE` block".into(),
        });
    }
    // The key's PEM text is wiped from memory when dropped (the parsed key wipes itself).
    let key_pem = Zeroizing::new(std::fs::read(key_path).map_err(|source| TlsError::Read {
        what: "private key",
        path: key_path.to_owned(),
        source,
    })?);
    // The PEM error could quote a line of the file: name the problem, never the content.
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Unusable {
        what: "private key",
        path: key_path.to_owned(),
        why: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no `BEGIN PRIVATE KEY` (PKCS#8), `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY` block".into()
            }
            _ => "not a well-formed PEM private key".into(),
        },
    })?;
    Ok((chain, key))
}

/// Warns when a user-supplied key can be read by users other than its owner and group.
fn warn_if_exposed(key: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(key) {
        if meta.permissions().mode() & 0o004 != 0 {
            warn!(
                "the TLS private key {} is readable by every local user; chmod 600 (or 640 for the service's group)",
                key.display()
            );
        }
    }
}

/// The gateway's own certificate in `DATA_DIR/tls`, made on first start.
fn self_signed(
    data_dir: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let dir = tls_dir(data_dir);
    let (cert_path, key_path) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {
            tighten(&key_path);
            return load(&cert_path, &key_path);
        }
        (false, false) => {}
        // The key is written first, so a key alone is an interrupted first start. A certificate
        // alone means the key was deleted: nothing can serve that certificate any more.
        (cert, _) => {
            if cert {
                warn!(
                    "{} has no key beside it; making a new certificate (devices must pin the new fingerprint)",
                    cert_path.display()
                );
            }
        }
    }
    make_dir_private(&dir)?;
    let names = subject_names();
    let key = rcgen::KeyPair::generate().map_err(|e| TlsError::Generate(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(names.clone())
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Iris gateway");
    params.distinguished_name.push(
        rcgen::DnType::OrganizationName,
        "iris-gateway (self-signed)",
    );
    // rcgen's validity (1975 to 4096) is kept on purpose: a Pi has no real-time clock and may
    // start with a wrong date, and apps trust this certificate by its pinned fingerprint, not
    // by its dates.
    let cert = params
        .self_signed(&key)
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    let key_pem = Zeroizing::new(key.serialize_pem().into_bytes());
    crate::atomic_file::write(&key_path, &key_pem, 0o600).map_err(|source| TlsError::Write {
        path: key_path.clone(),
        source,
    })?;
    crate::atomic_file::write(&cert_path, cert.pem().as_bytes(), 0o644).map_err(|source| {
        TlsError::Write {
            path: cert_path.clone(),
            source,
        }
    })?;
    info!(
        fingerprint = %fingerprint(cert.der()),
        "made a self-signed TLS certificate for {}",
        names.join(", ")
    );
    let key = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    Ok((vec![cert.der().clone()], key))
}

/// The names a phone may reach this box by: `iris.local`, the host name (and its mDNS
/// `.local` form), `localhost`, loopback, and every LAN address it has now.
fn subject_names() -> Vec<String> {
    let mut names = vec!["iris.local".to_owned()];
    if let Some(host) = lan::hostname() {
        if !host.contains('.') {
            names.push(format!("{host}.local"));
        }
        names.push(host);
    }
    names.push("localhost".into());
    let mut ips: Vec<IpAddr> = vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()];
    ips.extend(lan::addresses_without_zone());
    names.extend(ips.iter().map(IpAddr::to_string));
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

fn make_dir_private(dir: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::DirBuilderExt;
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir);
    made.map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })
}

/// Our own key file must stay 0600 whatever happened to it since.
fn tighten(key: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(key) {
        if meta.permissions().mode() & 0o077 != 0 {
            warn!("{} was readable by others; setting mode 600", key.display());
            let _ = std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_colon_separated_uppercase_sha256() {
        let fp = fingerprint(b"abc");
        assert_eq!(
            fp,
            "BA:78:16:BF:8F:01:CF:EA:41:41:40:DE:5D:AE:22:23:B0:03:61:A3:96:17:7A:9C:B4:10:FF:61:F2:00:15:AD"
        );
        assert_eq!(wss_url("ws://10.0.0.2:8765"), "wss://10.0.0.2:8765");
    }

    #[test]
    fn self_signed_certificate_is_made_once_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let config = TlsConfig::default();
        let first = setup(&config, dir.path()).unwrap().unwrap();
        let key = tls_dir(dir.path()).join(KEY_FILE);
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "key mode {mode:o}");
        let again = setup(&config, dir.path()).unwrap().unwrap();
        assert_eq!(first.fingerprint, again.fingerprint);
        // A corrupt key is an error, not a silently new certificate (phones pin the old one).
        std::fs::write(&key, "junk").unwrap();
        let err = setup(&config, dir.path())
            .err()
            .expect("corrupt key refused");
        assert!(err.to_string().contains("key.pem"), "{err}");
        assert!(!err.to_string().contains("junk"), "{err}");
    }

    #[test]
    fn subject_names_cover_the_usual_ways_in() {
        let names = subject_names();
        for n in ["iris.local", "localhost", "127.0.0.1", "::1"] {
            assert!(names.contains(&n.to_owned()), "{n} missing from {names:?}");
        }
    }
}
