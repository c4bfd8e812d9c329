//! The link from a controller's records to the admission that let its work in, when the
//! webhook and the controller run in different processes (the chart's two Deployments):
//! the webhook answers `GET /admissions?kind=…&namespace=…&name=…&operation=…` on its
//! metrics port, behind the same TokenReview + SubjectAccessReview as `/metrics`
//! (`runtime::metrics_auth`, non-resource URL `/admissions`, verb `get`), with the
//! admissions it keeps (`step_records::Admissions`: of the newest 4096 names, up to 4
//! each); the controller asks every webhook replica ([`Lookup`]: `serve --admissions-url`,
//! `--admissions-peers`) with its ServiceAccount token when its own process holds no
//! admission for the object, and links one only when the one check of both paths chooses
//! it among all the replicas answered ([`choose`]: exactly one candidate, none dropped,
//! of rules this process loaded). A lookup that fails never delays a step past its timeout: the
//! record then says why (`admission_lookup`, one of [`REASONS`]) and the failure is
//! counted (`ichor_rules_admission_lookup_failures_total{reason}`).

use super::metrics::Metrics;
use super::step_records::{
    ADMISSIONS_PER_KEY, Admission, Admissions, DROPPED_KEPT, UID_LIMIT, admits_work, choose,
};
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
pub const REASONS: [&str; 11] = [
    "not-found",
    "not-this-object",
    "uid-mismatch",
    "no-uid",
    "ambiguous",
    "digest-unknown",
    "timeout",
    "unauthorized",
    "forbidden",
    "unavailable",
    "bad-answer",
];

/// The most bytes of an answer read: an answer [`Answer::check`] accepts is at most
/// [`ADMISSIONS_PER_KEY`] admissions of a few hundred bytes each (names of at most 253
/// and 63 bytes, uids of at most [`UID_LIMIT`]) and [`DROPPED_KEPT`] uids, under 8 KiB.
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

/// The answer of `/admissions`: every admission kept of the name and operation asked (the
/// oldest first), and whose were dropped to keep them bounded
/// (`step_records::KeptAdmissions`). A webhook of an older version answers `admissions`
/// alone (at most one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub admissions: Vec<Kept>,
    /// The object uids whose admissions were dropped for newer ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_uids: Vec<String>,
    /// More uids' admissions were dropped than `dropped_uids` holds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overflowed: bool,
}

impl Answer {
    /// Whether this answer is one a webhook could give (the bounds it keeps); the error
    /// says what is wrong, for the log. An answer past them is no webhook's and counts as
    /// `bad-answer`: nothing of it is taken.
    pub fn check(&self) -> Result<(), String> {
        if self.admissions.len() > ADMISSIONS_PER_KEY {
            return Err(format!(
                "{} admissions of one name and operation (a webhook keeps at most {ADMISSIONS_PER_KEY})",
                self.admissions.len()
            ));
        }
        if self.dropped_uids.len() > DROPPED_KEPT {
            return Err(format!(
                "{} dropped uids (a webhook keeps at most {DROPPED_KEPT})",
                self.dropped_uids.len()
            ));
        }
        if let Some(u) = self.dropped_uids.iter().find(|u| u.len() > UID_LIMIT) {
            return Err(format!(
                "a dropped uid of {} bytes (at most {UID_LIMIT})",
                u.len()
            ));
        }
        for (i, k) in self.admissions.iter().enumerate() {
            let a = &k.admission;
            let fields = [
                ("kind", k.kind.len(), 64),
                ("namespace", k.namespace.len(), 63),
                ("name", k.name.len(), 253),
                ("decision", a.decision.len(), 64),
                ("request_uid", a.request_uid.len(), UID_LIMIT),
                ("object_uid", a.object_uid.len(), UID_LIMIT),
                ("operation", a.operation.len(), 16),
                ("digest", a.digest.len(), 128),
                ("time", a.time.len(), 64),
            ];
            if let Some((field, len, limit)) = fields.iter().find(|(_, len, limit)| len > limit) {
                return Err(format!(
                    "admission {i}: `{field}` of {len} bytes (at most {limit})"
                ));
            }
            if a.decision.is_empty() {
                return Err(format!("admission {i}: `decision` is empty"));
            }
        }
        Ok(())
    }
}

/// Answers `GET /admissions` (the caller already allowed): 400 for a bad query, else the
/// kept admissions of the object and operation asked, and whose were dropped.
/// `admissions`: `None` when this process keeps none (`--decision-log off`: no decision
/// ids to link to).
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
    let found = admissions
        .map(|a| a.kept(&q.kind, &q.namespace, &q.name, &q.operation))
        .unwrap_or_default();
    let body = Answer {
        dropped_uids: found.dropped_uids,
        overflowed: found.overflowed,
        admissions: found
            .admissions
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

    /// The admission that let `operation` on the object `meta` (a `kind`) in, as the webhook
    /// replicas kept it and [`choose`] chooses it among all they answered (`known`: the
    /// rule-set digests this process has loaded); or why there is none. Takes at most the
    /// lookup's timeout; answers are kept [`FOUND_FOR`] (found) or [`MISSED_FOR`] (not
    /// found, failed) per object.
    pub async fn find(
        &self,
        kind: &str,
        meta: &ObjectMeta,
        operation: &str,
        known: &[String],
    ) -> Linked {
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
        let linked = self.ask_all(kind, meta, operation, known, deadline).await;
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
        known: &[String],
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
        judge(&answers, kind, meta, operation, known)
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
            Ok(a) => match a.check() {
                Ok(()) => Ok(Asked::Answer(a)),
                Err(e) => {
                    tracing::warn!(%addr, error = %e, "the webhook's admissions are past what a webhook keeps");
                    Ok(Asked::Failed("bad-answer"))
                }
            },
            Err(e) => {
                tracing::warn!(%addr, error = %e, "the webhook's admissions are not JSON of admissions");
                Ok(Asked::Failed("bad-answer"))
            }
        }
    }
}

/// Whether `why` says admissions were kept and the check refused them, or none was kept:
/// no failure of the lookup (not counted in the failure metric).
pub fn is_refusal(why: &str) -> bool {
    matches!(
        why,
        "not-found"
            | "not-this-object"
            | "uid-mismatch"
            | "no-uid"
            | "ambiguous"
            | "digest-unknown"
    )
}

/// The replicas' answers together, judged by the one check of both paths ([`choose`]) as
/// if one webhook had kept them all: the one admission of this object that let it in,
/// when every replica answered (one that did not may hold another candidate, or the real
/// one beside a forged one); else `ambiguous` when those that answered hold more than one
/// candidate, or dropped one; else why a replica could not be asked; else why the check
/// refused what was kept (`uid-mismatch`: another object's of the same name; `no-uid`;
/// `not-this-object`; `digest-unknown`), or `not-found`.
fn judge(
    answers: &[Asked],
    kind: &str,
    meta: &ObjectMeta,
    operation: &str,
    known: &[String],
) -> Linked {
    if answers.is_empty() {
        return Linked::missing("unavailable");
    }
    let (namespace, name, uid) = (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default(),
    );
    let mut dropped = false;
    let mut kept: Vec<&Admission> = Vec::new();
    for a in answers {
        let Asked::Answer(answer) = a else { continue };
        dropped |= answer.overflowed || answer.dropped_uids.iter().any(|u| u == uid);
        for k in &answer.admissions {
            // The same admission answered twice (one replica asked at two addresses) is one.
            if k.kind == kind
                && k.namespace == namespace
                && k.name == name
                && !kept.iter().any(|seen| **seen == k.admission)
            {
                kept.push(&k.admission);
            }
        }
    }
    let failed = answers.iter().find_map(|a| match a {
        Asked::Failed(why) => Some(*why),
        Asked::Answer(_) => None,
    });
    match (choose(kept, dropped, meta, operation, known), failed) {
        (Ok(a), None) => Linked {
            admission: Some(a.clone()),
            why: None,
        },
        (Err("ambiguous"), _) => Linked::missing("ambiguous"),
        (_, Some(why)) => Linked::missing(why),
        (Err(why), None) => Linked::missing(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn known() -> Vec<String> {
        vec![DIGEST.to_string()]
    }

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
        let answer = |ks: Vec<Kept>| {
            Asked::Answer(Answer {
                admissions: ks,
                ..Answer::default()
            })
        };
        let l = judge(
            &[answer(vec![stale.clone()]), answer(vec![ok.clone()])],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(
            l.admission.as_ref().map(|a| a.decision.as_str()),
            Some("d-2026-12-05T10:59:59.5Z")
        );
        assert_eq!(l.why, None);
        let l = judge(
            &[answer(vec![stale, forged])],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(l, Linked::missing("not-this-object"));
        // Another object's of the same name, within this one's lifetime: its uid tells.
        let mut predecessor = ok.clone();
        predecessor.admission.object_uid = "u-1".into();
        let l = judge(
            &[answer(vec![predecessor])],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(l, Linked::missing("uid-mismatch"));
        let mut unnamed = ok.clone();
        unnamed.admission.object_uid.clear();
        let l = judge(
            &[answer(vec![unnamed])],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(l, Linked::missing("no-uid"));
        let l = judge(
            &[answer(vec![other]), answer(vec![])],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(l, Linked::missing("not-found"));
        let l = judge(
            &[answer(vec![]), Asked::Failed("forbidden")],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(l, Linked::missing("forbidden"));
        // A replica that did not answer may hold another candidate: nothing is linked.
        let l = judge(
            &[answer(vec![ok.clone()]), Asked::Failed("timeout")],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(l, Linked::missing("timeout"));
        // The same admission answered twice (one replica at two addresses) is one.
        let l = judge(
            &[answer(vec![ok.clone()]), answer(vec![ok.clone()])],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert!(l.admission.is_some(), "{l:?}");
        // A well-formed digest of rules this process never loaded.
        let l = judge(
            &[answer(vec![ok])],
            "TalosMachine",
            &m,
            "DELETE",
            &["sha256:".to_string() + &"f".repeat(64)],
        );
        assert_eq!(l, Linked::missing("digest-unknown"));
    }

    /// The replicas' answers are one webhook's memory: a forged review one replica kept
    /// beside the real one another kept links neither, whichever failed to answer; a
    /// replica that dropped an admission of this object makes the one another kept
    /// ambiguous too.
    #[test]
    fn candidates_across_replicas_are_judged_together() {
        let m = meta("2026-12-05T10:00:00Z", "2026-12-05T11:00:00Z");
        let real = kept("2026-12-05T11:00:00.2Z", DIGEST);
        let mut forged = kept("2026-12-05T11:00:00.7Z", DIGEST);
        forged.admission.request_uid = "made-up".into();
        let answer = |ks: Vec<Kept>| {
            Asked::Answer(Answer {
                admissions: ks,
                ..Answer::default()
            })
        };
        let l = judge(
            &[answer(vec![real.clone()]), answer(vec![forged.clone()])],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(l, Linked::missing("ambiguous"));
        let l = judge(
            &[answer(vec![forged.clone()]), Asked::Failed("unavailable")],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(
            l,
            Linked::missing("unavailable"),
            "the real one may be there"
        );
        let dropped = Asked::Answer(Answer {
            dropped_uids: vec!["u-2".into()],
            ..Answer::default()
        });
        let l = judge(
            &[answer(vec![real.clone()]), dropped],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(l, Linked::missing("ambiguous"));
        let other = Asked::Answer(Answer {
            dropped_uids: vec!["u-9".into()],
            ..Answer::default()
        });
        let l = judge(
            &[answer(vec![real.clone()]), other],
            "TalosMachine",
            &m,
            "DELETE",
            &known(),
        );
        assert_eq!(
            l.admission.map(|a| a.decision),
            Some(real.admission.decision)
        );
    }

    /// An answer past what a webhook keeps is refused whole, with a message saying what;
    /// one of an older webhook (`admissions` alone) parses.
    #[test]
    fn hostile_answers_are_refused_whole() {
        let ok = kept("2026-12-05T11:00:00.2Z", DIGEST);
        let parse = |json: &str| -> Result<(), String> {
            let a = crate::runtime::nesting::json::<Answer>(json.as_bytes())
                .map_err(|e| e.to_string())?;
            a.check()
        };
        let one = serde_json::to_string(&Answer {
            admissions: vec![ok.clone()],
            ..Answer::default()
        })
        .expect("JSON");
        assert!(
            !one.contains("dropped_uids") && !one.contains("overflowed"),
            "{one}"
        );
        assert_eq!(parse(&one), Ok(()));
        let many = Answer {
            admissions: vec![ok.clone(); ADMISSIONS_PER_KEY + 1],
            ..Answer::default()
        };
        let e = many.check().expect_err("too many");
        assert!(e.contains("5 admissions") && e.contains("at most 4"), "{e}");
        let uids = Answer {
            dropped_uids: vec!["u".into(); DROPPED_KEPT + 1],
            ..Answer::default()
        };
        assert!(uids.check().expect_err("too many").contains("dropped uids"));
        let mut long = ok.clone();
        long.admission.request_uid = "r".repeat(UID_LIMIT + 1);
        let e = Answer {
            admissions: vec![ok.clone(), long],
            ..Answer::default()
        }
        .check()
        .expect_err("long");
        assert!(e.contains("admission 1: `request_uid` of 129 bytes"), "{e}");
        let mut empty = ok;
        empty.admission.decision.clear();
        assert!(
            Answer {
                admissions: vec![empty],
                ..Answer::default()
            }
            .check()
            .is_err()
        );
        assert!(parse(r#"{"admissions":[],"overflowed":"yes"}"#).is_err());
        assert!(parse(r#"{"admissions":[],"dropped_uids":[1]}"#).is_err());
        assert_eq!(parse(r#"{"admissions":[],"overflowed":true}"#), Ok(()));
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
