//! The one place the controller adds and removes finalizers (cf. kube-runtime's
//! `finalizer` helper): a merge patch of `metadata.finalizers` guarded by the
//! resourceVersion read, so a concurrent writer makes it fail with a conflict (the
//! reconcile runs again) instead of losing someone else's finalizer.

use super::Context;
use crate::runtime::objects::{REMOVAL_FINALIZER, TalosMachine};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

/// Whether an object's metadata carries this finalizer.
pub fn holds(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// Whether a machine carries the removal finalizer.
pub fn has_removal(m: &TalosMachine) -> bool {
    m.holds_removal_finalizer()
}

/// Adds or removes a machine's removal finalizer.
pub async fn set_removal(
    ctx: &Context,
    m: &TalosMachine,
    present: bool,
) -> Result<(), kube::Error> {
    set(ctx, m, REMOVAL_FINALIZER, present).await
}

/// Adds (`present`) or removes one finalizer of a namespaced object with a merge patch
/// guarded by the resourceVersion read (a conflict means someone else wrote first:
/// reconcile again). Removing it from an object that is gone already succeeds: nothing
/// holds it any more. Idempotent: setting what is already there writes the same list.
pub async fn set<K>(
    ctx: &Context,
    obj: &K,
    finalizer: &str,
    present: bool,
) -> Result<(), kube::Error>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let meta = obj.meta();
    let mut finalizers = meta.finalizers.clone().unwrap_or_default();
    finalizers.retain(|f| f != finalizer);
    if present {
        finalizers.push(finalizer.into());
    }
    let body = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": meta.resource_version,
        }
    });
    let ns = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 && !present => Ok(()),
        Err(e) => Err(e),
    }
}
