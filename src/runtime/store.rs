//! A TalosEtcdBackup's S3-compatible store (issue 36), through `object_store`'s S3 client:
//! a snapshot streams in as a multipart upload in parts of [`PART`] bytes, one part in
//! flight, so an upload holds at most two parts whatever the snapshot's size; it is checked
//! as it passes ([`SnapshotCheck`]) and, once stored, by the stored object's size. A
//! snapshot that fails either check is deleted, never kept.
//!
//! The access keys come from the caller (read live from the backup's Secret): they are
//! never in an error, a log line or a `Debug` print.

use crate::runtime::crypt::{CryptError, Key, Opener, Sealer};
use crate::runtime::objects::{StoreSpec, parse_endpoint};
use crate::runtime::snapshot::{Checked, SnapshotCheck, SnapshotError};
use futures::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use std::fmt;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The size of an upload's parts: the least S3 takes for every part but the last (5 MiB),
/// so a snapshot in flight holds as little as S3 allows.
pub const PART: usize = 5 * 1024 * 1024;

/// A store's access keys. `Debug` shows neither.
#[derive(Clone)]
pub struct Keys {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Keys(<redacted>)")
    }
}

/// Why a store call failed, in one sentence that says what to check (never a key).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Spec(String),
    #[error("the store at {endpoint} could not be reached: {detail}")]
    Unreachable { endpoint: String, detail: String },
    #[error(
        "the store at {endpoint} refused the access keys (wrong or disabled keys, or a clock far off): {detail}"
    )]
    Keys { endpoint: String, detail: String },
    #[error("bucket `{bucket}` does not exist at {endpoint}; create it, or fix spec.store.bucket")]
    NoBucket { endpoint: String, bucket: String },
    #[error("object `{key}` is not in the store")]
    NotFound { key: String },
    #[error("the store at {endpoint} failed: {detail}")]
    Failed { endpoint: String, detail: String },
    #[error("reading the snapshot to upload failed: {0}")]
    Read(#[source] std::io::Error),
    #[error("writing the downloaded snapshot failed: {0}")]
    Write(#[source] std::io::Error),
}

impl StoreError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            StoreError::Spec(_) => "spec",
            StoreError::Unreachable { .. } => "unreachable",
            StoreError::Keys { .. } => "keys",
            StoreError::NoBucket { .. } => "no_bucket",
            StoreError::NotFound { .. } => "not_found",
            StoreError::Failed { .. } => "failed",
            StoreError::Read(_) | StoreError::Write(_) => "io",
        }
    }

    /// A reason word for a condition.
    pub fn reason(&self) -> &'static str {
        match self {
            StoreError::Spec(_) => "InvalidSpec",
            StoreError::Unreachable { .. } => "StoreUnreachable",
            StoreError::Keys { .. } => "StoreKeysRefused",
            StoreError::NoBucket { .. } => "BucketNotFound",
            StoreError::NotFound { .. } => "SnapshotNotFound",
            StoreError::Failed { .. } => "StoreFailed",
            StoreError::Read(_) | StoreError::Write(_) => "StreamFailed",
        }
    }
}

/// One backup's store: its bucket, under its prefix.
pub struct Store {
    /// The S3 client (any object store, for the tests of what the store answers).
    s3: std::sync::Arc<dyn ObjectStore>,
    endpoint: String,
    bucket: String,
    prefix: String,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// A stored object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub key: String,
    pub size: u64,
}

impl Store {
    /// The store `spec` names, signed with `keys`. `timeout` bounds each request.
    pub fn new(spec: &StoreSpec, keys: &Keys, timeout: Duration) -> Result<Store, StoreError> {
        // reqwest is built without a default crypto provider: ring, as the rest of the crate.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ep = parse_endpoint(&spec.endpoint).map_err(StoreError::Spec)?;
        let endpoint = spec.endpoint.trim_end_matches('/').to_string();
        let options = ClientOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(timeout.min(Duration::from_secs(10)))
            .with_allow_http(!ep.https);
        let retry = RetryConfig {
            max_retries: 2,
            retry_timeout: timeout,
            ..RetryConfig::default()
        };
        let s3 = AmazonS3Builder::new()
            .with_endpoint(&endpoint)
            .with_bucket_name(&spec.bucket)
            .with_region(spec.region.as_deref().unwrap_or("us-east-1"))
            .with_access_key_id(&keys.access_key_id)
            .with_secret_access_key(&keys.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_allow_http(!ep.https)
            .with_client_options(options)
            .with_retry(retry)
            .build()
            .map_err(|e| StoreError::Spec(format!("spec.store: {e}")))?;
        let prefix = spec.prefix.clone().unwrap_or_default();
        Ok(Store {
            s3: std::sync::Arc::new(s3),
            endpoint,
            bucket: spec.bucket.clone(),
            prefix,
        })
    }

    /// The full key of `name` under this backup's prefix.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn error(&self, e: object_store::Error, key: &str) -> StoreError {
        let detail = chain(&e);
        let endpoint = self.endpoint.clone();
        match classify(&e, &detail) {
            Class::NoBucket => StoreError::NoBucket {
                endpoint,
                bucket: self.bucket.clone(),
            },
            Class::NotFound => StoreError::NotFound {
                key: key.to_string(),
            },
            Class::Keys => StoreError::Keys { endpoint, detail },
            Class::Unreachable => StoreError::Unreachable { endpoint, detail },
            Class::Failed => StoreError::Failed { endpoint, detail },
        }
    }

    /// Uploads everything `from` yields as object `key` (multipart, one [`PART`] in
    /// flight), checking it as an etcd snapshot on the way (and encrypting it with `seal`,
    /// when given: [`crate::runtime::crypt`]); then checks the stored size. Whatever fails,
    /// nothing is left under `key` (the upload is aborted, or the object deleted). The
    /// snapshot's check, and the size stored.
    pub async fn put_snapshot<R: AsyncRead + Unpin>(
        &self,
        key: &str,
        mut from: R,
        seal: Option<&Key>,
    ) -> Result<(Checked, u64), PutError> {
        let path = Path::from(key);
        let mut sealer = match seal.map(Sealer::new).transpose() {
            Ok(s) => s,
            Err(e) => return Err(PutError::Crypt(e)),
        };
        let mut upload = self
            .s3
            .put_multipart(&path)
            .await
            .map_err(|e| PutError::Store(self.error(e, key)))?;
        let mut check = SnapshotCheck::new();
        let mut sent: u64 = 0;
        let streamed: Result<(), PutError> = async {
            loop {
                // One part, filled in place: its allocation is exactly PART (a growing
                // buffer would double to 16 MiB when it fills up), its pages touched only
                // as bytes arrive.
                // Sealed, a part must still be PART long once the sealer held back its
                // last segment: read one segment more.
                let size = if sealer.is_some() {
                    PART + crate::runtime::crypt::SEGMENT
                } else {
                    PART
                };
                let mut part = vec![0u8; size];
                let mut filled = 0;
                while filled < size {
                    let n = from
                        .read(&mut part[filled..])
                        .await
                        .map_err(|e| PutError::Store(StoreError::Read(e)))?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                part.truncate(filled);
                let last = filled < size;
                check.update(&part);
                let body = match sealer.as_mut() {
                    None => part,
                    Some(s) => {
                        // Room for what the sealer held back, the header and the tags.
                        let room =
                            filled + 2 * crate::runtime::crypt::SEGMENT + filled / 1024 + 1024;
                        let mut out = Vec::with_capacity(room);
                        s.push(&part, &mut out).map_err(PutError::Crypt)?;
                        drop(part);
                        if last && let Some(s) = sealer.take() {
                            s.finish(&mut out).map_err(PutError::Crypt)?;
                        }
                        out
                    }
                };
                if !body.is_empty() {
                    sent += body.len() as u64;
                    let payload = PutPayload::from(bytes::Bytes::from(body));
                    upload
                        .put_part(payload)
                        .await
                        .map_err(|e| PutError::Store(self.error(e, key)))?;
                }
                if last {
                    return Ok(());
                }
            }
        }
        .await;
        if let Err(e) = streamed {
            let _ = upload.abort().await;
            return Err(e);
        }
        let checked = match check.finish() {
            Ok(c) => c,
            Err(e) => {
                let _ = upload.abort().await;
                return Err(PutError::Check(e));
            }
        };
        upload
            .complete()
            .await
            .map_err(|e| PutError::Store(self.error(e, key)))?;
        let stored = match self.s3.head(&path).await {
            Ok(meta) => meta.size,
            Err(e) => {
                let _ = self.delete(key).await;
                return Err(PutError::Store(self.error(e, key)));
            }
        };
        if stored != sent {
            let _ = self.delete(key).await;
            return Err(PutError::Size {
                streamed: sent,
                stored,
            });
        }
        Ok((checked, stored))
    }

    /// Deletes object `key` (a missing one is not an error).
    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.s3.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(e, key)),
        }
    }

    /// The objects under this backup's prefix, by key.
    pub async fn list(&self) -> Result<Vec<Object>, StoreError> {
        let prefix = Path::from(self.prefix.trim_end_matches('/'));
        let prefix = (!self.prefix.is_empty()).then_some(&prefix);
        let mut out = Vec::new();
        let mut stream = self.s3.list(prefix);
        while let Some(meta) = stream.next().await {
            let meta = meta.map_err(|e| self.error(e, &self.prefix))?;
            out.push(Object {
                key: meta.location.to_string(),
                size: meta.size,
            });
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Downloads object `key` into `to`, chunk by chunk, decrypting it with `open` when
    /// given and checking it as an etcd snapshot. An encrypted object without a key is
    /// said to be one.
    pub async fn get_snapshot<W: AsyncWrite + Unpin>(
        &self,
        key: &str,
        to: &mut W,
        open: Option<&Key>,
    ) -> Result<Checked, PutError> {
        let got = self
            .s3
            .get(&Path::from(key))
            .await
            .map_err(|e| PutError::Store(self.error(e, key)))?;
        let mut stream = got.into_stream();
        let mut check = SnapshotCheck::new();
        let mut opener = open.map(Opener::new);
        let mut plain = Vec::new();
        let mut first = true;
        let write = |e| PutError::Store(StoreError::Write(e));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| PutError::Store(self.error(e, key)))?;
            if first && opener.is_none() && crate::runtime::crypt::is_encrypted(&chunk) {
                return Err(PutError::Encrypted);
            }
            first = false;
            let bytes: &[u8] = match opener.as_mut() {
                None => &chunk,
                Some(o) => {
                    plain.clear();
                    o.push(&chunk, &mut plain).map_err(PutError::Crypt)?;
                    &plain
                }
            };
            check.update(bytes);
            to.write_all(bytes).await.map_err(write)?;
        }
        if let Some(o) = opener.take() {
            plain.clear();
            o.finish(&mut plain).map_err(PutError::Crypt)?;
            check.update(&plain);
            to.write_all(&plain).await.map_err(write)?;
        }
        to.flush().await.map_err(write)?;
        check.finish().map_err(PutError::Check)
    }
}

/// Why a snapshot was not stored (or not fetched) whole and sound.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error(transparent)]
    Store(StoreError),
    #[error("the snapshot failed its check, so it was not kept: {0}")]
    Check(#[source] SnapshotError),
    #[error("the stored object is {stored} bytes but {streamed} were streamed, so it was deleted")]
    Size { streamed: u64, stored: u64 },
    #[error("{0}")]
    Crypt(#[source] CryptError),
    #[error(
        "the snapshot is encrypted (spec.encryption of its backup); give its key to decrypt it"
    )]
    Encrypted,
}

/// What an object-store error means for the one who reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    NoBucket,
    NotFound,
    Keys,
    Unreachable,
    Failed,
}

/// Classifies `e` (whose whole chain of causes is `detail`). The structure decides where
/// it can: a connection that failed or timed out anywhere in the chain is an unreachable
/// store, whatever the text says; a 403 or 401 the client recognised is a key problem.
/// The words are read only for what the client does not classify (S3's error codes in a
/// response body, a status it wrapped as a generic error), and never a bare number: the
/// detail carries the request's URL, whose port or key may hold any digits.
fn classify(e: &object_store::Error, detail: &str) -> Class {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<HttpError>()
            && matches!(
                h.kind(),
                HttpErrorKind::Connect
                    | HttpErrorKind::Timeout
                    | HttpErrorKind::Interrupted
                    | HttpErrorKind::Request
            )
        {
            return Class::Unreachable;
        }
        cause = c.source();
    }
    if detail.contains("NoSuchBucket") {
        return Class::NoBucket;
    }
    match e {
        object_store::Error::NotFound { .. } => return Class::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => return Class::Keys,
        _ => {}
    }
    if [
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "403 Forbidden",
        "401 Unauthorized",
    ]
    .iter()
    .any(|w| detail.contains(w))
    {
        Class::Keys
    } else if ["dns error", "onnection refused", "timed out"]
        .iter()
        .any(|w| detail.contains(w))
    {
        Class::Unreachable
    } else {
        Class::Failed
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::{
        CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
        PutMultipartOptions, PutOptions, PutResult,
    };
    use std::sync::Arc;

    /// An in-memory store whose `HEAD` answers one byte more than it keeps: a store that
    /// kept something else than what was streamed.
    #[derive(Debug)]
    struct LyingHead(InMemory);

    impl fmt::Display for LyingHead {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("LyingHead")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for LyingHead {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.0.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.0.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            let head = options.head;
            let mut r = self.0.get_opts(location, options).await?;
            if head {
                r.meta.size += 1;
            }
            Ok(r)
        }

        fn delete_stream(
            &self,
            locations: futures::stream::BoxStream<'static, object_store::Result<Path>>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
            self.0.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.0.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.0.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }

    fn snapshot(db: &[u8]) -> Vec<u8> {
        let mut out = db.to_vec();
        out.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, db).as_ref());
        out
    }

    fn store(s3: Arc<dyn ObjectStore>) -> Store {
        Store {
            s3,
            endpoint: "http://127.0.0.1:1".into(),
            bucket: "etcd".into(),
            prefix: "prod/".into(),
        }
    }

    /// A store's error is classified by what happened, not by digits in its URL: CI once
    /// called a refused connection to port 39503 "refused the access keys" for its "403".
    #[test]
    fn an_error_is_classified_by_what_happened_not_by_the_digits_in_its_url() {
        use object_store::client::{HttpError, HttpErrorKind};
        #[derive(Debug)]
        struct Said(&'static str, Option<HttpError>);
        impl fmt::Display for Said {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for Said {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_ref().map(|h| h as _)
            }
        }
        let generic = |said: Said| object_store::Error::Generic {
            store: "S3",
            source: Box::new(said),
        };
        let http = |kind| {
            Some(HttpError::new(
                kind,
                std::io::Error::other("tcp connect error"),
            ))
        };
        let url = "Error performing GET http://127.0.0.1:40301/etcd?prefix=prod%2F403";
        let cases: Vec<(object_store::Error, Class)> = vec![
            (
                generic(Said(url, http(HttpErrorKind::Connect))),
                Class::Unreachable,
            ),
            (
                generic(Said(url, http(HttpErrorKind::Timeout))),
                Class::Unreachable,
            ),
            (
                generic(Said(url, http(HttpErrorKind::Decode))),
                Class::Failed,
            ),
            (
                generic(Said(
                    "GET http://127.0.0.1:40301/ - status code: 500 Internal Server Error",
                    None,
                )),
                Class::Failed,
            ),
            (
                generic(Said(
                    "GET http://127.0.0.1:9000/ - status code: 403 Forbidden: <Code>SignatureDoesNotMatch</Code>",
                    None,
                )),
                Class::Keys,
            ),
            (
                object_store::Error::PermissionDenied {
                    path: "prod/a".into(),
                    source: Box::new(Said("denied", None)),
                },
                Class::Keys,
            ),
            (
                object_store::Error::Unauthenticated {
                    path: "prod/a".into(),
                    source: Box::new(Said("who", None)),
                },
                Class::Keys,
            ),
            (
                object_store::Error::NotFound {
                    path: "prod/a".into(),
                    source: Box::new(Said("<Code>NoSuchBucket</Code>", None)),
                },
                Class::NoBucket,
            ),
            (
                object_store::Error::NotFound {
                    path: "prod/a".into(),
                    source: Box::new(Said("<Code>NoSuchKey</Code>", None)),
                },
                Class::NotFound,
            ),
        ];
        for (e, want) in cases {
            let detail = chain(&e);
            assert_eq!(classify(&e, &detail), want, "{detail}");
        }
    }

    #[tokio::test]
    async fn a_stored_size_other_than_the_streamed_one_is_refused_and_deleted() {
        let snap = snapshot(&vec![7u8; 10_000]);
        // A store that keeps what it is sent: checked and stored.
        let honest = store(Arc::new(InMemory::new()));
        let (checked, size) = honest
            .put_snapshot("prod/a.db", &snap[..], None)
            .await
            .expect("stored");
        assert_eq!(size, snap.len() as u64);
        assert_eq!(checked.size, snap.len() as u64);
        assert_eq!(honest.list().await.expect("listed").len(), 1);
        // One that says it keeps another size: refused, and nothing is left under the key.
        let lying = store(Arc::new(LyingHead(InMemory::new())));
        let e = lying
            .put_snapshot("prod/b.db", &snap[..], None)
            .await
            .expect_err("a size mismatch");
        match e {
            PutError::Size { streamed, stored } => {
                assert_eq!(streamed, snap.len() as u64);
                assert_eq!(stored, snap.len() as u64 + 1);
            }
            other => panic!("{other:?}"),
        }
        assert!(lying.list().await.expect("listed").is_empty());
    }
}
