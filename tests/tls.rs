//! TLS and the per-address and per-connection limits, against the real binary: `wss://` with
//! the fingerprint `pair` prints (pinned by a client of our own, not by the gateway's code), a
//! wrong pin refused, the certificate kept across restarts, a user-supplied certificate chain,
//! plain `ws://` refused when `[tls] allow_plain = false`, `limits.max_connections_per_ip`,
//! and `limits.bytes_per_second` refusing and closing one device while another keeps working
//! and an upload is slowed rather than broken.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{cli_ok, frame_type, pair, pstr, temp_data_dir, Client, Gateway, Paired, Schema};
use futures_util::{SinkExt, StreamExt};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// A pinning TLS client, written here independently of the gateway's code
// ---------------------------------------------------------------------------------------------

/// Accepts exactly the server certificate whose DER has this SHA-256 (names and dates are not
/// looked at: that is what pinning a self-signed certificate means). Handshake signatures are
/// still checked, so the server must hold the certificate's key.
#[derive(Debug)]
struct PinnedSha256 {
    sha256: Vec<u8>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedSha256 {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if Sha256::digest(end_entity.as_ref()).as_slice() == self.sha256.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "certificate does not match the pinned SHA-256".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `AB:CD:…` (or plain hex) → bytes.
fn parse_fingerprint(fp: &str) -> Vec<u8> {
    let hex: String = fp.chars().filter(|c| *c != ':').collect();
    assert_eq!(
        hex.len(),
        64,
        "a SHA-256 fingerprint has 64 hex digits: {fp}"
    );
    (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex fingerprint"))
        .collect()
}

fn pinned_config(fingerprint: &str) -> rustls::ClientConfig {
    let provider = provider();
    rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedSha256 {
            sha256: parse_fingerprint(fingerprint),
            provider,
        }))
        .with_no_client_auth()
}

/// `wss://HOST:PORT` → its socket address.
fn url_addr(url: &str) -> SocketAddr {
    let rest = url
        .split_once("://")
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("not a URL: {url}"));
    rest.split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("no socket address in {url}: {e}"))
}

/// A minimal protocol client over any stream (TLS, or plain from a chosen source address),
/// checking every frame the gateway sends against the schema.
struct Raw<S> {
    ws: WebSocketStream<S>,
    next_id: i64,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Raw<S> {
    async fn open(url: &str, stream: S) -> Result<Raw<S>, String> {
        let ws = tokio::time::timeout(TIMEOUT, tokio_tungstenite::client_async(url, stream))
            .await
            .map_err(|_| "WebSocket handshake timed out".to_owned())?
            .map_err(|e| format!("WebSocket handshake failed: {e}"))?
            .0;
        Ok(Raw { ws, next_id: 1 })
    }

    async fn send(&mut self, frame: Value) {
        Schema::load()
            .validate_client_frame(&frame)
            .unwrap_or_else(|e| panic!("test sent an invalid frame: {e}"));
        self.ws
            .send(Message::text(frame.to_string()))
            .await
            .expect("send");
    }

    async fn request(&mut self, frame_type: &str, payload: Value) -> i64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({ "v": 1, "type": frame_type, "id": id, "payload": payload }))
            .await;
        id
    }

    /// The next text frame: JSON, valid by the schema.
    async fn recv(&mut self) -> Value {
        loop {
            let msg = tokio::time::timeout(TIMEOUT, self.ws.next())
                .await
                .expect("a frame within the timeout")
                .expect("connection open")
                .expect("no socket error");
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(t.as_str())
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {}", t.as_str()));
                Schema::load()
                    .validate_server_frame(&v)
                    .unwrap_or_else(|e| panic!("{e}"));
                return v;
            }
        }
    }

    async fn reply(&mut self, id: i64) -> Value {
        loop {
            let f = self.recv().await;
            if f["id"] == id {
                return f;
            }
        }
    }

    /// hello → `hello.ack` then `status{online}`.
    async fn hello(&mut self, token: &str) -> Value {
        self.send(json!({
            "v": 1, "type": "hello", "id": 1,
            "payload": { "token": token, "device_id": "tls-test", "device_name": "tls test" },
        }))
        .await;
        let ack = self.recv().await;
        assert_eq!(frame_type(&ack), "hello.ack", "{ack}");
        assert_eq!(ack["id"], 1, "{ack}");
        let status = self.recv().await;
        assert_eq!(frame_type(&status), "status", "{status}");
        assert_eq!(status["payload"]["state"], "online", "{status}");
        ack
    }

    async fn ping_pong(&mut self) {
        let id = self.request("ping", json!({ "ts": 7 })).await;
        let pong = self.reply(id).await;
        assert_eq!(frame_type(&pong), "pong", "{pong}");
    }
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

/// TLS to the address in `url` with `config`, then the WebSocket handshake.
async fn wss_with(url: &str, config: rustls::ClientConfig) -> Result<Raw<Tls>, String> {
    let addr = url_addr(url);
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("TCP connect to {addr}: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::IpAddress(addr.ip().into());
    let tls = tokio::time::timeout(TIMEOUT, connector.connect(name, tcp))
        .await
        .map_err(|_| "TLS handshake timed out".to_owned())?
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    Raw::open(url, tls).await
}

async fn wss(url: &str, fingerprint: &str) -> Result<Raw<Tls>, String> {
    wss_with(url, pinned_config(fingerprint)).await
}

/// A plain WebSocket from a chosen loopback source address (127.0.0.0/8 all reach lo).
async fn ws_from(source: IpAddr, gw: &Gateway) -> Result<Raw<TcpStream>, String> {
    let socket = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket
        .bind(SocketAddr::new(source, 0))
        .map_err(|e| format!("bind {source}: {e}"))?;
    let tcp = socket
        .connect(gw.addr)
        .await
        .map_err(|e| format!("connect from {source}: {e}"))?;
    Raw::open(&gw.url, tcp).await
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The TLS fields of `pair --json`.
fn tls_of(p: &Paired) -> (String, String) {
    let field = |k: &str| {
        p.json[k]
            .as_str()
            .unwrap_or_else(|| panic!("`pair --json` has no `{k}` with TLS on: {}", p.json))
            .to_owned()
    };
    (field("tls_url"), field("tls_fingerprint"))
}

fn is_fingerprint(fp: &str) -> bool {
    fp.len() == 95
        && fp.split(':').count() == 32
        && fp.split(':').all(|b| {
            b.len() == 2
                && b.chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase())
        })
}

fn sha256_fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The first certificate of a PEM file, as DER.
fn leaf_der(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    CertificateDer::pem_slice_iter(&pem)
        .next()
        .expect("a certificate")
        .expect("valid PEM")
        .to_vec()
}

/// Writes a config file into its own temp dir (kept alive by the caller).
fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).expect("write config");
    (dir, path)
}

fn start_with(data: &Path, config: &Path) -> Gateway {
    Gateway::start(data, &["--config", config.to_str().expect("UTF-8 path")])
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The gateway's stdout once it contains `needle` (bounded wait: lines after the `listening on
/// ws://` one may still be on their way).
fn stdout_with(gw: &Gateway, needle: &str) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let out = gw.stdout_tail();
        if out.contains(needle) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "no `{needle}` on stdout:\n{}",
            gw.output_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A padded `ping` text frame of about `size` bytes (JSON whitespace after the `{`).
fn padded_ping(id: i64, size: usize) -> String {
    let body = format!(r#""v":1,"type":"ping","id":{id},"payload":{{"ts":1}}}}"#);
    format!(
        "{{{}{body}",
        " ".repeat(size.saturating_sub(body.len() + 1))
    )
}

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn wss_works_with_the_fingerprint_pair_prints_and_plain_ws_still_works() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);

    // The gateway said where TLS is, on the same port, with the fingerprint (and the start-up
    // pairing code shows it too; its last line is `or try it…`).
    let stdout = stdout_with(&gw, "or try it from a terminal");
    let wss_line = format!("listening on wss://{}", gw.addr);
    assert!(
        stdout.contains(&wss_line),
        "no `{wss_line}` line:\n{stdout}"
    );

    let p = pair(dir.path(), "tls-phone");
    let (tls_url, fp) = tls_of(&p);
    assert_eq!(tls_url, format!("wss://{}", gw.addr), "{}", p.json);
    assert!(is_fingerprint(&fp), "fingerprint form: {fp}");
    assert!(p.url.starts_with("ws://"), "plain is allowed: {}", p.json);
    assert!(
        stdout.contains(&fp),
        "start-up output lacks the fingerprint:\n{stdout}"
    );

    // It is the certificate kept in the data dir, whose key only the gateway's user reads.
    let tls_dir = dir.path().join("tls");
    assert_eq!(sha256_fingerprint(&leaf_der(&tls_dir.join("cert.pem"))), fp);
    assert_eq!(mode(&tls_dir.join("key.pem")), 0o600, "key file mode");
    assert_eq!(mode(&tls_dir), 0o700, "tls dir mode");
    // The local admin channel (pairing goes through it) is the gateway user's alone.
    assert_eq!(
        mode(&dir.path().join("control.sock")),
        0o600,
        "control socket mode"
    );

    // The text form of `pair` shows it too.
    let d = dir.path().to_str().unwrap();
    let text = cli_ok(&["pair", "--data-dir", d, "--name", "text-phone"]);
    assert!(text.contains(&fp) && text.contains(&tls_url), "{text}");

    let mut c = wss(&tls_url, &fp)
        .await
        .expect("wss with the pinned fingerprint");
    let ack = c.hello(&p.token).await;
    assert!(ack["payload"]["channels"].is_array(), "{ack}");
    c.ping_pong().await;

    // Plain ws:// on the same port, same token, at the same time.
    let (mut plain, ack) = Client::hello(&gw.url, &p.token, "plain").await;
    assert_eq!(frame_type(&ack), "hello.ack", "{ack}");
    let id = plain.request("ping", None, None, json!({ "ts": 1 })).await;
    assert_eq!(frame_type(&plain.recv_reply(id).await), "pong");
    c.ping_pong().await;
}

#[tokio::test]
async fn a_wrong_pinned_fingerprint_is_refused() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (tls_url, fp) = tls_of(&p);

    // Same form, one bit different: the handshake must fail before any WebSocket byte.
    let mut bytes = parse_fingerprint(&fp);
    bytes[31] ^= 1;
    let wrong = sha256_fingerprint_of_bytes(&bytes);
    let err = match wss(&tls_url, &wrong).await {
        Ok(_) => panic!("a connection with the wrong pinned fingerprint succeeded"),
        Err(e) => e,
    };
    assert!(err.contains("TLS handshake failed"), "{err}");
    assert!(err.contains("pinned"), "{err}");

    // An ordinary client that trusts only the web's CAs refuses the self-signed certificate too.
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(
        CertificateDer::pem_slice_iter(
            rcgen::generate_simple_self_signed(vec!["localhost".into()])
                .unwrap()
                .cert
                .pem()
                .as_bytes(),
        )
        .map(Result::unwrap),
    );
    let strict = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    assert!(wss_with(&tls_url, strict).await.is_err());

    // The gateway is unharmed: the right pin still works.
    let mut c = wss(&tls_url, &fp).await.expect("right pin");
    c.hello(&p.token).await;
    drop(gw);
}

fn sha256_fingerprint_of_bytes(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[tokio::test]
async fn the_certificate_and_fingerprint_survive_a_restart() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let before = pair(dir.path(), "phone");
    let (_, fp) = tls_of(&before);
    gw.stop_ok();

    // While it is stopped, `pair` still knows what it served.
    let offline = pair(dir.path(), "offline");
    assert_eq!(tls_of(&offline).1, fp, "offline pair: {}", offline.json);

    let gw = Gateway::start(dir.path(), &[]);
    let after = pair(dir.path(), "phone 2");
    let (tls_url, fp_after) = tls_of(&after);
    assert_eq!(fp_after, fp, "the fingerprint changed across a restart");

    // A phone that pinned it before the restart connects with its old token.
    let mut c = wss(&tls_url, &fp).await.expect("old pin after restart");
    c.hello(&before.token).await;
    let mut c2 = wss(&tls_url, &fp).await.expect("old pin, offline token");
    c2.hello(&offline.token).await;
    drop(gw);
}

#[tokio::test]
async fn a_user_supplied_certificate_chain_is_served() {
    // A private CA and a leaf it signed, as a user with their own PKI would have.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Test home CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();

    let files = tempfile::tempdir().unwrap();
    let cert_path = files.path().join("chain.pem");
    let key_path = files.path().join("leaf.key");
    std::fs::write(&cert_path, format!("{}{}", leaf.pem(), ca.pem())).unwrap();
    std::fs::write(&key_path, leaf_key.serialize_pem()).unwrap();
    let (_cfg_dir, config) = config_file(&format!(
        "[tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        cert_path.to_str().unwrap(),
        key_path.to_str().unwrap()
    ));

    let dir = temp_data_dir();
    let gw = start_with(dir.path(), &config);
    let p = pair(dir.path(), "phone");
    let (tls_url, fp) = tls_of(&p);
    assert_eq!(
        fp,
        sha256_fingerprint(leaf.der()),
        "pair must show the leaf's fingerprint"
    );
    assert!(
        !dir.path().join("tls/key.pem").exists(),
        "no self-signed key is made when the user supplies one"
    );
    assert!(
        !gw.stderr_tail().contains("could not record"),
        "{}",
        gw.output_tail()
    );

    // Pinned...
    let mut c = wss(&tls_url, &fp).await.expect("pinned user cert");
    c.hello(&p.token).await;
    // ...and verified the ordinary way, against the user's CA, by name.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let verified = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(verified));
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("the chain verifies against the CA for `localhost`");
    let mut c2 = Raw::open(&tls_url, tls)
        .await
        .expect("WebSocket over verified TLS");
    c2.hello(&p.token).await;
}

#[tokio::test]
async fn a_key_that_does_not_match_the_certificate_stops_the_start_with_a_clear_error() {
    let a = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let b = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let files = tempfile::tempdir().unwrap();
    let cert_path = files.path().join("cert.pem");
    let key_path = files.path().join("key.pem");
    std::fs::write(&cert_path, a.cert.pem()).unwrap();
    let b_key = b.signing_key.serialize_pem();
    std::fs::write(&key_path, &b_key).unwrap();
    let (_cfg_dir, config) = config_file(&format!(
        "[tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        cert_path.to_str().unwrap(),
        key_path.to_str().unwrap()
    ));
    let dir = temp_data_dir();
    let out = common::gateway_command()
        .args(["run", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run the gateway");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started with a mismatched key:\n{stderr}"
    );
    assert!(
        stderr.contains("TLS") && stderr.contains("cert.pem"),
        "{stderr}"
    );
    // Whatever went wrong, the private key never reaches the log.
    let key_body: String = b_key.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(
        !stderr.contains(&key_body[..40]),
        "the key leaked into stderr:\n{stderr}"
    );
}

#[tokio::test]
async fn with_plain_off_ws_is_refused_while_wss_works() {
    let (_cfg_dir, config) = config_file("[tls]\nallow_plain = false\n");
    let dir = temp_data_dir();
    let gw = start_with(dir.path(), &config);
    stdout_with(&gw, "plain ws:// is refused");

    let p = pair(dir.path(), "phone");
    let (tls_url, fp) = tls_of(&p);
    assert_eq!(
        p.url, tls_url,
        "with plain off, `url` is the wss:// one: {}",
        p.json
    );

    // A plain WebSocket upgrade gets a clear HTTP 426, not a session.
    let err = match Client::try_open(&gw.url).await {
        Ok(_) => panic!("a plain ws:// connection was served with allow_plain = false"),
        Err(e) => e,
    };
    assert!(err.contains("426"), "{err}");
    // So does any plain HTTP request (a webhook over http://), with a body saying why.
    let answer = raw_http(
        gw.addr,
        "POST /hooks/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 426"), "{answer}");
    assert!(answer.contains("wss://"), "{answer}");

    let mut c = wss(&tls_url, &fp).await.expect("wss");
    c.hello(&p.token).await;
    c.ping_pong().await;
}

async fn raw_http(addr: SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(TIMEOUT, tcp.read_to_end(&mut out))
        .await
        .expect("answer in time")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn connections_per_address_are_limited_without_touching_other_addresses() {
    let (_cfg_dir, config) = config_file("[limits]\nmax_connections_per_ip = 3\n");
    let dir = temp_data_dir();
    let gw = start_with(dir.path(), &config);
    let p = pair(dir.path(), "phone");

    let mut held = Vec::new();
    for _ in 0..3 {
        let (c, _) = Client::hello(&gw.url, &p.token, "held").await;
        held.push(c);
    }
    // The fourth from 127.0.0.1 is closed at once, before any HTTP or WebSocket byte.
    let started = Instant::now();
    match Client::try_open(&gw.url).await {
        Ok(_) => panic!("a 4th connection from one address was served"),
        Err(e) => assert!(!e.contains("timed out"), "refused, not left hanging: {e}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));

    // Another address is not affected.
    let other: IpAddr = "127.0.0.2".parse().unwrap();
    let mut c = ws_from(other, &gw)
        .await
        .expect("a connection from 127.0.0.2");
    c.hello(&p.token).await;
    c.ping_pong().await;

    // The held connections work, and closing one frees a place for its address.
    for h in &mut held {
        let id = h.request("ping", None, None, json!({ "ts": 2 })).await;
        assert_eq!(frame_type(&h.recv_reply(id).await), "pong");
    }
    held.pop().unwrap().close().await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match Client::try_open(&gw.url).await {
            Ok(mut c) => {
                c.hello_on(&p.token, "again").await;
                break;
            }
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "the place was never given back: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Byte-rate limits small enough to reach quickly; frame-rate limits out of the way.
const BYTE_LIMITS: &str = "[limits]\nmax_frame_bytes = 65536\nbytes_per_second = 65536\n\
                           byte_burst = 131072\nframes_per_second = 1000\nframe_burst = 1000\n";

#[tokio::test]
async fn a_byte_flood_is_refused_then_closed_while_another_device_keeps_working() {
    let (_cfg_dir, config) = config_file(BYTE_LIMITS);
    let dir = temp_data_dir();
    let gw = start_with(dir.path(), &config);
    let flooder = pair(dir.path(), "flooder");
    let bystander = pair(dir.path(), "bystander");
    let (mut a, _) = Client::hello(&gw.url, &flooder.token, "flooder").await;
    a.recv_type("status").await;
    let (mut b, _) = Client::hello(&gw.url, &bystander.token, "bystander").await;
    b.recv_type("status").await;

    // Eight 32 KiB requests at once: the 128 KiB burst takes about four, the rest are refused
    // by name and not processed.
    for id in 100..108 {
        a.send_raw_text(&padded_ping(id, 32 << 10)).await;
    }
    let (mut pongs, mut refused) = (0, 0);
    for id in 100..108 {
        let f = a.recv_until(|f| f["id"] == id).await;
        match frame_type(&f) {
            "pong" => pongs += 1,
            "error" => {
                assert_eq!(pstr(&f, "code"), "rate_limited", "{f}");
                assert!(pstr(&f, "message").contains("bytes per second"), "{f}");
                refused += 1;
            }
            other => panic!("unexpected {other}: {f}"),
        }
    }
    assert!(
        pongs >= 3 && refused >= 2,
        "pongs {pongs}, refused {refused}"
    );

    // Going on regardless of the refusals ends in a policy close; the other device is served
    // normally meanwhile. (One request at a time, so the close finds nothing unread.)
    let flood = async {
        for id in 200..400 {
            a.send_raw_text(&padded_ping(id, 32 << 10)).await;
            let f = a.recv_until(|f| f["id"] == id).await;
            if frame_type(&f) == "error" {
                assert_eq!(pstr(&f, "code"), "rate_limited", "{f}");
                if pstr(&f, "message").contains("closing") {
                    return a.expect_closed().await;
                }
            }
        }
        panic!(
            "a flood of 200 more requests was never closed\n{}",
            a.recent()
        );
    };
    let bystand = async {
        for ts in 0..5 {
            let id = b.request("ping", None, None, json!({ "ts": ts })).await;
            assert_eq!(frame_type(&b.recv_reply(id).await), "pong");
        }
    };
    let (code, ()) = tokio::join!(flood, bystand);
    assert_eq!(code, Some(1008), "a policy close frame");

    let id = b.send_text(None, None, "still here?").await;
    assert_eq!(frame_type(&b.recv_reply(id).await), "read.receipt");
    b.recv_type("message.stop").await;
}

#[tokio::test]
async fn an_upload_over_the_byte_rate_is_slowed_not_refused() {
    // 256 KiB/s; the upload below is 1 MiB in 64 KiB chunks, so it needs about 3 s.
    let (_cfg_dir, config) = config_file(
        "[limits]\nmax_frame_bytes = 65536\nbytes_per_second = 262144\nbyte_burst = 262144\n",
    );
    let dir = temp_data_dir();
    let gw = start_with(dir.path(), &config);
    let p = pair(dir.path(), "uploader");
    let (mut c, _) = Client::hello(&gw.url, &p.token, "uploader").await;
    c.recv_type("status").await;
    c.timeout = Duration::from_secs(30);

    let data: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7 % 251) as u8).collect();
    let sha: String = Sha256::digest(&data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let started = Instant::now();
    let start = c
        .request(
            "media.upload.start",
            None,
            None,
            json!({ "media_ref": "big", "kind": "video", "mime": "video/mp4",
                    "size": data.len(), "filename": "clip.mp4" }),
        )
        .await;
    let mut ping = None;
    for (i, chunk) in data.chunks(64 << 10).enumerate() {
        c.send_raw_binary(chunk.to_vec()).await;
        if i == 8 {
            // A request in the middle of the upload is not starved by it.
            ping = Some(c.request("ping", None, None, json!({ "ts": 3 })).await);
        }
    }
    let end = c
        .request(
            "media.upload.end",
            None,
            None,
            json!({ "media_ref": "big", "sha256": sha }),
        )
        .await;
    let ack = c.recv_reply(end).await;
    let took = started.elapsed();
    assert_eq!(
        frame_type(&ack),
        "media.upload.ack",
        "{ack}\n{}",
        c.recent()
    );
    assert_eq!(ack["payload"]["ok"], true, "{ack}\n{}", c.recent());
    assert!(
        !c.seen
            .iter()
            .any(|f| f["id"] == start || frame_type(f) == "error"),
        "{}",
        c.recent()
    );
    let ping = ping.unwrap();
    assert!(
        c.seen
            .iter()
            .any(|f| f["id"] == ping && frame_type(f) == "pong"),
        "{}",
        c.recent()
    );
    assert!(
        took >= Duration::from_secs(2),
        "1 MiB at 256 KiB/s (burst 256 KiB) took only {took:?}: not limited"
    );
}

// ---------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn tokens_never_reach_the_log_even_at_trace_level() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--log-level", "trace"]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = Client::hello(&gw.url, &p.token, "phone").await;
    c.recv_type("status").await;
    let guess = "iris_ThisIsAGuessedTokenThatMustNotBeLogged0000000";
    let mut bad = Client::open(&gw.url).await;
    bad.send(json!({ "v": 1, "type": "hello", "id": 1,
                     "payload": { "token": guess, "device_id": "x" } }))
        .await;
    bad.expect_error("auth").await;
    common::revoke(dir.path(), &p.device_id);
    c.expect_closed().await;
    // Wait for the revocation's log line, so everything above has been logged.
    let deadline = Instant::now() + TIMEOUT;
    while !gw.stderr_tail().contains("revoked a device") {
        assert!(Instant::now() < deadline, "{}", gw.output_tail());
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = gw.stderr_tail();
    assert!(
        log.contains("hello refused"),
        "the bad hello is logged:\n{log}"
    );
    for secret in [p.token.as_str(), guess, &p.token["iris_".len()..]] {
        assert!(!log.contains(secret), "a token is in the log:\n{log}");
    }
}

#[test]
fn the_start_up_pairing_code_is_not_printed_into_the_journal() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::MetadataExt;
    // systemd's StandardOutput=journal: JOURNAL_STREAM names the device and inode of stdout.
    let (reader, writer) = std::io::pipe().expect("pipe");
    let writer = std::fs::File::from(std::os::fd::OwnedFd::from(writer));
    let meta = writer.metadata().expect("fstat the pipe");
    let dir = temp_data_dir();
    let mut child = common::gateway_command()
        .args(["run", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stdout(writer)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the gateway");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut out = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while !out
        .iter()
        .any(|l: &String| l.contains("never written to the journal"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => out.push(line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let out = out.join("\n");
    assert!(out.contains("no device is paired yet"), "{out}");
    assert!(out.contains("iris-gateway pair --data-dir"), "{out}");
    assert!(
        !out.contains("iris_") && !out.contains("token:"),
        "a token went to the journal:\n{out}"
    );
}
