//! A small HTTPS client for the webhook tests and benchmarks: a certificate made for
//! 127.0.0.1, and requests over rustls + hyper on a connection that trusts it.
//!
//! The tests reach it as `crate::support::https`; the webhook bench includes it with
//! `#[path = "../tests/support/https.rs"] mod https;`.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::pki_types::{CertificateDer, ServerName};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// An address on 127.0.0.1 free right now, for a server started as a process.
pub fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// A child process (`ichor-rules serve`) killed and reaped when dropped, so a failing test
/// leaves no server behind.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 connection over TLS.
pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Writes a self-signed serving certificate for 127.0.0.1 to `dir/tls.crt` and
/// `dir/tls.key`; returns it, to be trusted by clients.
pub fn write_cert(dir: &Path) -> CertificateDer<'static> {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("certificate");
    std::fs::write(dir.join("tls.crt"), ck.cert.pem()).expect("write cert");
    std::fs::write(dir.join("tls.key"), ck.signing_key.serialize_pem()).expect("write key");
    ck.cert.der().clone()
}

/// Opens a TLS connection trusting `ca`; returns it with the server's certificate.
pub async fn connect(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
) -> (Sender, CertificateDer<'static>) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).expect("trust the CA");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let _ = tcp.set_nodelay(true);
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
        .expect("TLS handshake");
    let peer = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first().cloned())
        .expect("server certificate")
        .into_owned();
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .expect("http handshake");
    tokio::spawn(conn);
    (send, peer)
}

/// One request on an open connection: the status and the body.
pub async fn request(
    send: &mut Sender,
    method: &str,
    path: &str,
    content_type: &str,
    body: Bytes,
) -> (u16, Bytes) {
    send.ready().await.expect("connection ready");
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("content-type", content_type)
        .body(Full::new(body))
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, bytes)
}
