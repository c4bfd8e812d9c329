//! The dry render of a TalosConfigPatch at admission (ADR 0106 §1): every approved machine
//! of its cluster that it selects is rendered with and without it, against the redacted
//! base the controller publishes in the TalosCluster's status (the webhook reads no
//! Secret). What comes out are facts (`patch.selects`, `patch.breaks`, `patch.error`); the
//! refusal is a rule of the rules text (`patch-breaks-render`, `rules/admission.rules`).

use super::objects::{TalosCluster, TalosConfigPatch, TalosMachine, patches_for};
use super::render::{self, Base, Identity, Patch, RenderError, Rendered};

/// What the dry render found: the facts of `apply patch`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DryRender {
    /// Approved machines of the cluster the patch selects.
    pub selects: usize,
    /// Those whose render fails with the patch and did not without it.
    pub breaks: usize,
    /// The first of them and its render error, `<machine>: <error>`.
    pub error: String,
    /// Whether there was a base to render against.
    pub rendered: bool,
}

/// A patch object read into the render's form (its parse error kept: it fails the renders
/// of the machines it selects).
pub fn parse_patch(p: &TalosConfigPatch) -> Result<Patch, RenderError> {
    Patch::parse(
        &format!("TalosConfigPatch {}/{}", p.namespace(), p.name()),
        p.spec.patches.strategic.as_deref(),
        p.spec.patches.json6902.as_deref(),
    )
}

/// Renders one machine with the given patches (already those selecting it, in order).
pub fn render_machine(
    base: &Base,
    m: &TalosMachine,
    patches: &[(&TalosConfigPatch, &Result<Patch, RenderError>)],
) -> Result<Rendered, RenderError> {
    let Some(role) = m.approved_role() else {
        return Err(RenderError::Invalid(format!(
            "TalosMachine {} is not an approved machine with a role",
            m.name()
        )));
    };
    let mut parsed = Vec::with_capacity(patches.len());
    for (_, p) in patches {
        match p {
            Ok(p) => parsed.push(p),
            Err(e) => return Err(e.clone()),
        }
    }
    render::render(
        base,
        role,
        &parsed,
        Identity {
            hostname: m.spec.hostname.as_deref(),
            install_disk: m.spec.install_disk.as_deref(),
        },
    )
}

/// The dry render: `base` is the redacted base (`None`: nothing to render against),
/// `machines` the cluster's machines, `others` its other patches (the one being written, by
/// name, is left out of them: an update replaces it). Machines and patches of another
/// namespace or cluster than the patch's do not count.
pub fn dry_render(
    base: Option<&Base>,
    machines: &[TalosMachine],
    others: &[TalosConfigPatch],
    patch: &TalosConfigPatch,
) -> DryRender {
    let mut out = DryRender::default();
    let others: Vec<&TalosConfigPatch> = others
        .iter()
        .filter(|o| {
            o.name() != patch.name()
                && o.namespace() == patch.namespace()
                && o.cluster() == patch.cluster()
        })
        .collect();
    let parsed: Vec<(&TalosConfigPatch, Result<Patch, RenderError>)> = others
        .iter()
        .copied()
        .chain(std::iter::once(patch))
        .map(|p| (p, parse_patch(p)))
        .collect();
    let find = |p: &TalosConfigPatch| {
        parsed
            .iter()
            .find(|(q, _)| std::ptr::eq(*q, p))
            .map(|(q, r)| (*q, r))
    };
    let mut selected: Vec<&TalosMachine> = machines
        .iter()
        // (`selects`: of the patch's namespace and cluster only.)
        .filter(|m| m.approved_role().is_some() && !m.deleting() && patch.selects(m))
        .collect();
    selected.sort_by_key(|m| m.name());
    out.selects = selected.len();
    let Some(base) = base else { return out };
    out.rendered = true;
    for m in selected {
        let without: Vec<_> = patches_for(others.iter().copied(), m)
            .into_iter()
            .filter_map(find)
            .collect();
        if render_machine(base, m, &without).is_err() {
            // Already failing: this patch did not break it (ADR 0106 §1).
            continue;
        }
        let with: Vec<_> = patches_for(others.iter().copied().chain(std::iter::once(patch)), m)
            .into_iter()
            .filter_map(find)
            .collect();
        if let Err(e) = render_machine(base, m, &with) {
            out.breaks += 1;
            if out.error.is_empty() {
                out.error = format!("{}: {e}", m.name());
            }
        }
    }
    out
}

/// The redacted base a TalosCluster's status carries, read (`None` when there is none yet
/// or it does not parse: nothing to render against).
pub fn published_base(cluster: &TalosCluster) -> Option<Base> {
    let rb = cluster.status.as_ref()?.redacted_base.as_ref()?;
    let mut base = Base::parse(&rb.controlplane, &rb.worker, false).ok()?;
    base.digest = rb.digest.clone();
    Some(base)
}

/// Why the live reads of a dry render failed.
#[derive(Debug, thiserror::Error)]
#[error("could not read {what}: {source}")]
pub struct ReadError {
    pub what: String,
    #[source]
    pub source: kube::Error,
}

/// The live reads of a dry render, then the render: the TalosCluster (GET), its
/// TalosMachines and TalosConfigPatches (LISTs selected by `spec.clusterRef.name`).
pub async fn dry_render_live(
    client: &kube::Client,
    patch: &TalosConfigPatch,
) -> Result<DryRender, ReadError> {
    use kube::Api;
    use kube::api::ListParams;
    let ns = patch.namespace();
    let cluster_name = patch.cluster();
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), ns);
    let cluster = clusters
        .get_opt(cluster_name)
        .await
        .map_err(|source| ReadError {
            what: format!("TalosCluster {ns}/{cluster_name}"),
            source,
        })?;
    let Some(cluster) = cluster else {
        return Ok(DryRender::default());
    };
    if published_base(&cluster).is_none() {
        return Ok(DryRender::default());
    }
    let params = ListParams::default().fields(&super::live::cluster_selector(cluster_name));
    let machines: Api<TalosMachine> = Api::namespaced(client.clone(), ns);
    let machines = super::live::list_complete(&machines, &params)
        .await
        .map_err(|source| ReadError {
            what: format!("the TalosMachines of TalosCluster {ns}/{cluster_name}"),
            source,
        })?;
    let patches: Api<TalosConfigPatch> = Api::namespaced(client.clone(), ns);
    let patches = super::live::list_complete(&patches, &params)
        .await
        .map_err(|source| ReadError {
            what: format!("the TalosConfigPatches of TalosCluster {ns}/{cluster_name}"),
            source,
        })?;
    Ok(dry_render_of(Some(&cluster), &machines, &patches, patch))
}

/// The dry render of `patch` against objects at hand: its TalosCluster (`None`: missing,
/// nothing to render against), and the machines and patches among `machines` and
/// `patches` that belong to that cluster. What the webhook renders after its live reads,
/// and what `eval` and `test` render from an objects file.
pub fn dry_render_of(
    cluster: Option<&TalosCluster>,
    machines: &[TalosMachine],
    patches: &[TalosConfigPatch],
    patch: &TalosConfigPatch,
) -> DryRender {
    let Some(cluster) = cluster else {
        return DryRender::default();
    };
    let Some(base) = published_base(cluster) else {
        return DryRender::default();
    };
    dry_render(Some(&base), machines, patches, patch)
}

/// The TalosConfigPatch a create or an update is about (`None`: another kind, or a delete,
/// which is not checked); an object that does not read as one is an error naming why.
pub fn from_request(req: &super::admission::Request) -> Option<Result<TalosConfigPatch, String>> {
    use kube::core::admission::Operation;
    if req.inner.kind.group != super::objects::GROUP || req.inner.kind.kind != "TalosConfigPatch" {
        return None;
    }
    if !matches!(req.inner.operation, Operation::Create | Operation::Update) {
        return None;
    }
    let obj = req.inner.object.as_ref()?;
    let value = match serde_json::to_value(obj) {
        Ok(v) => v,
        Err(e) => return Some(Err(e.to_string())),
    };
    Some(
        serde_json::from_value::<TalosConfigPatch>(value)
            .map(|mut p| {
                if p.metadata.namespace.is_none() {
                    p.metadata.namespace = Some(req.namespace.clone());
                }
                p
            })
            .map_err(|e| format!("the TalosConfigPatch does not read: {e}")),
    )
}

/// The `apply patch` event of a TalosConfigPatch written, with its dry render.
pub fn patch_event<'s>(
    namespace: &'s str,
    patch: &'s TalosConfigPatch,
    render: &'s DryRender,
) -> super::facts::EventFacts<'s> {
    use crate::vocab::{Site, Subject as S, Verb};
    super::facts::EventFacts {
        event: (Verb::Apply, S::Patch, Site::Webhook),
        namespace,
        cluster: patch.cluster(),
        subject: super::facts::Subject::Patch {
            name: patch.name(),
            render,
        },
    }
}
