//! The link from a controller's records to the admission that let its work in, when the
//! webhook and the controller run in different processes (the chart's two Deployments):
//! the webhook answers `GET /admissions?kind=…&namespace=…&name=…&operation=…` on its
//! metrics port, behind the same TokenReview + SubjectAccessReview as `/metrics`
//! (`runtime::metrics_auth`, non-resource URL `/admissions`, verb `get`), with the
//! admissions it keeps (`step_records::Admissions`, the newest 4096); the controller asks
//! every webhook replica ([`Lookup`]: `serve --admissions-url`, `--admissions-peers`) with
//! its ServiceAccount token when its own process holds no admission for the object, and
//! takes an answer only when the one check of both paths accepts it
//! ([`Admission::admits`]). A lookup that fails never delays a step past its timeout: the
//! record then says why (`admission_lookup`, one of [`REASONS`]) and the failure is
//! counted (`ichor_rules_admission_lookup_failures_total{reason}`).

use super::metrics::Metrics;
use super::step_records::{Admission, Admissions, admits_work};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustls::pki_types::ServerName;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The non-resource URL (and path) of the lookup.
pub const PATH: &str = "/admissions";

/// Why a record has no `admission` although the webhook was asked: every value
/// `admission_lookup` (and the failure metric's `reason`) can take.
pub const REASONS: [&str; 9] = [
    "not-found",
    "not-this-object",
    "uid-mismatch",
    "no-uid",
    "timeout",
    "unauthorized",
    "forbidden",
    "unavailable",
    "bad-answer",
];

/// The most bytes of an answer read (4096 admissions of one key cannot be: one is kept per
/// object and operation).
const ANSWER_LIMIT: usize = 64 * 1024;
/// The most webhook replicas asked.
const MAX_PEERS: usize = 16;
/// How long an admission found is kept (a reconcile loop asks again at most this often).
pub const FOUND_FOR: Duration = Duration::from_secs(60);
/// How long a lookup that found nothing, or failed, is kept.
pub const MISSED_FOR: Duration = Duration::from_secs(5);
/// The most answers kept.
const CACHE_SIZE: usize = 1024;

/// A query of `/admissions`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub operation: String,
}

/// Parses the query string of `GET /admissions`. Every key once, no other key, values as
/// Kubernetes spells them (no percent-encoding is needed, so none is accepted). The error
/// is the 400's message.
pub fn parse_query(q: Option<&str>) -> Result<Query, String> {
    const USAGE: &str = "ask GET /admissions?kind=TalosMachine&namespace=NS&name=NAME&operation=DELETE (or kind=TalosOperation&operation=CREATE)";
    let q = q.unwrap_or("");
    if q.len() > 1024 {
        return Err(format!("the query is longer than 1024 bytes; {USAGE}"));
    }
    let (mut kind, mut namespace, mut name, mut operation) = (None, None, None, None);
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("`{}` has no value; {USAGE}", clip(pair)))?;
        let slot = match key {
            "kind" => &mut kind,
            "namespace" => &mut namespace,
            "name" => &mut name,
            "operation" => &mut operation,
            _ => return Err(format!("unknown parameter `{}`; {USAGE}", clip(key))),
        };
        if slot.replace(value.to_string()).is_some() {
            return Err(format!("`{key}` is given twice; {USAGE}"));
        }
    }
    let missing = |what: &str| format!("`{what}` is missing; {USAGE}");
    let kind = kind.ok_or_else(|| missing("kind"))?;
    let namespace = namespace.ok_or_else(|| missing("namespace"))?;
    let name = name.ok_or_else(|| missing("name"))?;
    let operation = operation.ok_or_else(|| missing("operation"))?;
    if !admits_work(&kind, &operation) {
        return Err(format!(
            "no admission of {} {} is kept (only TalosMachine DELETE and TalosOperation CREATE); {USAGE}",
            clip(&kind),
            clip(&operation)
        ));
    }
    if !is_label(&namespace) {
        return Err(format!(
            "namespace `{}` is not a Kubernetes namespace (lowercase letters, digits and `-`, at most 63)",
            clip(&namespace)
        ));
    }
    if !is_subdomain(&name) {
        return Err(format!(
            "name `{}` is not a Kubernetes object name (lowercase letters, digits, `-` and `.`, at most 253)",
            clip(&name)
        ));
    }
    Ok(Query {
        kind,
        namespace,
        name,
        operation,
    })
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label)
}

/// At most 64 characters of what a caller sent, for a message (never a metric label).
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// One kept admission as `/admissions` answers it: the object it is of, and the admission.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    #[serde(flatten)]
    pub admission: Admission,
}

/// The answer of `/admissions`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub admissions: Vec<Kept>,
}

/// Answers `GET /admissions` (the caller already allowed): 400 for a bad query, else the
/// kept admissions of the object and operation asked (none, or one). `admissions`: `None`
/// when this process keeps none (`--decision-log off`: no decision ids to link to).
pub fn answer(admissions: Option<&Admissions>, query: Option<&str>) -> Response {
    let q = match parse_query(query) {
        Ok(q) => q,
        Err(why) => {
            return (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                format!("{why}\n"),
            )
                .into_response();
        }
    };
    let found = admissions.and_then(|a| a.kept(&q.kind, &q.namespace, &q.name, &q.operation));
    let body = Answer {
        admissions: found
            .into_iter()
            .map(|admission| Kept {
                kind: q.kind.clone(),
                namespace: q.namespace.clone(),
                name: q.name.clone(),
                admission,
            })
            .collect(),
    };
    match serde_json::to_vec(&body) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer could not be written: {e}\n"),
        )
            .into_response(),
    }
}

/// What a lookup gave: the admission, or why none (one of [`REASONS`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Linked {
    pub admission: Option<Admission>,
    pub why: Option<&'static str>,
}

impl Linked {
    fn missing(why: &'static str) -> Linked {
        Linked {
            admission: None,
            why: Some(why),
        }
    }
}

/// Where and how the controller asks the webhook for admissions (`serve
/// --admissions-url`, `--admissions-ca`, `--admissions-peers`, `--admissions-token`,
/// `--admissions-timeout-ms`).
#[derive(Clone, Debug)]
pub struct LookupConfig {
    /// `https://HOST:PORT/PATH`: HOST is the name the webhook's certificate must carry
    /// (and, without `peers`, the address asked).
    pub url: String,
    /// PEM CA certificate(s) the webhook's certificate must be signed by; read at each
    /// lookup (a mounted Secret changes when the CA rotates).
    pub ca: PathBuf,
    /// A DNS name whose every address is asked (a headless Service of the webhook pods):
    /// each replica keeps the admissions it decided.
    pub peers: Option<String>,
    /// The bearer token's file (projected ServiceAccount tokens rotate: read each time).
    pub token: PathBuf,
    pub timeout: Duration,
}

/// An object's answers are kept by kind, uid and operation.
type CacheKey = (String, String, String);

/// The controller's side of the link.
pub struct Lookup {
    host: String,
    port: u16,
    path: String,
    config: LookupConfig,
    metrics: Arc<Metrics>,
    cache: Mutex<HashMap<CacheKey, (Instant, Linked)>>,
}

/// What a replica answered.
enum Asked {
    Answer(Answer),
    Failed(&'static str),
}

impl Lookup {
    /// Checks the URL; says what is wrong with it.
    pub fn new(config: LookupConfig, metrics: Arc<Metrics>) -> Result<Lookup, String> {
        let uri: http::Uri = config
            .url
            .parse()
            .map_err(|e| format!("{:?} is not a URL: {e}", config.url))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!(
                "{:?}: the webhook is asked over HTTPS only (https://HOST:PORT{PATH})",
                config.url
            ));
        }
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{:?} names no host", config.url))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        ServerName::try_from(host.clone()).map_err(|e| {
            format!(
                "{:?}: {host:?} cannot be a certificate's name: {e}",
                config.url
            )
        })?;
        let path = match uri.path() {
            "" | "/" => PATH.to_string(),
            p => p.to_string(),
        };
        if uri.query().is_some() {
            return Err(format!("{:?}: give the URL without a query", config.url));
        }
        Ok(Lookup {
            host,
            port: uri.port_u16().unwrap_or(443),
            path,
            config,
            metrics,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The admission that let `operation` on the object `meta` (a `kind`) in, as a webhook
    /// replica kept it and [`Admission::admits`] accepts it; or why there is none. Takes
    /// at most the lookup's timeout; answers are kept [`FOUND_FOR`] (found) or
    /// [`MISSED_FOR`] (not found, failed) per object.
    pub async fn find(&self, kind: &str, meta: &ObjectMeta, operation: &str) -> Linked {
        let key = (
            kind.to_string(),
            meta.uid.clone().unwrap_or_default(),
            operation.to_string(),
        );
        if let Ok(cache) = self.cache.lock()
            && let Some((at, linked)) = cache.get(&key)
        {
            let keep = if linked.admission.is_some() {
                FOUND_FOR
            } else {
                MISSED_FOR
            };
            if at.elapsed() < keep {
                return linked.clone();
            }
        }
        let deadline = tokio::time::Instant::now() + self.config.timeout;
        let linked = self.ask_all(kind, meta, operation, deadline).await;
        if let Some(why) = linked.why
            && !is_refusal(why)
        {
            self.metrics.admission_lookup_failed(why);
        }
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHE_SIZE {
                cache.retain(|_, (at, _)| at.elapsed() < FOUND_FOR);
                if cache.len() >= CACHE_SIZE {
                    cache.clear();
                }
            }
            cache.insert(key, (Instant::now(), linked.clone()));
        }
        linked
    }

    async fn ask_all(
        &self,
        kind: &str,
        meta: &ObjectMeta,
        operation: &str,
        deadline: tokio::time::Instant,
    ) -> Linked {
        let (namespace, name) = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        let token = match std::fs::read_to_string(&self.config.token) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            Ok(_) | Err(_) => {
                tracing::warn!(
                    file = %self.config.token.display(),
                    "--admissions-token: no token to ask the webhook for admissions with"
                );
                return Linked::missing("unauthorized");
            }
        };
        let tls = match self.tls() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "--admissions-ca: the webhook's certificate cannot be checked");
                return Linked::missing("unavailable");
            }
        };
        let resolve = self.config.peers.as_deref().unwrap_or(&self.host);
        let found =
            tokio::time::timeout_at(deadline, tokio::net::lookup_host((resolve, self.port)));
        let addrs: Vec<SocketAddr> = match found.await {
            Ok(Ok(a)) => a.take(MAX_PEERS).collect(),
            Err(_) => return Linked::missing("timeout"),
            Ok(Err(e)) => {
                tracing::warn!(host = %resolve, error = %e, "asking the webhook for admissions: no address");
                return Linked::missing("unavailable");
            }
        };
        let target = format!(
            "{}?kind={kind}&namespace={namespace}&name={name}&operation={operation}",
            self.path
        );
        // Every replica, each within what is left of the timeout: one that does not answer
        // costs no more than that, and the others' answers still count.
        let asks = addrs.iter().map(|a| async {
            tokio::time::timeout_at(deadline, self.ask(*a, tls.clone(), &target, &token))
                .await
                .unwrap_or(Asked::Failed("timeout"))
        });
        let answers = futures::future::join_all(asks).await;
        judge(&answers, kind, meta, operation)
    }

    fn tls(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let roots = super::tls::load_client_ca(&self.config.ca).map_err(|e| e.to_string())?;
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Arc::new(config))
    }

    /// One replica, at `addr`, its certificate checked for the URL's host.
    async fn ask(
        &self,
        addr: SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        target: &str,
        token: &str,
    ) -> Asked {
        match self.ask_at(addr, tls, target, token).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(%addr, error = %e, "asking the webhook for admissions");
                Asked::Failed("unavailable")
            }
        }
    }

    async fn ask_at(
        &self,
        addr: SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        target: &str,
        token: &str,
    ) -> Result<Asked, String> {
        let name = ServerName::try_from(self.host.clone()).map_err(|e| e.to_string())?;
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {:?}: {e}", self.host))?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("HTTP: {e}"))?;
        let conn = tokio::spawn(conn);
        let req = http::Request::get(target)
            .header(header::HOST, self.host.as_str())
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .map_err(|e| format!("the request: {e}"))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let status = resp.status();
        let body = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), ANSWER_LIMIT)
            .await
            .map_err(|e| format!("reading the answer: {e}"));
        conn.abort();
        let failed = match status.as_u16() {
            200 => None,
            401 => Some("unauthorized"),
            403 => Some("forbidden"),
            400 | 404 => Some("bad-answer"),
            _ => Some("unavailable"),
        };
        if let Some(why) = failed {
            tracing::warn!(%addr, %status, "the webhook did not answer the admissions asked");
            return Ok(Asked::Failed(why));
        }
        let Ok(body) = body else {
            return Ok(Asked::Failed("bad-answer"));
        };
        match super::nesting::json::<Answer>(&body) {
            Ok(a) => Ok(Asked::Answer(a)),
            Err(e) => {
                tracing::warn!(%addr, error = %e, "the webhook's admissions are not JSON of admissions");
                Ok(Asked::Failed("bad-answer"))
            }
        }
    }
}

/// Whether `why` says an admission was found and the check refused it, or none was kept:
/// no failure of the lookup (not counted in the failure metric).
pub fn is_refusal(why: &str) -> bool {
    matches!(
        why,
        "not-found" | "not-this-object" | "uid-mismatch" | "no-uid"
    )
}

/// The replicas' answers together: the newest admission of this object that the check
/// accepts; else, when a replica could not be asked, why (it may hold the admission);
/// else why the check refused the one kept (`uid-mismatch`: another object's of the same
/// name; `no-uid`; `not-this-object`), or `not-found`.
fn judge(answers: &[Asked], kind: &str, meta: &ObjectMeta, operation: &str) -> Linked {
    let (namespace, name) = (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    );
    let mut refused: Option<&'static str> = None;
    let mut best: Option<&Admission> = None;
    for a in answers {
        let Asked::Answer(answer) = a else { continue };
        for k in &answer.admissions {
            if k.kind != kind || k.namespace != namespace || k.name != name {
                continue;
            }
            let a = &k.admission;
            let sane = a.decision.len() <= 64
                && a.request_uid.len() <= 128
                && a.object_uid.len() <= 128
                && a.time.len() <= 64
                && !a.decision.is_empty();
            let checked = if sane {
                a.check(meta, operation)
            } else {
                Err("not-this-object")
            };
            match checked {
                Ok(()) if best.is_none_or(|b| newer(a, b)) => best = Some(a),
                Ok(()) => {}
                Err(why) => {
                    refused.get_or_insert(why);
                }
            }
        }
    }
    if let Some(a) = best {
        return Linked {
            admission: Some(a.clone()),
            why: None,
        };
    }
    if let Some(why) = answers.iter().find_map(|a| match a {
        Asked::Failed(why) => Some(*why),
        Asked::Answer(_) => None,
    }) {
        return Linked::missing(why);
    }
    if answers.is_empty() {
        return Linked::missing("unavailable");
    }
    Linked::missing(refused.unwrap_or("not-found"))
}

/// Whether `a` was decided after `b` (both already accepted: their times parse).
fn newer(a: &Admission, b: &Admission) -> bool {
    let at = |x: &Admission| x.time.parse::<k8s_openapi::jiff::Timestamp>().ok();
    at(a) > at(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn meta(created: &str, deleted: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some("cp-4".into()),
            namespace: Some("infra".into()),
            uid: Some("u-2".into()),
            creation_timestamp: Some(Time(created.parse().expect("time"))),
            deletion_timestamp: Some(Time(deleted.parse().expect("time"))),
            ..ObjectMeta::default()
        }
    }

    fn kept(time: &str, digest: &str) -> Kept {
        Kept {
            kind: "TalosMachine".into(),
            namespace: "infra".into(),
            name: "cp-4".into(),
            admission: Admission {
                decision: format!("d-{time}"),
                request_uid: "req".into(),
                object_uid: "u-2".into(),
                operation: "DELETE".into(),
                digest: digest.into(),
                time: time.into(),
                caller_verified: false,
            },
        }
    }

    #[test]
    fn queries_are_checked_and_the_message_says_how_to_ask() {
        let q = parse_query(Some(
            "kind=TalosMachine&namespace=infra&name=cp-4.a&operation=DELETE",
        ))
        .expect("a good query");
        assert_eq!(q.name, "cp-4.a");
        for (bad, says) in [
            (None, "`kind` is missing"),
            (Some("kind=TalosMachine&kind=TalosMachine"), "given twice"),
            (
                Some("kind=Secret&namespace=a&name=b&operation=DELETE"),
                "no admission of Secret",
            ),
            (
                Some("kind=TalosMachine&namespace=a&name=b&operation=UPDATE"),
                "no admission",
            ),
            (
                Some("kind=TalosMachine&namespace=A%20&name=b&operation=DELETE"),
                "not a Kubernetes namespace",
            ),
            (
                Some("kind=TalosMachine&namespace=a&name=b/c&operation=DELETE"),
                "not a Kubernetes object name",
            ),
            (Some("user=x"), "unknown parameter `user`"),
            (Some("kind"), "has no value"),
        ] {
            let e = parse_query(bad).expect_err("refused");
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.len() < 400, "{e}");
        }
    }

    /// Only an admission the check accepts links: a predecessor's (decided before this
    /// object was created), one with a malformed digest, or one of another object are not
    /// taken; a replica that could not be asked is named when nothing was found.
    #[test]
    fn the_answers_are_judged_by_the_one_check() {
        let m = meta("2026-12-05T10:00:00Z", "2026-12-05T11:00:00Z");
        let ok = kept("2026-12-05T10:59:59.5Z", DIGEST);
        let stale = kept("2026-12-05T09:00:00Z", DIGEST);
        let forged = kept("2026-12-05T10:30:00Z", "sha256:nothex");
        let mut other = ok.clone();
        other.name = "cp-5".into();
        let answer = |ks: Vec<Kept>| Asked::Answer(Answer { admissions: ks });
        let l = judge(
            &[answer(vec![stale.clone()]), answer(vec![ok.clone()])],
            "TalosMachine",
            &m,
            "DELETE",
        );
        assert_eq!(
            l.admission.as_ref().map(|a| a.decision.as_str()),
            Some("d-2026-12-05T10:59:59.5Z")
        );
        assert_eq!(l.why, None);
        let l = judge(&[answer(vec![stale, forged])], "TalosMachine", &m, "DELETE");
        assert_eq!(l, Linked::missing("not-this-object"));
        // Another object's of the same name, within this one's lifetime: its uid tells.
        let mut predecessor = ok.clone();
        predecessor.admission.object_uid = "u-1".into();
        let l = judge(&[answer(vec![predecessor])], "TalosMachine", &m, "DELETE");
        assert_eq!(l, Linked::missing("uid-mismatch"));
        let mut unnamed = ok.clone();
        unnamed.admission.object_uid.clear();
        let l = judge(&[answer(vec![unnamed])], "TalosMachine", &m, "DELETE");
        assert_eq!(l, Linked::missing("no-uid"));
        let l = judge(
            &[answer(vec![other]), answer(vec![])],
            "TalosMachine",
            &m,
            "DELETE",
        );
        assert_eq!(l, Linked::missing("not-found"));
        let l = judge(
            &[answer(vec![]), Asked::Failed("forbidden")],
            "TalosMachine",
            &m,
            "DELETE",
        );
        assert_eq!(l, Linked::missing("forbidden"));
        let l = judge(
            &[answer(vec![ok]), Asked::Failed("timeout")],
            "TalosMachine",
            &m,
            "DELETE",
        );
        assert!(l.admission.is_some(), "one replica's answer is enough");
    }

    #[test]
    fn a_lookup_url_must_be_https_with_a_host() {
        let cfg = |url: &str| LookupConfig {
            url: url.into(),
            ca: PathBuf::from("ca.crt"),
            peers: None,
            token: PathBuf::from("token"),
            timeout: Duration::from_secs(1),
        };
        let m = Arc::new(Metrics::default());
        assert!(Lookup::new(cfg("http://a:8080/admissions"), m.clone()).is_err());
        assert!(Lookup::new(cfg("https://a:8080/admissions?x=1"), m.clone()).is_err());
        let l = Lookup::new(cfg("https://ichor.ns.svc:8080"), m).expect("good");
        assert_eq!(
            (l.host.as_str(), l.port, l.path.as_str()),
            ("ichor.ns.svc", 8080, PATH)
        );
    }
}
