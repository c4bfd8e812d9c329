//! Conditions and status writes. The controller is the only writer of these statuses, so a
//! status is written with a merge patch of the fields it owns; a write that would change
//! nothing is skipped.

use crate::runtime::objects::{Condition, TalosCluster, TalosMachine, TalosOperation};
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
                c.last_transition_time = Some(Time(Timestamp::now()));
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
                last_transition_time: Some(Time(Timestamp::now())),
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

/// Writes `status` (a JSON object of the fields the controller owns) through the status
/// subresource.
pub async fn patch_status<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &impl Serialize,
) -> Result<Option<String>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let body = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map(|o| o.meta().resource_version.clone())
}

/// The statuses of the three kinds, as the controller writes them.
pub trait Conditions {
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
}

impl Conditions for TalosMachine {
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}

impl Conditions for TalosCluster {
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}

impl Conditions for TalosOperation {
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}
