//! Each fact is declared with the objects it reads (`FactInfo.read`), and computed from only
//! its event's cluster: checked here fact by fact.
#![cfg(test)]

use super::*;
use crate::interp::{Facts, Lookup};
use crate::runtime::facts::{EventFacts, Expensive, SnapshotFacts};
use crate::runtime::objects::{
    API_VERSION, Object, Snapshot, TalosCluster, TalosEtcdBackup, TalosMachine, TalosOperation,
};
use crate::vocab::{Fact, RUNTIME_EVENTS, Site, Subject as S};

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
        "spec": {"controlPlane": {"count": 3}, "schedulable": "false",
                 "network": {"podSubnets": ["172.20.0.0/16"]}}
    }))
    .expect("cluster");
    // Inside the cluster by its declared pod range only: `backup.in_cluster` needs the
    // cluster's read too.
    let backup: TalosEtcdBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": API_VERSION, "kind": "TalosEtcdBackup",
        "metadata": {"name": "b1", "namespace": "ns"},
        "spec": {"clusterRef": {"name": "prod"},
                 "store": {"endpoint": "http://172.20.1.1:9000", "bucket": "etcd",
                           "credentialsSecretRef": {"name": "s3"}},
                 "schedule": {"interval": "1h"}}
    }))
    .expect("backup");
    let op = |n: &str, phase: &str| -> TalosOperation {
        serde_json::from_value(serde_json::json!({
            "apiVersion": API_VERSION, "kind": "TalosOperation",
            "metadata": {"name": n, "namespace": "ns"},
            "spec": {"clusterRef": {"name": "prod"}, "kind": "reset", "machine": "cp-1",
                     "backupRef": {"name": "b1"}},
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
        backups: vec![backup],
        patches: Vec::new(),
    }
}

/// The objects of another cluster in the same namespace: more control planes, an
/// unfinished operation. A fact that read them would differ.
fn other_cluster() -> (Vec<TalosMachine>, Vec<TalosOperation>) {
    let machines = (0..5)
        .map(|i| {
            serde_json::from_value::<TalosMachine>(serde_json::json!({
                "apiVersion": API_VERSION, "kind": "TalosMachine",
                "metadata": {"name": format!("x-{i}"), "namespace": "ns"},
                "spec": {"clusterRef": {"name": "other"}, "role": "controlplane", "approved": true,
                         "approvalDecision": {"at": "2026-11-01T09:00:00Z"}}
            }))
            .expect("machine")
        })
        .collect();
    let ops = vec![
        serde_json::from_value::<TalosOperation>(serde_json::json!({
            "apiVersion": API_VERSION, "kind": "TalosOperation",
            "metadata": {"name": "op-0", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"clusterRef": {"name": "other"}, "kind": "reboot"},
            "status": {"phase": "Running"}
        }))
        .expect("operation"),
    ];
    (machines, ops)
}

/// Every fact, computed from only the reads its declaration names (plus the request's
/// own object), is what it is from everything: a fact declared with too few reads
/// would decide on an empty list.
#[test]
fn each_fact_needs_no_read_but_the_one_it_declares() {
    let table = crate::ruleset::shipped_table();
    // The whole namespace: the cluster's objects and another cluster's. A read is
    // always of one cluster (`spec.clusterRef.name` selected), so a fact that needed
    // another cluster's objects, or the namespace's, would differ here: such a fact
    // needs a read of its own before the webhook may use it.
    let mut full = snapshot();
    let (machines, ops) = other_cluster();
    full.machines.extend(machines);
    full.operations.extend(ops);
    let cluster_only = snapshot();
    for info in FACTS {
        let Some(&(verb, subject, site)) = RUNTIME_EVENTS
            .iter()
            .find(|(v, s, site)| info.fact.available(*v, *s, *site) && *site == Site::Webhook)
        else {
            continue;
        };
        let mut part = Snapshot::default();
        match info.read {
            Read::Machines => part.machines = cluster_only.machines.clone(),
            Read::Cluster => part.clusters = cluster_only.clusters.clone(),
            Read::Operations => part.operations = cluster_only.operations.clone(),
            Read::Backups => {
                part.backups = cluster_only.backups.clone();
                part.clusters = cluster_only.clusters.clone();
            }
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
            let mut f = SnapshotFacts::new(&table, snap, ev, Expensive::FromObjects);
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
        // The backup facts are not vacuous here: the backup is found, and inside the
        // cluster by its declared range.
        if matches!(info.fact, Fact::BackupExists | Fact::BackupInCluster) {
            assert_eq!(value(&full), "Bool(true)", "{}", info.name);
        }
    }
}

/// Objects as a cluster holds them: managedFields, labels, a last-applied annotation,
/// conditions with messages, removal progress.
fn rich_objects() -> (serde_json::Value, serde_json::Value, serde_json::Value) {
    use serde_json::json;
    let managed = json!([{"manager": "kubectl", "operation": "Apply", "apiVersion": API_VERSION,
        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:role": {}, "f:approved": {}}}}]);
    let meta = |name: &str, extra: serde_json::Value| {
        let mut m = json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "resourceVersion": "42", "generation": 3,
            "creationTimestamp": "2026-11-01T08:00:00Z",
            "labels": {"team": "a"}, "managedFields": managed.clone(),
            "finalizers": ["ichor.maesh.dev/machine-removal"],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"x\": 1}"}});
        if let (Some(m), serde_json::Value::Object(extra)) = (m.as_object_mut(), extra) {
            for (k, v) in extra {
                m.insert(k, v);
            }
        }
        m
    };
    let conds = |ready: &str, reason: &str| {
        json!([
        {"type": "Ready", "status": ready, "reason": reason, "message": "long words", "lastTransitionTime": "2026-11-01T08:00:00Z"},
        {"type": "NodeReachable", "status": "False", "reason": "Timeout", "message": "x"},
        {"type": "Removal", "status": "True", "reason": "DeadMemberRemoval", "message": "y"}])
    };
    let machines = json!({"apiVersion": API_VERSION, "kind": "TalosMachineList", "metadata": {"resourceVersion": "42"},
        "items": (1..=5).map(|i| json!({"apiVersion": API_VERSION, "kind": "TalosMachine",
            "metadata": meta(&format!("cp-{i}"), if i == 2 {
                json!({"deletionTimestamp": "2026-11-02T00:00:00Z",
                       "annotations": {"ichor.maesh.dev/allow-delete": "true", "other": "x"}})
            } else { json!({}) }),
            "spec": {"clusterRef": {"name": "prod"}, "role": if i == 5 {"worker"} else {"controlplane"}, "approved": i != 4,
                     "approvalDecision": {"at": format!("2026-11-01T10:0{i}:00Z")}, "endpoint": "10.0.0.1"},
            "status": {"conditions": conds(if i == 3 {"False"} else {"True"}, if i == 3 {"NodeUnreachable"} else {"Ok"}),
                       "removal": {"memberDead": true, "done": ["drain node"], "committed": false}}
        })).collect::<Vec<_>>()});
    let ops = json!({"apiVersion": API_VERSION, "kind": "TalosOperationList", "metadata": {},
        "items": [
            {"apiVersion": API_VERSION, "kind": "TalosOperation", "metadata": meta("op-1", json!({})),
             "spec": {"clusterRef": {"name": "prod"}, "kind": "reset", "machine": "cp-1"},
             "status": {"phase": "Paused", "conditions": [
                 {"type": "Paused", "status": "True", "reason": "ClusterTransitioning", "message": "m"},
                 {"type": "Accepted", "status": "False", "reason": "StartRefused", "message": "m"},
                 {"type": "Progressing", "status": "True", "reason": "X"}]}},
            {"apiVersion": API_VERSION, "kind": "TalosOperation", "metadata": meta("op-2", json!({})),
             "spec": {"clusterRef": {"name": "prod"}, "kind": "upgrade"},
             "status": {"phase": "Running", "failureReason": "boom", "conditions": [
                 {"type": "Paused", "status": "True", "reason": "Operator"}]}}]});
    let cluster = json!({"apiVersion": API_VERSION, "kind": "TalosCluster",
        "metadata": meta("prod", json!({"annotations": {"ichor.maesh.dev/allow-delete": "true"}})),
        "spec": {"controlPlane": {"count": 3}, "schedulable": "false"},
        "status": {"conditions": [{"type": "Transitioning", "status": "False", "reason": "StableControlPlaneCount"}]}});
    (machines, ops, cluster)
}

fn decoded(decode: Decode) -> Snapshot {
    let (machines, ops, cluster) = rich_objects();
    let expect = |kind, name, cluster| Expect {
        kind,
        namespace: "ns",
        name,
        cluster,
    };
    let bytes = |v: &serde_json::Value| serde_json::to_vec(v).expect("json");
    let (machines, _) = TalosMachine::page(
        &bytes(&machines),
        decode,
        &expect("TalosMachine", None, Some("prod")),
    )
    .expect("machines");
    let (operations, _) = TalosOperation::page(
        &bytes(&ops),
        decode,
        &expect("TalosOperation", None, Some("prod")),
    )
    .expect("operations");
    let cluster = TalosCluster::one(
        &bytes(&cluster),
        decode,
        &expect("TalosCluster", Some("prod"), None),
    )
    .expect("cluster");
    Snapshot {
        machines,
        clusters: vec![cluster],
        operations,
        backups: Vec::new(),
        patches: Vec::new(),
    }
}

/// `metadata.finalizers` as an answer may hold it: a list with a non-string entry, or
/// not a list, fails the page (the read refuses) in both decodings; `null`, an empty
/// list and other finalizers only are no removal finalizer, and a huge list of
/// others keeps nothing but the one a fact reads.
#[test]
fn malformed_finalizers_fail_the_read_and_others_are_dropped() {
    use crate::runtime::objects::REMOVAL_FINALIZER;
    use serde_json::json;
    let page = |finalizers: serde_json::Value, decode: Decode| {
        let list = json!({"apiVersion": API_VERSION, "kind": "TalosMachineList",
            "metadata": {"resourceVersion": "1"},
            "items": [{"apiVersion": API_VERSION, "kind": "TalosMachine",
                "metadata": {"name": "cp-1", "namespace": "ns", "finalizers": finalizers},
                "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true}}]});
        let expect = Expect {
            kind: "TalosMachine",
            namespace: "ns",
            name: None,
            cluster: Some("prod"),
        };
        TalosMachine::page(&serde_json::to_vec(&list).expect("json"), decode, &expect)
            .map(|(items, _)| items)
    };
    for decode in [Decode::Full, Decode::Decisions] {
        for bad in [
            json!([1]),
            json!(["a", {"b": 1}]),
            json!("x"),
            json!({"a": "b"}),
        ] {
            assert!(page(bad.clone(), decode).is_err(), "{bad} decoded");
        }
        let mut many: Vec<String> = (0..10_000).map(|i| format!("other/{i}")).collect();
        many.push(REMOVAL_FINALIZER.to_string());
        for (finalizers, holds) in [
            (json!(null), false),
            (json!([]), false),
            (json!(["other/x"]), false),
            (json!(many), true),
        ] {
            let items = page(finalizers.clone(), decode).expect("decodes");
            assert_eq!(items[0].holds_removal_finalizer(), holds, "{finalizers}");
        }
    }
    let items = page(json!(["other/x", REMOVAL_FINALIZER]), Decode::Decisions).expect("decodes");
    assert_eq!(
        items[0].metadata.finalizers.as_deref(),
        Some(&[REMOVAL_FINALIZER.to_string()][..]),
        "only the removal finalizer is kept"
    );
}

/// Decoding for decisions keeps everything a fact reads: every fact of every event,
/// for every subject, is the same from whole objects and from what `Decisions` keeps.
#[test]
fn decoding_for_decisions_keeps_every_fact() {
    let table = crate::ruleset::shipped_table();
    let full = decoded(Decode::Full);
    let slim = decoded(Decode::Decisions);
    // Whole objects are whole (as typed_object reads them), the slim ones are not.
    let (machines, ..) = rich_objects();
    let whole = crate::runtime::objects::typed_object("TalosMachine", machines["items"][0].clone())
        .expect("typed");
    assert_eq!(Object::Machine(full.machines[0].clone()), whole);
    assert!(slim.machines[0].metadata.managed_fields.is_none());
    assert!(
        slim.machines[0]
            .status
            .as_ref()
            .is_some_and(|s| s.removal.is_none() && s.conditions.len() == 2)
    );
    assert_eq!(
        slim.machines[1]
            .metadata
            .annotations
            .as_ref()
            .map(|a| a.len()),
        Some(1),
        "only the annotations a fact reads"
    );
    for &(verb, subject, site) in RUNTIME_EVENTS {
        for pick in 0..5 {
            let value = |snap: &Snapshot, fact: crate::vocab::Fact| -> String {
                let ev = EventFacts {
                    event: (verb, subject, site),
                    namespace: "ns",
                    cluster: "prod",
                    subject: match subject {
                        S::Operation => {
                            crate::runtime::facts::Subject::Operation(&snap.operations[pick % 2])
                        }
                        S::Cluster => crate::runtime::facts::Subject::Cluster(&snap.clusters[0]),
                        _ => crate::runtime::facts::Subject::Machine {
                            name: snap.machines[pick].name(),
                            view: &snap.machines[pick],
                            counted: Some(&snap.machines[pick]),
                        },
                    },
                };
                for expensive in [Expensive::FromObjects, Expensive::Deferred] {
                    let mut f = SnapshotFacts::new(&table, snap, ev, expensive);
                    if let Lookup::Value(v) = f.fact(fact) {
                        return format!("{v:?}");
                    }
                }
                "later".into()
            };
            for info in FACTS {
                if !info.fact.available(verb, subject, site) {
                    continue;
                }
                assert_eq!(
                    value(&slim, info.fact),
                    value(&full, info.fact),
                    "{verb:?} {subject:?} {site:?} subject {pick}: `{}`",
                    info.name
                );
            }
        }
    }
}

#[test]
fn field_selector_values_are_escaped() {
    assert_eq!(cluster_selector("prod"), "spec.clusterRef.name=prod");
    assert_eq!(cluster_selector(""), "spec.clusterRef.name=");
    assert_eq!(
        cluster_selector("a,b=c\\d"),
        "spec.clusterRef.name=a\\,b\\=c\\\\d"
    );
}
