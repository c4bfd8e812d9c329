//! Conditions and status writes. The controller is the only writer of these statuses, so a
//! status is written with a merge patch of the fields it owns; a write that would change
//! nothing is skipped.

use crate::runtime::objects::{
    ClusterStatus, Condition, MachineStatus, OperationStatus, TalosCluster, TalosMachine,
    TalosOperation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// Sets a condition; `lastTransitionTime` changes only when the status does. Returns
/// whether anything changed.
pub fn set(
    conds: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
) -> bool {
    set_at(Timestamp::now(), conds, type_, status, reason, message)
}

/// [`set`] at the time `at` (a procedure's world's clock: `exec::World::now`).
pub fn set_at(
    at: Timestamp,
    conds: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
) -> bool {
    let status = if status { "True" } else { "False" };
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let same = c.status == status
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message);
            if same {
                return false;
            }
            if c.status != status {
                c.last_transition_time = Some(Time(at));
            }
            c.status = status.into();
            c.reason = Some(reason.into());
            c.message = Some(message.into());
            true
        }
        None => {
            conds.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message.into()),
                last_transition_time: Some(Time(at)),
            });
            true
        }
    }
}

/// Removes a condition; returns whether it was there.
pub fn remove(conds: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conds.len();
    conds.retain(|c| c.type_ != type_);
    conds.len() != before
}

pub fn find<'c>(conds: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

/// Writes an object's status through the status subresource (a merge patch of the fields
/// the controller owns) when `after`'s differs from `before`'s. The one status write of the
/// controller: an object deleted meanwhile is not an error (`Ok(None)`: nothing to record
/// on it any more). Returns the resourceVersion the write made, when it wrote (a later
/// finalizer patch is guarded by it).
pub async fn write<K>(client: &Client, before: &K, after: &K) -> Result<Option<String>, kube::Error>
where
    K: Conditions
        + Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    if after.status() == before.status() {
        return Ok(None);
    }
    let empty = K::Status::default();
    let json = |s: Option<&K::Status>| serde_json::to_value(s.unwrap_or(&empty));
    let status = merge_patch(
        &json(before.status()).unwrap_or_default(),
        &json(after.status()).map_err(kube::Error::SerdeError)?,
    );
    let meta = after.meta();
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let body = serde_json::json!({ "status": status });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(o) => Ok(o.meta().resource_version.clone()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// `after` as a JSON merge patch (RFC 7386) over `before`: `after` whole, with `null` for
/// every field `before` has and `after` does not, at any depth of objects. A merge patch
/// leaves a field it does not name standing, and the statuses leave out the fields they do
/// not hold (`skip_serializing_if`): without the nulls, a progress field cleared by the
/// controller (`stagedHash`, a removal's `started`) would stay on the object for ever, and
/// the next reconcile would read what the controller had taken back.
pub fn merge_patch(before: &serde_json::Value, after: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let mut out = serde_json::Map::new();
            for (k, av) in a {
                let v = match b.get(k) {
                    Some(bv) => merge_patch(bv, av),
                    None => av.clone(),
                };
                out.insert(k.clone(), v);
            }
            for k in b.keys() {
                if !a.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(out)
        }
        _ => after.clone(),
    }
}

/// The statuses of the three kinds, as the controller writes them.
pub trait Conditions {
    /// The status as the controller writes it.
    type Status: Serialize + PartialEq + Default;
    fn status(&self) -> Option<&Self::Status>;
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
}

impl Conditions for TalosMachine {
    type Status = MachineStatus;
    fn status(&self) -> Option<&MachineStatus> {
        self.status.as_ref()
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}

impl Conditions for TalosCluster {
    type Status = ClusterStatus;
    fn status(&self) -> Option<&ClusterStatus> {
        self.status.as_ref()
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}

impl Conditions for crate::runtime::objects::TalosEtcdBackup {
    type Status = crate::runtime::objects::BackupStatus;
    fn status(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}

impl Conditions for TalosOperation {
    type Status = OperationStatus;
    fn status(&self) -> Option<&OperationStatus> {
        self.status.as_ref()
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}

#[cfg(test)]
mod tests {
    use super::merge_patch;
    use serde_json::json;

    #[test]
    fn a_merge_patch_removes_what_after_dropped_at_any_depth() {
        let before = json!({"config": {"appliedHash": "a", "stagedHash": "s"},
                            "removal": {"started": "reset node", "done": ["drain node"]},
                            "gone": 1, "conditions": [{"type": "Ready"}]});
        let after = json!({"config": {"appliedHash": "s"},
                           "removal": {"done": ["drain node", "reset node"]},
                           "conditions": []});
        assert_eq!(
            merge_patch(&before, &after),
            json!({"config": {"appliedHash": "s", "stagedHash": null},
                   "removal": {"done": ["drain node", "reset node"], "started": null},
                   "gone": null, "conditions": []})
        );
        // Nothing dropped: `after` itself.
        assert_eq!(merge_patch(&after, &after), after);
        // A field that became an object, or an object that became a value, is replaced.
        assert_eq!(
            merge_patch(&json!({"a": 1}), &json!({"a": {"b": 2}})),
            json!({"a": {"b": 2}})
        );
        assert_eq!(
            merge_patch(&json!({"a": {"b": 2}}), &json!({"a": 1})),
            json!({"a": 1})
        );
    }
}
