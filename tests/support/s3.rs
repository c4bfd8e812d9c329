//! moto's S3 server on 127.0.0.1, one per test, for the backup tests (issue 36): a real
//! S3-compatible HTTP server (multipart uploads, HEAD, LIST, DELETE), started from the
//! binary `scripts/s3-tools.sh` installs. Without it the test fails saying how to install
//! it (never skips).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto server; killed when dropped.
pub struct S3Server {
    child: Child,
    pub port: u16,
}

fn moto_binary() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("ICHOR_MOTO_SERVER") {
        return p.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    std::path::PathBuf::from(home).join(".cache/ichor-rules/s3-tools/venv/bin/moto_server")
}

impl S3Server {
    /// Starts the server and waits until it answers.
    pub async fn start() -> S3Server {
        let bin = moto_binary();
        assert!(
            bin.is_file(),
            "moto's S3 server is not installed at {} (ICHOR_MOTO_SERVER); install it with \
             `bash scripts/s3-tools.sh install` (moto[server] from PyPI into a cached venv; \
             needs python3-venv), then `eval \"$(bash scripts/s3-tools.sh env)\"`",
            bin.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let server = S3Server { child, port };
        let start = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "moto's server did not listen on 127.0.0.1:{port} within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates a bucket (moto takes an unsigned request).
    pub async fn create_bucket(&self, bucket: &str) {
        self.request("PUT", &format!("/{bucket}"), Vec::new()).await;
    }

    /// Overwrites object `key` of `bucket` with `body` (an unsigned PUT, as an attacker or
    /// a broken disk would).
    pub async fn put_raw(&self, bucket: &str, key: &str, body: Vec<u8>) {
        self.request("PUT", &format!("/{bucket}/{key}"), body).await;
    }

    async fn request(&self, method: &str, path: &str, body: Vec<u8>) {
        use http_body_util::{BodyExt, Full};
        use hyper::body::Bytes;
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .expect("connect to moto");
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port))
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        let resp = send.send_request(req).await.expect("moto answers");
        let status = resp.status();
        let text = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(
            status.is_success(),
            "{method} {path}: {status}: {}",
            String::from_utf8_lossy(&text)
        );
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
