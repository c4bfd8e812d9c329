//! Secrets read and written without letting their contents reach a log, an error or a
//! condition. The kube client, asked for a typed `Secret`, logs the whole answer at WARN
//! when it cannot decode it (a data value that is not base64, a field of the wrong type):
//! the webhook CA's private key, a cluster's Talos admin credentials. So every Secret the
//! operator reads or writes goes through here instead: the answer is fetched as text
//! (`Client::request_text`, which logs nothing of a successful answer), parsed as plain
//! JSON (whose errors give a line and column, never the text), and each data value is
//! decoded only when asked for, its errors naming the key and never the value. An API
//! error keeps its code and reason only (the server's message may quote the request).

use base64::Engine as _;
use kube::api::{GetParams, PostParams};
use kube::core::Request;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// A Secret as the API server answered it; its data values are decoded on demand.
#[derive(Clone, Debug)]
pub struct RawSecret {
    /// `metadata.resourceVersion` (empty when the answer has none).
    pub resource_version: String,
    /// `metadata.uid` (empty when the answer has none).
    pub uid: String,
    /// `metadata.annotations` whose values are strings (others are left out).
    pub annotations: BTreeMap<String, String>,
    /// `data`, undecoded.
    data: Map<String, Value>,
    /// `metadata` as answered, kept for a replace (labels, owners and the like survive).
    metadata: Map<String, Value>,
}

/// Why a data value cannot be used; never the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadValue {
    #[error("is not a string")]
    NotAString,
    #[error("is not base64")]
    NotBase64,
}

/// Why a Secret could not be read or written; never its content.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("the API server answered {code} {reason}")]
    Api { code: u16, reason: String },
    #[error("the API server could not be reached")]
    Unreachable,
    #[error("the API server's answer is not this Secret: {0}")]
    Malformed(&'static str),
}

impl SecretError {
    /// Whether another writer got there first (409 AlreadyExists, or Conflict on a stale
    /// resourceVersion).
    pub fn is_conflict(&self) -> bool {
        matches!(self, SecretError::Api { code: 409, .. })
    }
}

fn api_error(e: kube::Error) -> SecretError {
    match e {
        kube::Error::Api(s) => SecretError::Api {
            code: s.code,
            reason: crate::runtime::logs::escape(&s.reason)
                .chars()
                .take(64)
                .collect(),
        },
        _ => SecretError::Unreachable,
    }
}

fn path(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/secrets")
}

impl RawSecret {
    /// Parses an answer, which must be the Secret `namespace/name`.
    fn parse(text: &str, namespace: &str, name: &str) -> Result<RawSecret, SecretError> {
        let v: Value =
            serde_json::from_str(text).map_err(|_| SecretError::Malformed("not JSON"))?;
        let Value::Object(mut o) = v else {
            return Err(SecretError::Malformed("not an object"));
        };
        if o.get("kind").and_then(Value::as_str) != Some("Secret")
            || o.get("apiVersion").and_then(Value::as_str) != Some("v1")
        {
            return Err(SecretError::Malformed("another kind than v1 Secret"));
        }
        let Some(Value::Object(metadata)) = o.remove("metadata") else {
            return Err(SecretError::Malformed("no metadata"));
        };
        if metadata.get("name").and_then(Value::as_str) != Some(name) {
            return Err(SecretError::Malformed("another name"));
        }
        if metadata.get("namespace").and_then(Value::as_str) != Some(namespace) {
            return Err(SecretError::Malformed("another namespace"));
        }
        let resource_version = match metadata.get("resourceVersion") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(SecretError::Malformed("a resourceVersion that is not text")),
        };
        let uid = metadata
            .get("uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let annotations = match metadata.get("annotations") {
            Some(Value::Object(a)) => a
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect(),
            _ => BTreeMap::new(),
        };
        let data = match o.remove("data") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(d)) => d,
            Some(_) => return Err(SecretError::Malformed("data that is not a map")),
        };
        Ok(RawSecret {
            resource_version,
            uid,
            annotations,
            data,
            metadata,
        })
    }

    /// The decoded value of `key`: `Ok(None)` when the Secret has no such key.
    pub fn value(&self, key: &str) -> Result<Option<Vec<u8>>, BadValue> {
        match self.data.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => base64::engine::general_purpose::STANDARD
                .decode(s.as_bytes())
                .map(Some)
                .map_err(|_| BadValue::NotBase64),
            Some(_) => Err(BadValue::NotAString),
        }
    }

    /// The decoded value of `key` as UTF-8 text, if it is present, decodable, text and not
    /// empty.
    pub fn text(&self, key: &str) -> Option<String> {
        let bytes = self.value(key).ok()??;
        String::from_utf8(bytes).ok().filter(|s| !s.is_empty())
    }
}

/// What a Secret is written with: its data (encoded here), annotations set on it, its type.
#[derive(Clone, Debug, Default)]
pub struct Contents {
    pub type_: String,
    pub data: BTreeMap<String, Vec<u8>>,
    pub annotations: BTreeMap<String, String>,
}

impl Contents {
    /// The Secret's JSON: `metadata` (name, namespace and, for a replace, the answered
    /// metadata with its resourceVersion) with these annotations added, `type`, `data`.
    fn body(&self, mut metadata: Map<String, Value>) -> Value {
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| Value::Object(Map::new()));
        if !annotations.is_object() {
            *annotations = Value::Object(Map::new());
        }
        if let Value::Object(a) = annotations {
            for (k, v) in &self.annotations {
                a.insert(k.clone(), Value::String(v.clone()));
            }
        }
        let data: Map<String, Value> = self
            .data
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Value::String(base64::engine::general_purpose::STANDARD.encode(v)),
                )
            })
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": self.type_,
            "data": data,
        })
    }
}

/// Reads Secret `namespace/name`: `Ok(None)` when it does not exist.
pub async fn get(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<RawSecret>, SecretError> {
    let req = Request::new(path(namespace))
        .get(name, &GetParams::default())
        .map_err(|_| SecretError::Malformed("no request for this name"))?;
    match client.request_text(req).await {
        Ok(text) => RawSecret::parse(&text, namespace, name).map(Some),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(api_error(e)),
    }
}

/// Creates Secret `namespace/name` with `contents`; what the API server stored.
pub async fn create(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    contents: &Contents,
) -> Result<RawSecret, SecretError> {
    let mut metadata = Map::new();
    metadata.insert("name".into(), Value::String(name.into()));
    metadata.insert("namespace".into(), Value::String(namespace.into()));
    let body = serde_json::to_vec(&contents.body(metadata))
        .map_err(|_| SecretError::Malformed("cannot be written as JSON"))?;
    let req = Request::new(path(namespace))
        .create(&PostParams::default(), body)
        .map_err(|_| SecretError::Malformed("no request for this name"))?;
    let text = client.request_text(req).await.map_err(api_error)?;
    RawSecret::parse(&text, namespace, name)
}

/// Replaces `current` (Secret `namespace/name` as read) with `contents`, on condition
/// that it has not changed since (its resourceVersion): a 409 otherwise. Its other
/// metadata (labels, owners) is kept; its data is exactly `contents.data`.
pub async fn replace(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    current: &RawSecret,
    contents: &Contents,
) -> Result<RawSecret, SecretError> {
    let body = serde_json::to_vec(&contents.body(current.metadata.clone()))
        .map_err(|_| SecretError::Malformed("cannot be written as JSON"))?;
    let req = Request::new(path(namespace))
        .replace(name, &PostParams::default(), body)
        .map_err(|_| SecretError::Malformed("no request for this name"))?;
    let text = client.request_text(req).await.map_err(api_error)?;
    RawSecret::parse(&text, namespace, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_decoded_on_demand_and_errors_never_quote_them() {
        let text = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "namespace": "ns", "resourceVersion": "7",
                         "annotations": {"a": "b", "n": 3}},
            "data": {"good": "aGVsbG8=", "bad": "MARKER!!", "num": 5, "null": null}
        })
        .to_string();
        let s = RawSecret::parse(&text, "ns", "s").expect("a Secret");
        assert_eq!(s.resource_version, "7");
        assert_eq!(s.annotations.get("a").map(String::as_str), Some("b"));
        assert!(!s.annotations.contains_key("n"));
        assert_eq!(s.value("good"), Ok(Some(b"hello".to_vec())));
        assert_eq!(s.text("good").as_deref(), Some("hello"));
        assert_eq!(s.value("bad"), Err(BadValue::NotBase64));
        assert_eq!(s.value("num"), Err(BadValue::NotAString));
        assert_eq!(s.value("null"), Ok(None));
        assert_eq!(s.value("missing"), Ok(None));
        for (text, why) in [
            ("MARKER", "not JSON"),
            ("[\"MARKER\"]", "not an object"),
            (r#"{"apiVersion":"v1","kind":"ConfigMap"}"#, "another kind"),
            (
                r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"t","namespace":"ns"}}"#,
                "another name",
            ),
            (
                r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"ns"},"data":"MARKER"}"#,
                "data that is not a map",
            ),
        ] {
            let e = RawSecret::parse(text, "ns", "s").expect_err(text);
            let shown = e.to_string();
            assert!(shown.contains(why), "{shown}");
            assert!(!shown.contains("MARKER"), "{shown}");
        }
    }
}
