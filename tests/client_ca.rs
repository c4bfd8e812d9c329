//! `serve --client-ca FILE`: the webhook port completes a TLS handshake only with a client
//! whose certificate that CA signed (the API server's, configured through its
//! AdmissionConfiguration); without one, or with one of another CA, the connection is
//! refused. Probes move to `--health-listen`. Real certificates, the real `serve` process.

use crate::support::apiserver;

use crate::support::https;

use apiserver::ApiServer;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_ichor-rules");

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("client-ca-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

/// A CA: its certificate (PEM, DER) and an issuer signing with it.
struct Ca {
    pem: String,
    der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    let cert = params.self_signed(&key).expect("CA");
    Ca {
        pem: cert.pem(),
        der: cert.der().clone(),
        issuer: Issuer::new(params, key),
    }
}

/// A certificate `ca` signs for `names` with `usage`: (PEM chain, PEM key).
fn leaf(ca: &Ca, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("params");
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, &ca.issuer).expect("signed");
    (cert.pem(), key.serialize_pem())
}

fn client_config(server_ca: &Ca, client: Option<&(String, String)>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(server_ca.der.clone()).expect("trust");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    Arc::new(match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            use rustls::pki_types::pem::PemObject;
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<_, _>>()
                    .expect("chain");
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client cert")
        }
    })
}

/// `GET path` over TLS; the status code, or why there was none.
async fn get(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    path: &str,
) -> Result<u16, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let mut s = tokio_rustls::TlsConnector::from(config.clone())
        .connect(ServerName::try_from("127.0.0.1").expect("name"), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    // TLS 1.3: the client's certificate is checked after the client's side of the
    // handshake is done; a refusal shows as the first read failing.
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .await
        .map_err(|e| format!("read: {e}"))?;
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no answer ({text:?})"))
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_client_the_client_ca_signed_completes_the_handshake() {
    let api = ApiServer::start().await;
    let dir = scratch("serve");
    let server_ca = ca("webhook CA");
    let (crt, key) = leaf(
        &server_ca,
        &["127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let client_ca = ca("API server client CA");
    let apiserver_cert = leaf(
        &client_ca,
        &["kube-apiserver"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let stranger_ca = ca("someone else");
    let stranger_cert = leaf(&stranger_ca, &["pod"], ExtendedKeyUsagePurpose::ClientAuth);
    let (listen, health) = (https::free_address(), https::free_address());
    let _serve = https::Killed(
        Command::new(BIN)
            .args(["serve", "--no-controller", "--rules", "rules"])
            .args(["--listen", &listen.to_string()])
            .args(["--health-listen", &health.to_string()])
            .args(["--api-server", &api.url()])
            .arg("--tls-cert")
            .arg(write(&dir, "tls.crt", &crt))
            .arg("--tls-key")
            .arg(write(&dir, "tls.key", &key))
            .arg("--client-ca")
            .arg(write(&dir, "client-ca.crt", &client_ca.pem))
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts"),
    );
    // The probes: plain HTTP on the health port.
    let mut healthy = false;
    for _ in 0..150 {
        if let Ok(mut s) = tokio::net::TcpStream::connect(health).await {
            let _ = s
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await;
            let mut t = String::new();
            let _ = s.read_to_string(&mut t).await;
            if t.starts_with("HTTP/1.1 200") {
                healthy = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(healthy, "the health port answers");
    let with_cert = client_config(&server_ca, Some(&apiserver_cert));
    assert_eq!(
        get(listen, &with_cert, "/healthz").await,
        Ok(200),
        "the API server's certificate is accepted"
    );
    for (what, config) in [
        ("no certificate", client_config(&server_ca, None)),
        (
            "a certificate of another CA",
            client_config(&server_ca, Some(&stranger_cert)),
        ),
    ] {
        let got = get(listen, &config, "/healthz").await;
        assert!(got.is_err(), "{what}: {got:?}");
    }
    // Still served to the right client after the refusals.
    assert_eq!(get(listen, &with_cert, "/healthz").await, Ok(200));
}

#[test]
fn a_client_ca_file_without_a_certificate_is_refused_at_start() {
    let dir = scratch("bad");
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
    write(&dir, "tls.crt", &ck.cert.pem());
    write(&dir, "tls.key", &ck.signing_key.serialize_pem());
    let empty = write(&dir, "empty.crt", "not a certificate\n");
    let out = Command::new(BIN)
        .args([
            "serve",
            "--no-controller",
            "--rules",
            "rules",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--api-server", "http://127.0.0.1:9"])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .arg("--client-ca")
        .arg(&empty)
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--client-ca") && err.contains("empty.crt") && err.contains("no certificate"),
        "{err}"
    );
}
