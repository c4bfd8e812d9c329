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
        S3Server::spawn(None).await
    }

    /// Starts the server checking every request's signature (moto's IAM authentication,
    /// `INITIAL_NO_AUTH_ACTION_COUNT`: the first four requests go unchecked, to create
    /// bucket `bucket` and an IAM user allowed `s3:*`), and returns it with that user's
    /// access keys (id, secret). Any other keys are refused from then on:
    /// `InvalidAccessKeyId` for an unknown id, `SignatureDoesNotMatch` for a wrong secret.
    pub async fn start_with_keys(bucket: &str) -> (S3Server, String, String) {
        let server = S3Server::spawn(Some(4)).await;
        server.create_bucket(bucket).await;
        let iam = |form: &str| {
            let s = &server;
            let form = format!("{form}&Version=2010-05-08");
            async move { s.iam(&form).await }
        };
        iam("Action=CreateUser&UserName=ichor").await;
        let key = iam("Action=CreateAccessKey&UserName=ichor").await;
        let field = |name: &str| {
            let open = format!("<{name}>");
            let close = format!("</{name}>");
            let start = key.find(&open).map(|i| i + open.len()).expect(name);
            let end = key[start..].find(&close).expect(name) + start;
            key[start..end].to_string()
        };
        let (id, secret) = (field("AccessKeyId"), field("SecretAccessKey"));
        let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}"#;
        let mut form =
            String::from("Action=PutUserPolicy&UserName=ichor&PolicyName=s3&PolicyDocument=");
        for b in policy.bytes() {
            if b.is_ascii_alphanumeric() {
                form.push(b as char);
            } else {
                form.push_str(&format!("%{b:02X}"));
            }
        }
        iam(&form).await;
        (server, id, secret)
    }

    async fn spawn(no_auth_actions: Option<u32>) -> S3Server {
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
        let mut cmd = Command::new(&bin);
        if let Some(n) = no_auth_actions {
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", n.to_string());
        }
        let child = cmd
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

    /// An IAM call (a form POST), unsigned but naming IAM in its credential scope (moto
    /// routes by it); its answer's body.
    async fn iam(&self, form: &str) -> String {
        let auth = "AWS4-HMAC-SHA256 Credential=AKIASETUP/20261205/us-east-1/iam/aws4_request, \
                    SignedHeaders=host, Signature=00";
        let (status, text) = self
            .send(
                "POST",
                "/",
                form.as_bytes().to_vec(),
                &[
                    ("authorization", auth),
                    ("content-type", "application/x-www-form-urlencoded"),
                ],
            )
            .await;
        assert!(status.is_success(), "IAM {form}: {status}: {text}");
        text
    }

    async fn request(&self, method: &str, path: &str, body: Vec<u8>) {
        let (status, text) = self.send(method, path, body, &[]).await;
        assert!(status.is_success(), "{method} {path}: {status}: {text}");
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> (hyper::StatusCode, String) {
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
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body))).expect("request");
        let resp = send.send_request(req).await.expect("moto answers");
        let status = resp.status();
        let text = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&text).into_owned())
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
