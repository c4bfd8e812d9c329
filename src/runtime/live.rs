//! Live, uncached reads from the API server: what a decision's rows need, read right now
//! through the kube client (no reflector, no informer cache), each bounded in time and in
//! size. A read that fails or times out fails the decision closed, and so does an answer
//! that is partial or contradicts the request: a LIST is read page by page to its end
//! (`limit`/`continue`), and every object in an answer must be of the kind, namespace and
//! name asked for, with the fields a decision needs. The decision never sees a partial list.

use super::facts::{EventFacts, Subject};
use super::objects::{
    API_VERSION, Object, Snapshot, TalosCluster, TalosMachine, TalosOperation, typed_object,
};
use crate::compile::Table;
use crate::vocab::{FACTS, Read};
use kube::api::{GetParams, ListParams};
use kube::{Api, Client};
use serde_json::Value;
use std::collections::HashSet;
use std::time::Duration;

/// Which kinds a decision must read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// One LIST of the namespace's TalosMachines.
    pub machines: bool,
    /// One GET of each TalosCluster the events are about.
    pub clusters: bool,
    /// One LIST of the namespace's TalosOperations.
    pub operations: bool,
}

/// Whether any fact of `mask` is computed from `read` (the one declaration is `FACTS`).
fn any(mask: u32, read: Read) -> bool {
    FACTS
        .iter()
        .any(|f| f.read == read && mask & (1 << f.fact.slot()) != 0)
}

impl Reads {
    /// What the rows of these events may read. Events without rows read nothing.
    pub fn for_events(table: &Table, events: &[EventFacts<'_>]) -> Reads {
        let mut r = Reads::default();
        for ev in events {
            let (verb, subject, site) = ev.event;
            let mask = table.facts_read(verb, subject, site);
            r.machines |= any(mask, Read::Machines);
            // A request about a TalosCluster carries the cluster itself.
            r.clusters |= any(mask, Read::Cluster) && !matches!(ev.subject, Subject::Cluster(_));
            r.operations |= any(mask, Read::Operations);
        }
        r
    }

    pub fn is_empty(&self) -> bool {
        !(self.machines || self.clusters || self.operations)
    }
}

/// Why a live read failed. `Display` is the one short sentence a refusal carries (what
/// could not be read, and why in a few words); [`LiveError::detail`] is for the log.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("{what} could not be read (no answer within {} ms)", timeout.as_millis())]
    Timeout { what: String, timeout: Duration },
    /// The request did not get an answer: connection refused, TLS, a broken body.
    #[error("{what} could not be read (the API server could not be reached)")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The API server answered with an error status.
    #[error(
        "{what} could not be read (the API server answered {code}{})",
        short_reason(reason)
    )]
    Status {
        what: String,
        code: u16,
        reason: String,
        message: String,
    },
    /// The answer is partial, malformed, or contradicts the request.
    #[error("{what} could not be read ({why})")]
    Invalid { what: String, why: String },
}

/// A Kubernetes `reason` (CamelCase, such as `InternalError`) for a message; anything else
/// the server put there stays in the log.
fn short_reason(reason: &str) -> String {
    if !reason.is_empty() && reason.len() <= 40 && reason.chars().all(|c| c.is_ascii_alphabetic()) {
        format!(" {reason}")
    } else {
        String::new()
    }
}

/// At most `max` characters of `s`, control characters escaped: server-chosen text in a
/// message stays one short line.
fn clip(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).flat_map(char::escape_debug).collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

impl LiveError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            LiveError::Timeout { .. } => "timeout",
            LiveError::Api { .. } | LiveError::Status { .. } => "api",
            LiveError::Invalid { .. } => "invalid",
        }
    }

    /// Everything known about the failure, for the log (never for a refusal message).
    pub fn detail(&self) -> String {
        match self {
            LiveError::Timeout { .. } | LiveError::Invalid { .. } => self.to_string(),
            LiveError::Api { source, .. } => {
                let mut out = format!("{self}: {source}");
                let mut cause = std::error::Error::source(source);
                while let Some(c) = cause {
                    out.push_str(&format!(": {c}"));
                    cause = c.source();
                }
                out
            }
            LiveError::Status {
                reason, message, ..
            } => format!(
                "{self}: reason {:?}, message {:?}",
                clip(reason, 200),
                clip(message, 1000)
            ),
        }
    }
}

/// Items asked for per page of a LIST.
const PAGE: u32 = 500;
/// The most pages one LIST may take: a server that keeps answering `continue` past this is
/// a failed read, not an endless one.
const MAX_PAGES: usize = 200;
/// The most bytes one answer of the API server may be.
const MAX_ANSWER: usize = 32 * 1024 * 1024;

/// Every object a LIST matches, read page by page to its end (`limit`/`continue`), for
/// reads outside [`LiveReader`] (the pods a drain must move): a first page is never taken
/// for the whole list. A list that repeats a `continue` token, or has not ended after
/// [`MAX_PAGES`] pages, is an error.
pub async fn list_complete<K>(api: &Api<K>, params: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let incomplete = |why: &str| {
        kube::Error::Api(Box::new(
            kube::core::Status::failure(&format!("an incomplete list: {why}"), "IncompleteList")
                .with_code(500),
        ))
    };
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut page_params = params.clone().limit(PAGE);
        if let Some(t) = &token {
            page_params = page_params.continue_token(t);
        }
        let page = api.list(&page_params).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            None => return Ok(out),
            Some(t) if token.as_deref() == Some(t.as_str()) => {
                return Err(incomplete(
                    "the API server answered the same `continue` token twice",
                ));
            }
            Some(t) => token = Some(t),
        }
    }
    Err(incomplete(&format!(
        "the list did not end within {MAX_PAGES} pages of {PAGE}"
    )))
}

/// Reads live state for decisions.
#[derive(Clone)]
pub struct LiveReader {
    client: Client,
    timeout: Duration,
}

/// Whether `s` is a Kubernetes object name (an RFC 1123 subdomain): anything else cannot
/// name an object, and would not make a sound URL path.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Whether `s` is a namespace name (an RFC 1123 label).
pub fn valid_namespace(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && valid_name(s)
}

fn str_at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

/// Checks that an object of an answer is what was asked for: one of `kind`, in
/// `namespace`, named `name` when one was asked for; then types it.
fn check_object(
    kind: &'static str,
    namespace: &str,
    name: Option<&str>,
    value: Value,
) -> Result<Object, String> {
    let found_kind = (str_at(&value, &["apiVersion"]), str_at(&value, &["kind"]));
    if found_kind != (Some(API_VERSION), Some(kind)) {
        return Err(format!(
            "the answer holds a {} {} where a {API_VERSION} {kind} was asked for",
            clip(found_kind.0.unwrap_or("(no apiVersion)"), 64),
            clip(found_kind.1.unwrap_or("(no kind)"), 64),
        ));
    }
    let found_name = str_at(&value, &["metadata", "name"]).unwrap_or("");
    if found_name.is_empty() {
        return Err(format!("the answer holds a {kind} without a name"));
    }
    if let Some(name) = name
        && found_name != name
    {
        return Err(format!(
            "the answer is {kind} `{}`, not the `{name}` asked for",
            clip(found_name, 64)
        ));
    }
    match str_at(&value, &["metadata", "namespace"]) {
        Some(ns) if ns == namespace => {}
        Some(ns) => {
            return Err(format!(
                "the answer holds {kind} `{}` of namespace `{}`, not of `{namespace}`",
                clip(found_name, 64),
                clip(ns, 64)
            ));
        }
        None => {
            return Err(format!(
                "the answer holds {kind} `{}` without a namespace",
                clip(found_name, 64)
            ));
        }
    }
    let label = clip(found_name, 64);
    typed_object(kind, value).map_err(|e| {
        format!(
            "{kind} `{label}` of the answer is not valid: {}",
            clip(&e, 200)
        )
    })
}

/// The objects of one page of a LIST of `kind` in `namespace`, and its `continue` token.
fn check_page(
    kind: &'static str,
    namespace: &str,
    page: Value,
) -> Result<(Vec<Object>, Option<String>), String> {
    let Value::Object(mut page) = page else {
        return Err("the answer is not an object".into());
    };
    let list_kind = format!("{kind}List");
    let found = (
        page.get("apiVersion").and_then(Value::as_str),
        page.get("kind").and_then(Value::as_str),
    );
    if found != (Some(API_VERSION), Some(list_kind.as_str())) {
        return Err(format!(
            "the answer is a {} {}, not a {API_VERSION} {list_kind}",
            clip(found.0.unwrap_or("(no apiVersion)"), 64),
            clip(found.1.unwrap_or("(no kind)"), 64),
        ));
    }
    let next = match page.get("metadata").and_then(|m| m.get("continue")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("its `metadata.continue` is not a string".into()),
    };
    let items = match page.remove("items") {
        Some(Value::Array(items)) => items,
        Some(Value::Null) | None => return Err("its `items` is missing or null".into()),
        Some(_) => return Err("its `items` is not a list".into()),
    };
    let objects = items
        .into_iter()
        .map(|item| check_object(kind, namespace, None, item))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((objects, next))
}

/// What an answer said.
enum Answer {
    Found(Value),
    NotFound,
}

impl LiveReader {
    pub fn new(client: Client, timeout: Duration) -> LiveReader {
        LiveReader { client, timeout }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn bounded<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, LiveError>>,
    ) -> Result<T, LiveError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(LiveError::Timeout {
                what: what.to_string(),
                timeout: self.timeout,
            }),
        }
    }

    /// Sends one request; a 2xx answer must be one JSON value of at most [`MAX_ANSWER`]
    /// bytes. A 404 is `NotFound`; any other status is an error.
    async fn send(
        &self,
        what: &str,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<Answer, LiveError> {
        let invalid = |why: String| LiveError::Invalid {
            what: what.to_string(),
            why,
        };
        let request = request.map_err(|e| invalid(format!("the request cannot be made: {e}")))?;
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(|source| LiveError::Api {
                what: what.to_string(),
                source,
            })?;
        let code = response.status();
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), MAX_ANSWER)
            .await
            .map_err(|e| {
                invalid(format!(
                    "the answer was cut off or is larger than {MAX_ANSWER} bytes: {e}"
                ))
            })?;
        if code == http::StatusCode::NOT_FOUND {
            return Ok(Answer::NotFound);
        }
        if !code.is_success() {
            let status: kube::core::Status = serde_json::from_slice(&body).unwrap_or_default();
            return Err(LiveError::Status {
                what: what.to_string(),
                code: code.as_u16(),
                reason: status.reason,
                message: if status.message.is_empty() {
                    String::from_utf8_lossy(&body[..body.len().min(1000)]).into_owned()
                } else {
                    status.message
                },
            });
        }
        serde_json::from_slice(&body)
            .map(Answer::Found)
            .map_err(|e| invalid(format!("the answer is not valid JSON: {e}")))
    }

    /// Every object of `kind` in `namespace`, read page by page to the end.
    async fn list_all(
        &self,
        what: &str,
        kind: &'static str,
        url: &str,
        namespace: &str,
    ) -> Result<Vec<Object>, LiveError> {
        let invalid = |why: String| LiveError::Invalid {
            what: what.to_string(),
            why,
        };
        let request = kube::core::Request::new(url);
        let mut out = Vec::new();
        let mut names = HashSet::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params = ListParams::default().limit(PAGE);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let page = match self.send(what, request.list(&params)).await? {
                Answer::Found(v) => v,
                Answer::NotFound => {
                    return Err(invalid(
                        "the API server answered 404: is the CustomResourceDefinition installed?"
                            .into(),
                    ));
                }
            };
            let (objects, next) = check_page(kind, namespace, page).map_err(&invalid)?;
            for o in objects {
                let name = match &o {
                    Object::Machine(m) => m.name().to_string(),
                    Object::Cluster(c) => c.name().to_string(),
                    Object::Operation(op) => op.name().to_string(),
                };
                if !names.insert(name.clone()) {
                    return Err(invalid(format!(
                        "the answer lists {kind} `{}` twice",
                        clip(&name, 64)
                    )));
                }
                out.push(o);
            }
            match next {
                None => return Ok(out),
                Some(t) if token.as_deref() == Some(t.as_str()) => {
                    return Err(invalid(
                        "the API server answered the same `continue` token twice".into(),
                    ));
                }
                Some(t) => token = Some(t),
            }
        }
        Err(invalid(format!(
            "the list did not end within {MAX_PAGES} pages of {PAGE}"
        )))
    }

    /// One TalosCluster, or `None` when the API server says it does not exist.
    async fn get_cluster(
        &self,
        what: &str,
        url: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<TalosCluster>, LiveError> {
        let request = kube::core::Request::new(url).get(name, &GetParams::default());
        match self.send(what, request).await? {
            Answer::NotFound => Ok(None),
            Answer::Found(v) => match check_object("TalosCluster", namespace, Some(name), v) {
                Ok(Object::Cluster(c)) => Ok(Some(c)),
                Ok(_) => Err(LiveError::Invalid {
                    what: what.to_string(),
                    why: "the answer is not a TalosCluster".into(),
                }),
                Err(why) => Err(LiveError::Invalid {
                    what: what.to_string(),
                    why,
                }),
            },
        }
    }

    /// Reads what `reads` asks for in `namespace`, concurrently; `clusters` names the
    /// TalosClusters to GET. A namespace or cluster name that cannot name an object is a
    /// failed read (it would not make a sound URL either).
    pub async fn snapshot(
        &self,
        namespace: &str,
        clusters: &[&str],
        reads: Reads,
    ) -> Result<Snapshot, LiveError> {
        if !reads.is_empty() && !valid_namespace(namespace) {
            return Err(LiveError::Invalid {
                what: format!("the objects of namespace `{}`", clip(namespace, 64)),
                why: "that is not a valid namespace name".into(),
            });
        }
        let machines = async {
            if !reads.machines {
                return Ok(Vec::new());
            }
            let api: Api<TalosMachine> = Api::namespaced(self.client.clone(), namespace);
            let what = format!("the TalosMachines of namespace `{namespace}`");
            let objects = self
                .bounded(
                    &what,
                    self.list_all(&what, "TalosMachine", api.resource_url(), namespace),
                )
                .await?;
            Ok::<_, LiveError>(
                objects
                    .into_iter()
                    .filter_map(|o| match o {
                        Object::Machine(m) => Some(m),
                        _ => None,
                    })
                    .collect(),
            )
        };
        let operations = async {
            if !reads.operations {
                return Ok(Vec::new());
            }
            let api: Api<TalosOperation> = Api::namespaced(self.client.clone(), namespace);
            let what = format!("the TalosOperations of namespace `{namespace}`");
            let objects = self
                .bounded(
                    &what,
                    self.list_all(&what, "TalosOperation", api.resource_url(), namespace),
                )
                .await?;
            Ok::<_, LiveError>(
                objects
                    .into_iter()
                    .filter_map(|o| match o {
                        Object::Operation(op) => Some(op),
                        _ => None,
                    })
                    .collect(),
            )
        };
        let cluster_reads = async {
            let mut out = Vec::new();
            if !reads.clusters {
                return Ok(out);
            }
            let api: Api<TalosCluster> = Api::namespaced(self.client.clone(), namespace);
            for name in clusters {
                if name.is_empty() {
                    continue;
                }
                let what = format!("TalosCluster `{namespace}/{}`", clip(name, 64));
                if !valid_name(name) {
                    return Err(LiveError::Invalid {
                        what,
                        why: "that is not a valid object name".into(),
                    });
                }
                let got = self
                    .bounded(
                        &what,
                        self.get_cluster(&what, api.resource_url(), namespace, name),
                    )
                    .await?;
                out.extend(got);
            }
            Ok::<_, LiveError>(out)
        };
        let (machines, operations, clusters) = tokio::join!(machines, operations, cluster_reads);
        Ok(Snapshot {
            machines: machines?,
            clusters: clusters?,
            operations: operations?,
        })
    }
}

#[cfg(test)]
mod read_declarations {
    use super::*;
    use crate::interp::{Facts, Lookup};
    use crate::runtime::facts::{EventFacts, Expensive, SnapshotFacts};
    use crate::vocab::{RUNTIME_EVENTS, Site, Subject as S};

    fn snapshot() -> Snapshot {
        let v = |j: serde_json::Value| j;
        let machine = |n: &str, minute: u32, unreachable: bool| {
            let mut m = v(serde_json::json!({
                "apiVersion": API_VERSION, "kind": "TalosMachine",
                "metadata": {"name": n, "namespace": "ns"},
                "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true,
                         "approvalDecision": {"at": format!("2026-11-01T10:{minute:02}:00Z")}}
            }));
            if unreachable {
                m["status"] = serde_json::json!({"conditions": [
                    {"type": "Ready", "status": "False", "reason": "NodeUnreachable"}]});
            }
            serde_json::from_value::<TalosMachine>(m).expect("machine")
        };
        let cluster: TalosCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION, "kind": "TalosCluster",
            "metadata": {"name": "prod", "namespace": "ns"},
            "spec": {"controlPlane": {"count": 3}, "schedulable": "false"}
        }))
        .expect("cluster");
        let op = |n: &str, phase: &str| -> TalosOperation {
            serde_json::from_value(serde_json::json!({
                "apiVersion": API_VERSION, "kind": "TalosOperation",
                "metadata": {"name": n, "namespace": "ns"},
                "spec": {"clusterRef": {"name": "prod"}, "kind": "reset", "machine": "cp-1"},
                "status": {"phase": phase}
            }))
            .expect("operation")
        };
        Snapshot {
            machines: vec![
                machine("cp-1", 1, false),
                machine("cp-2", 2, true),
                machine("cp-3", 3, false),
                machine("cp-4", 4, false),
            ],
            clusters: vec![cluster],
            operations: vec![op("op-1", "Pending"), op("op-2", "Running")],
        }
    }

    /// Every fact, computed from only the reads its declaration names (plus the request's
    /// own object), is what it is from everything: a fact declared with too few reads
    /// would decide on an empty list.
    #[test]
    fn each_fact_needs_no_read_but_the_one_it_declares() {
        let full = snapshot();
        for info in FACTS {
            let Some(&(verb, subject, site)) = RUNTIME_EVENTS
                .iter()
                .find(|(v, s, site)| info.fact.available(*v, *s, *site) && *site == Site::Webhook)
            else {
                continue;
            };
            let mut part = Snapshot::default();
            match info.read {
                Read::Machines => part.machines = full.machines.clone(),
                Read::Cluster => part.clusters = full.clusters.clone(),
                Read::Operations => part.operations = full.operations.clone(),
                Read::Request => {}
            }
            let value = |snap: &Snapshot| -> String {
                let ev = match subject {
                    S::Operation => EventFacts {
                        event: (verb, subject, site),
                        namespace: "ns",
                        cluster: "prod",
                        subject: crate::runtime::facts::Subject::Operation(&full.operations[1]),
                    },
                    S::Cluster => EventFacts {
                        event: (verb, subject, site),
                        namespace: "ns",
                        cluster: "prod",
                        subject: crate::runtime::facts::Subject::Cluster(&full.clusters[0]),
                    },
                    _ => EventFacts {
                        event: (verb, subject, site),
                        namespace: "ns",
                        cluster: "prod",
                        subject: crate::runtime::facts::Subject::Machine {
                            name: "cp-1",
                            view: &full.machines[0],
                            counted: Some(&full.machines[0]),
                        },
                    },
                };
                let mut f = SnapshotFacts::new(snap, ev, Expensive::FromObjects);
                match f.fact(info.fact) {
                    Lookup::Value(v) => format!("{v:?}"),
                    Lookup::Later => "later".into(),
                }
            };
            assert_eq!(
                value(&part),
                value(&full),
                "`{}` is declared as read from {:?}, but needs more",
                info.name,
                info.read
            );
        }
    }
}
