//! The reboot that rolls a staged configuration (issue 37). A configuration change that
//! needs a reboot is staged on each node (`configure.rs`: `status.config.stagedHash`);
//! this module has the operations' machinery reboot those nodes: it creates one `reboot`
//! TalosOperation naming them (`spec.machines`), which goes through admission like a
//! person's, and which the one executor ([`crate::runtime::exec::operation`]) runs one
//! node at a time under the cluster lock, the `start`, `run` and `step operation` rules and
//! the plan's gates, exactly as any reboot. Each node boots into its staged configuration,
//! and the machine's next reconcile records it applied.
//!
//! The roll starts once every machine the change reaches has rendered it (its
//! `status.config.inputs` is the digest of the cluster's current base and patches; a
//! machine whose node does not answer is not waited for) and no machine of the cluster was
//! newly staged for `roll_settle`, so the machines one change stages are rolled together. The operation's name is derived from the machines and their staged hashes, so two
//! controllers create the same one (the second gets AlreadyExists) and the same staged
//! set is never rolled twice. While a roll the controller created is unfinished (failed
//! included: ADR 0137, a person resumes or deletes it), it creates no other; machines
//! staged meanwhile wait for the next one. A machine is rolled once for a staged
//! configuration (the roll's annotation `ichor.maesh.dev/staged-hashes` says which): if its
//! reboot did not apply it, it stays `Configured=False RebootRequired` for a person.

use super::Context;
use crate::runtime::live::{cluster_selector, list_complete};
use crate::runtime::objects::{
    ClusterRef, OperationSpec, Snapshot, TalosCluster, TalosConfigPatch, TalosMachine,
    TalosOperation,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

/// The label on the TalosOperations the controller creates to roll a configuration: the
/// value is `true`.
pub const ROLL_LABEL: &str = "ichor.maesh.dev/configuration-roll";

/// The annotation on such a TalosOperation naming what it rolls: `<machine>=<staged hash>`,
/// space-separated. A machine is never rolled twice for the same staged configuration (its
/// status may still say staged for a moment after the roll rebooted it).
pub const ROLLED_ANNOTATION: &str = "ichor.maesh.dev/staged-hashes";

fn is_roll(o: &TalosOperation) -> bool {
    o.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get(ROLL_LABEL).is_some_and(|v| v == "true"))
}

/// Whether a roll of the controller already took `machine` for `hash`.
fn rolled(snapshot: &Snapshot, c: &TalosCluster, machine: &str, hash: &str) -> bool {
    let pair = format!("{machine}={hash}");
    snapshot.operations.iter().any(|o| {
        o.namespace() == c.namespace()
            && o.cluster() == c.name()
            && is_roll(o)
            && o.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ROLLED_ANNOTATION))
                .is_some_and(|v| v.split(' ').any(|p| p == pair))
    })
}

/// The approved machines of `c` whose staged configuration is not the one applied, with
/// that staged hash, by name.
fn staged<'s>(snapshot: &'s Snapshot, c: &TalosCluster) -> Vec<(&'s TalosMachine, &'s str)> {
    let mut out: Vec<_> = snapshot
        .machines
        .iter()
        .filter(|m| {
            m.namespace() == c.namespace()
                && m.cluster() == c.name()
                && m.approved_role().is_some()
                && !m.deleting()
        })
        .filter_map(|m| {
            let s = m.staged_config_hash()?;
            (m.applied_config_hash() != Some(s) && !rolled(snapshot, c, m.name(), s))
                .then_some((m, s))
        })
        .collect();
    out.sort_by(|a, b| a.0.name().cmp(b.0.name()));
    out
}

/// The roll's name: the cluster's (cut to fit) and a digest of the machines and hashes.
fn roll_name(cluster: &str, staged: &[(&TalosMachine, &str)]) -> String {
    let text: String = staged
        .iter()
        .map(|(m, h)| format!("{}={h}\n", m.name()))
        .collect();
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let hex: String = d.as_ref()[..5].iter().map(|b| format!("{b:02x}")).collect();
    let head: String = cluster.chars().take(200).collect();
    format!("{}-config-{hex}", head.trim_end_matches(['-', '.']))
}

/// The approved machines of `c` that have not rendered `inputs` yet and will: their node
/// is not known unreachable (the configuration of one that is waits for it to answer), and
/// the rules do not hold them (a machine held over the cap, `Ready=False` with a reason a
/// rule of `table` owns, gets no configuration at all: the roll of the others does not
/// wait for it).
fn not_rendered<'s>(
    snapshot: &'s Snapshot,
    table: &crate::compile::Table,
    c: &TalosCluster,
    inputs: &str,
) -> Vec<&'s str> {
    snapshot
        .machines
        .iter()
        .filter(|m| {
            m.namespace() == c.namespace()
                && m.cluster() == c.name()
                && m.approved_role().is_some()
                && !m.deleting()
                && m.reachable_state() != Some("False")
                && !m
                    .ready_state()
                    .is_some_and(|(status, reason)| status == "False" && table.owns_reason(reason))
                && m.config_inputs() != Some(inputs)
        })
        .map(|m| m.name())
        .collect()
}

/// Starts a roll of `c`'s staged machines when none of the controller's is unfinished;
/// returns when to look again (`None`: nothing to roll). `base_digest` is the digest of
/// the base `c` published.
pub async fn ensure(
    ctx: &Context,
    snapshot: &Snapshot,
    c: &TalosCluster,
    base_digest: Option<&str>,
) -> Option<Duration> {
    let staged = staged(snapshot, c);
    if staged.is_empty() {
        return None;
    }
    // Every machine a change stages, in one roll: wait until none was newly staged for
    // `roll_settle` (the Configured=False RebootRequired transition time).
    let settle = ctx.settings.roll_settle;
    let newest = staged
        .iter()
        .filter_map(|(m, _)| m.configure_failing_since())
        .max();
    if let Some(t) = newest {
        let age = Timestamp::now().duration_since(t.0);
        let age = Duration::try_from(age).unwrap_or(Duration::ZERO);
        if age < settle {
            return Some((settle - age).max(Duration::from_millis(100)));
        }
    }
    // Every machine the change reaches has rendered it (one still rendering is staged in
    // a moment, and belongs to this roll).
    let Some(base_digest) = base_digest else {
        return Some(ctx.settings.refused_requeue);
    };
    let api: Api<TalosConfigPatch> = Api::namespaced(ctx.client.clone(), c.namespace());
    let params = ListParams::default().fields(&cluster_selector(c.name()));
    let patches = match list_complete(&api, &params).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(cluster = %format!("{}/{}", c.namespace(), c.name()), error = %e, "the configuration roll waits: the cluster's TalosConfigPatches could not be read");
            return Some(ctx.settings.refused_requeue);
        }
    };
    let inputs = crate::runtime::exec::apply::inputs_digest(base_digest, &patches);
    let Some(table) = ctx.rules.current() else {
        return Some(ctx.settings.refused_requeue);
    };
    let waiting = not_rendered(snapshot, &table, c, &inputs);
    if !waiting.is_empty() {
        tracing::debug!(cluster = %format!("{}/{}", c.namespace(), c.name()), machines = %waiting.join(", "), "the configuration roll waits for machines still rendering the change");
        return Some(settle.max(Duration::from_millis(100)));
    }
    let rolling = snapshot.operations.iter().find(|o| {
        o.namespace() == c.namespace() && o.cluster() == c.name() && !o.finished() && is_roll(o)
    });
    if let Some(o) = rolling {
        tracing::debug!(operation = %o.name(), "a configuration roll is unfinished");
        return Some(ctx.settings.parked_requeue);
    }
    let name = roll_name(c.name(), &staged);
    let machines: Vec<String> = staged.iter().map(|(m, _)| m.name().to_string()).collect();
    let op = TalosOperation {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(c.namespace().to_string()),
            labels: Some(BTreeMap::from([(
                ROLL_LABEL.to_string(),
                "true".to_string(),
            )])),
            annotations: Some(BTreeMap::from([(
                ROLLED_ANNOTATION.to_string(),
                staged
                    .iter()
                    .map(|(m, h)| format!("{}={h}", m.name()))
                    .collect::<Vec<_>>()
                    .join(" "),
            )])),
            ..ObjectMeta::default()
        },
        spec: OperationSpec {
            cluster_ref: ClusterRef {
                name: c.name().to_string(),
            },
            kind: "reboot".into(),
            machines: machines.clone(),
            ..OperationSpec::default()
        },
        status: None,
    };
    let api: Api<TalosOperation> = Api::namespaced(ctx.client.clone(), c.namespace());
    match api.create(&PostParams::default(), &op).await {
        Ok(_) => {
            let note = format!(
                "a staged configuration needs a reboot on {}: TalosOperation {name} reboots them one node at a time",
                machines.join(", ")
            );
            tracing::info!(cluster = %format!("{}/{}", c.namespace(), c.name()), operation = %name, "configuration roll started");
            ctx.event(c, false, "ConfigurationRollStarted", note).await;
            None
        }
        // Another replica created it, or this staged set was rolled already.
        Err(kube::Error::Api(s)) if s.code == 409 => None,
        // Refused at admission (its `start operation` rules), or the API failed: again later.
        Err(e) => {
            tracing::warn!(operation = %name, error = %e, "the configuration roll could not be created");
            Some(ctx.settings.refused_requeue)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged_machine(name: &str) -> TalosMachine {
        let mut m = TalosMachine::default();
        m.metadata.name = Some(name.into());
        m
    }

    fn machine(name: &str, reachable: &str, inputs: Option<&str>) -> TalosMachine {
        let mut status = serde_json::json!({
            "conditions": [{"type": "NodeReachable", "status": reachable,
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        });
        if let Some(i) = inputs {
            status["config"] = serde_json::json!({"inputs": i});
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true},
            "status": status,
        }))
        .expect("a TalosMachine")
    }

    fn patch(name: &str, version: &str) -> TalosConfigPatch {
        let mut p: TalosConfigPatch = serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosConfigPatch",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"clusterRef": {"name": "prod"}, "patch": "machine: {}\n"},
        }))
        .expect("a TalosConfigPatch");
        p.metadata.resource_version = Some(version.into());
        p
    }

    #[test]
    fn the_inputs_follow_the_base_and_every_patch_version_in_any_order() {
        let digest = crate::runtime::exec::apply::inputs_digest;
        let (a, b) = (patch("a", "1"), patch("b", "7"));
        let one = digest("base", &[a.clone(), b.clone()]);
        assert_eq!(one, digest("base", &[b.clone(), a.clone()]));
        assert_ne!(one, digest("other", &[a.clone(), b.clone()]));
        assert_ne!(one, digest("base", &[a.clone(), patch("b", "8")]));
        assert_ne!(one, digest("base", &[a]));
    }

    /// The roll waits for every machine that will render the change (one whose node does
    /// not answer excepted), and for nothing else.
    #[test]
    fn the_roll_waits_for_the_machines_still_rendering_the_change() {
        let mut cluster = TalosCluster::default();
        cluster.metadata.name = Some("prod".into());
        cluster.metadata.namespace = Some("ns".into());
        let mut snapshot = Snapshot {
            machines: vec![
                machine("cp-1", "True", Some("now")),
                machine("cp-2", "True", Some("before")),
                machine("cp-3", "True", None),
                machine("cp-4", "False", Some("before")),
            ],
            ..Snapshot::default()
        };
        let table = crate::ruleset::shipped_table();
        assert_eq!(
            not_rendered(&snapshot, &table, &cluster, "now"),
            ["cp-2", "cp-3"]
        );
        let mut unapproved = machine("cp-5", "True", None);
        unapproved.spec.approved = false;
        let mut other = machine("cp-6", "True", None);
        other.spec.cluster_ref.name = "staging".into();
        snapshot.machines = vec![machine("cp-1", "True", Some("now")), unapproved, other];
        assert!(not_rendered(&snapshot, &table, &cluster, "now").is_empty());
        // Held over the cap by a rule (its reason the rules' own): it never renders, and
        // the roll does not wait for it. Not ready for a reason of the controller's own
        // (the node unreachable past its grace), it is waited for as before.
        let ready_false = |name: &str, reason: &str| {
            let mut m = machine(name, "True", Some("before"));
            m.status
                .get_or_insert_with(Default::default)
                .conditions
                .push(
                    serde_json::from_value(serde_json::json!({
                        "type": "Ready", "status": "False", "reason": reason,
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"
                    }))
                    .expect("a condition"),
                );
            m
        };
        assert!(table.owns_reason(Some("ControlPlaneOverCap")));
        snapshot.machines = vec![
            machine("cp-1", "True", Some("now")),
            ready_false("cp-4", "ControlPlaneOverCap"),
            ready_false("cp-5", "Rebooting"),
        ];
        assert_eq!(not_rendered(&snapshot, &table, &cluster, "now"), ["cp-5"]);
    }

    #[test]
    fn the_name_follows_the_staged_set_and_fits() {
        let (a, b) = (staged_machine("cp-1"), staged_machine("cp-2"));
        let one = roll_name("prod", &[(&a, "h1"), (&b, "h2")]);
        assert!(one.starts_with("prod-config-"), "{one}");
        assert_eq!(one, roll_name("prod", &[(&a, "h1"), (&b, "h2")]));
        assert_ne!(one, roll_name("prod", &[(&a, "h1"), (&b, "h3")]));
        assert_ne!(one, roll_name("prod", &[(&a, "h1")]));
        let long = roll_name(&"x".repeat(253), &[(&a, "h1")]);
        assert!(long.len() <= 253, "{}", long.len());
    }
}
