//! The AdmissionReview v1 envelope: parse a request, and answer it from a decision. The
//! deciding itself is in [`super::decide`]; this module only unwraps and wraps.

use super::objects::{API_VERSION, MAX_NESTING, Object, typed_object_text};
use crate::interp::Decision;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::StatusSummary;

/// A request, with its objects typed.
pub struct Request {
    pub inner: AdmissionRequest<DynamicObject>,
    pub namespace: String,
    /// Our kind, or `None` for a kind the rules do not decide about.
    pub kind: Option<&'static str>,
    pub old: Option<Object>,
    pub new: Option<Object>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error(
        "line {line}, column {column}: nested more than {MAX_NESTING} levels deep; an AdmissionReview nests far less"
    )]
    TooDeep { line: usize, column: usize },
    #[error("not JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("not an AdmissionReview v1: {0}")]
    NotReview(String),
    #[error("the {which} of the request is not a valid {kind}: {message}")]
    BadObject {
        which: &'static str,
        kind: &'static str,
        message: String,
    },
}

impl ReviewError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReviewError::TooDeep { .. } | ReviewError::Json(_) => "json",
            ReviewError::NotReview(_) => "not_review",
            ReviewError::BadObject { .. } => "bad_object",
        }
    }
}

impl Request {
    pub fn operation(&self) -> &Operation {
        &self.inner.operation
    }

    pub fn uid(&self) -> &str {
        &self.inner.uid
    }

    /// The uid of the object the request is about: `oldObject`'s (an UPDATE, a DELETE), else
    /// `object`'s (a CREATE: the API server stamps a new object's uid before it asks a
    /// validating webhook). Empty when the review carries none.
    pub fn object_uid(&self) -> &str {
        self.inner
            .old_object
            .as_ref()
            .and_then(|o| o.metadata.uid.as_deref())
            .or_else(|| {
                self.inner
                    .object
                    .as_ref()
                    .and_then(|o| o.metadata.uid.as_deref())
            })
            .unwrap_or("")
    }

    /// `request.dryRun`: the API server will persist nothing of it.
    pub fn dry_run(&self) -> bool {
        self.inner.dry_run
    }

    /// Whether the request was made by the controller's own identity: its
    /// `userInfo.username` is exactly `controller_username` (`request.by_controller`). No
    /// configured name trusts no one.
    pub fn by_controller(&self, controller_username: Option<&str>) -> bool {
        match (
            controller_username,
            self.inner.user_info.username.as_deref(),
        ) {
            (Some(ours), Some(theirs)) => !ours.is_empty() && ours == theirs,
            _ => false,
        }
    }
}

/// The envelope of a review, read without building a tree of it: its type, and the text of
/// its request (parsed typed once, below).
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<serde_json::Value>,
    #[serde(default)]
    kind: Option<serde_json::Value>,
    #[serde(borrow, default)]
    request: Option<&'a serde_json::value::RawValue>,
}

/// The texts of a request's objects, typed once each (as our kind, in [`typed`]).
#[derive(serde::Deserialize)]
struct ObjectTexts<'a> {
    #[serde(borrow, default)]
    object: Option<&'a serde_json::value::RawValue>,
    #[serde(rename = "oldObject", borrow, default)]
    old_object: Option<&'a serde_json::value::RawValue>,
}

/// Parses an AdmissionReview v1 body: the nesting check, the envelope (no value tree), the
/// request typed, and each of its objects typed as our kind straight from its text.
pub fn parse_review(body: &[u8]) -> Result<Request, ReviewError> {
    let envelope: Envelope<'_> = super::nesting::json_borrowed(body).map_err(|e| match e {
        super::nesting::JsonError::TooDeep(super::nesting::TooDeep { line, column }) => {
            ReviewError::TooDeep { line, column }
        }
        super::nesting::JsonError::Json(e) => ReviewError::Json(e),
    })?;
    let text = |v: &Option<serde_json::Value>| {
        v.as_ref()
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let (api_version, kind) = (text(&envelope.api_version), text(&envelope.kind));
    if kind != "AdmissionReview" || api_version != "admission.k8s.io/v1" {
        return Err(ReviewError::NotReview(format!(
            "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, found {:?} {:?}",
            api_version, kind
        )));
    }
    let Some(request) = envelope.request.filter(|r| r.get() != "null") else {
        return Err(ReviewError::NotReview("it has no `request`".into()));
    };
    let mut inner: AdmissionRequest<DynamicObject> =
        serde_json::from_str(request.get()).map_err(|e| ReviewError::NotReview(e.to_string()))?;
    // What the review's own conversion to its request does: the answer echoes the type.
    inner.types = kube::core::TypeMeta { api_version, kind };
    let texts: ObjectTexts<'_> =
        serde_json::from_str(request.get()).map_err(|e| ReviewError::NotReview(e.to_string()))?;
    let namespace = inner
        .namespace
        .clone()
        .or_else(|| {
            inner
                .object
                .as_ref()
                .or(inner.old_object.as_ref())
                .and_then(|o| o.metadata.namespace.clone())
        })
        .unwrap_or_else(|| "default".into());
    let kind = if inner.kind.group == super::objects::GROUP {
        // (A TalosConfigPatch is decoded apart, with its dry render: `configpatch`.)
        [
            "TalosMachine",
            "TalosCluster",
            "TalosOperation",
            "TalosEtcdBackup",
        ]
        .into_iter()
        .find(|k| *k == inner.kind.kind)
    } else {
        None
    };
    let (mut old, mut new) = (None, None);
    if let Some(kind) = kind {
        // What the API server always sends: a request without it cannot be decided, and
        // deciding it as "no change" would let it through.
        let (needs_old, needs_new) = match inner.operation {
            Operation::Create => (false, true),
            Operation::Update => (true, true),
            Operation::Delete => (true, false),
            Operation::Connect => (false, false),
        };
        for (which, needed, present) in [
            ("oldObject", needs_old, inner.old_object.is_some()),
            ("object", needs_new, inner.object.is_some()),
        ] {
            if needed && !present {
                let op = match inner.operation {
                    Operation::Create => "CREATE",
                    Operation::Update => "UPDATE",
                    Operation::Delete => "DELETE",
                    Operation::Connect => "CONNECT",
                };
                return Err(ReviewError::NotReview(format!(
                    "a {op} of a {kind} carries `request.{which}`, and it is missing"
                )));
            }
        }
        old = typed(
            kind,
            "oldObject",
            inner.old_object.as_ref(),
            texts.old_object,
            &namespace,
        )?;
        new = typed(
            kind,
            "object",
            inner.object.as_ref(),
            texts.object,
            &namespace,
        )?;
        // One object, as the API server sends it: the request names it (unless a create
        // generates the name), and an update's old and new are the same object.
        for (which, obj) in [("oldObject", &old), ("object", &new)] {
            let found = obj.as_ref().and_then(|o| o.metadata().name.as_deref());
            if let Some(found) = found
                && !inner.name.is_empty()
                && found != inner.name
            {
                return Err(ReviewError::NotReview(format!(
                    "`request.name` is `{}`, and `request.{which}` is `{}`",
                    clip(&inner.name),
                    clip(found)
                )));
            }
        }
        let name = |o: &Option<Object>| o.as_ref().and_then(|o| o.metadata().name.clone());
        if old.is_some() && new.is_some() && name(&old) != name(&new) {
            return Err(ReviewError::NotReview(
                "`request.oldObject` and `request.object` are different objects (their names differ)"
                    .into(),
            ));
        }
    }
    Ok(Request {
        inner,
        namespace,
        kind,
        old,
        new,
    })
}

fn typed(
    kind: &'static str,
    which: &'static str,
    obj: Option<&DynamicObject>,
    text: Option<&serde_json::value::RawValue>,
    namespace: &str,
) -> Result<Option<Object>, ReviewError> {
    let (Some(obj), Some(text)) = (obj, text) else {
        return Ok(None);
    };
    let bad = |message: String| ReviewError::BadObject {
        which,
        kind,
        message,
    };
    // The object must be what the request says it is: a TalosCluster sent as a
    // TalosMachine would be read with every field defaulted.
    if let Some(types) = &obj.types
        && (types.api_version != API_VERSION || types.kind != kind)
    {
        return Err(bad(format!(
            "it is a {} {}, and the request is about a {API_VERSION} {kind}",
            clip(&types.api_version),
            clip(&types.kind)
        )));
    }
    if let Some(ns) = obj.metadata.namespace.as_deref()
        && ns != namespace
    {
        return Err(bad(format!(
            "its metadata.namespace `{}` is not the request's namespace `{}`",
            clip(ns),
            clip(namespace)
        )));
    }
    // Objects of a namespaced request may omit their namespace; the request says it.
    typed_object_text(kind, text.get(), Some(namespace))
        .map(Some)
        .map_err(|message| ReviewError::BadObject {
            which,
            kind,
            message,
        })
}

/// The refusal of an UPDATE that changes a TalosOperation's spec, which never changes once
/// created: the rules decided on the spec as it was created, and an edit (an
/// `etcd-snapshot` turned into a `reset`) would slip past them. Not a rule: no rules edit
/// lifts it. Status, labels, annotations and finalizers may change.
pub fn immutable_spec_change(req: &Request) -> Option<String> {
    if *req.operation() != Operation::Update {
        return None;
    }
    let (Some(Object::Operation(old)), Some(Object::Operation(new))) = (&req.old, &req.new) else {
        return None;
    };
    let raw = |o: &Option<DynamicObject>| o.as_ref().map(|o| o.data.get("spec").cloned());
    if old.spec == new.spec && raw(&req.inner.old_object) == raw(&req.inner.object) {
        return None;
    }
    let (o, n) = (&old.spec, &new.spec);
    let mut changed = Vec::new();
    if o.kind != n.kind {
        changed.push(format!(
            "spec.kind `{}` -> `{}`",
            clip(&o.kind),
            clip(&n.kind)
        ));
    }
    if o.machine != n.machine {
        let m = |m: &Option<String>| m.as_deref().map_or("(none)".to_string(), clip);
        changed.push(format!(
            "spec.machine `{}` -> `{}`",
            m(&o.machine),
            m(&n.machine)
        ));
    }
    if o.cluster_ref != n.cluster_ref {
        changed.push(format!(
            "spec.clusterRef.name `{}` -> `{}`",
            clip(&o.cluster_ref.name),
            clip(&n.cluster_ref.name)
        ));
    }
    if changed.is_empty() {
        changed.push("its fields".into());
    }
    Some(format!(
        "the spec of TalosOperation {}/{} cannot change once it is created ({}): the rules \
         decided on it as it was created; create a new TalosOperation for other work",
        clip(&req.namespace),
        clip(old.name()),
        changed.join(", ")
    ))
}

/// Caller-chosen text in a message: at most 80 characters, control characters escaped.
fn clip(s: &str) -> String {
    s.chars().take(80).flat_map(char::escape_debug).collect()
}

/// The answer to a request: allowed unless a rule refused; every refusal's message, and
/// every warning.
pub fn respond(req: &Request, decision: &Decision) -> AdmissionReview<DynamicObject> {
    let mut resp = AdmissionResponse::from(&req.inner);
    if !decision.refusals.is_empty() {
        let message = decision
            .refusals
            .iter()
            .map(|f| f.message.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        resp = deny(resp, message);
    }
    if !decision.warnings.is_empty() {
        resp.warnings = Some(
            decision
                .warnings
                .iter()
                .map(|f| f.message.clone())
                .collect(),
        );
    }
    resp.into_review()
}

/// A refusal not made by a rule (the live state could not be read, say).
pub fn refuse(req: &Request, message: impl Into<String>) -> AdmissionReview<DynamicObject> {
    deny(AdmissionResponse::from(&req.inner), message.into()).into_review()
}

fn deny(resp: AdmissionResponse, message: String) -> AdmissionResponse {
    let mut resp = resp.deny(message);
    resp.result.code = 403;
    resp.result.reason = "Forbidden".into();
    resp.result.status = Some(StatusSummary::Failure);
    resp
}
