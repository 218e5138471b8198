//! This machine as the LAN sees it: its addresses, its host name, and the URL a phone pairs
//! with. A leaf, because TLS (the certificate's names), pairing, discovery and the command
//! line all need it and none of them may import another for it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The WebSocket URL a phone should use for a gateway bound to `addr`. An unspecified bind
/// address (0.0.0.0) is replaced by this machine's first LAN address.
pub fn pairing_url(addr: SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() {
        lan_address().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    } else {
        addr.ip()
    };
    match ip {
        IpAddr::V6(v6) => format!("ws://[{v6}]:{}", addr.port()),
        IpAddr::V4(v4) => format!("ws://{v4}:{}", addr.port()),
    }
}

/// The first non-loopback IPv4 address: the one a phone on the same Wi-Fi most likely reaches.
fn lan_address() -> Option<IpAddr> {
    let ifaces = if_addrs::get_if_addrs().ok()?;
    ifaces
        .iter()
        .filter(|i| !i.is_loopback())
        .map(|i| i.ip())
        .find(|ip| ip.is_ipv4())
}

/// Every non-loopback address of this machine, except link-local IPv6: that needs a zone
/// (`%eth0`), which neither a certificate nor a URL a phone types can name.
pub fn addresses_without_zone() -> Vec<IpAddr> {
    let Ok(ifaces) = if_addrs::get_if_addrs() else {
        return Vec::new();
    };
    ifaces
        .iter()
        .filter(|i| !i.is_loopback())
        .map(|i| i.ip())
        .filter(|ip| !matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80))
        .collect()
}

/// This machine's host name, when it is a usable DNS name.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..end])
        .ok()?
        .trim()
        .to_ascii_lowercase();
    let usable = !name.is_empty()
        && name != "localhost"
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    usable.then_some(name)
}
