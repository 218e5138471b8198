//! What every outgoing HTTPS client of the gateway trusts (push services, agent backends).
//!
//! A leaf of its own because its users are sibling services that may not import each other;
//! not in `config`, since it reads the system's CA file.

/// Where the system keeps trusted CAs; preferred over the built-in list, so a LAN ntfy with a
/// private CA (or a TLS-intercepting proxy) works once its CA is installed.
const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// rustls (ring) trusting the system's CA file when there is one, else the bundled roots.
/// Shared by every outgoing HTTPS client (push, agent backends).
pub fn system_tls() -> ureq::tls::TlsConfig {
    use ureq::tls::{parse_pem, PemItem, RootCerts, TlsConfig};
    let mut tls = TlsConfig::builder();
    if let Ok(pem) = std::fs::read(SYSTEM_CA_FILE) {
        let certs: Vec<_> = parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if !certs.is_empty() {
            tls = tls.root_certs(RootCerts::new_with_certs(&certs));
        }
    }
    tls.build()
}
