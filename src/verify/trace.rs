//! Counterexamples: the shortest path to a violation, replayed on concrete states (stable
//! machine names), told in the words of the people and the controller, with the fixtures
//! `ichor-rules eval` decides the same way.

use super::explore::{Exploration, Violation, key_of, path_to};
use super::invariant::{Facts, InvariantCheck, Outcome};
use super::model::{
    CLUSTER, ClusterState, Fired, Lazy, Lock, Memo, Model, Move, NAMESPACE, Next, Req, State,
};
use crate::runtime::objects::{Object, Snapshot};
use crate::vocab::MODEL_STEPS;
use kube::core::admission::Operation;

#[derive(Clone, Debug, serde::Serialize)]
pub struct Step {
    pub n: usize,
    /// `person`, `controller`, `api-server` or `environment`.
    pub actor: &'static str,
    pub text: String,
    /// For an admission: the rules that decided it (warnings included).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// The state after the step, in a line.
    pub state: String,
    /// For an admission: the live objects it read and the AdmissionReview, for `eval`.
    #[serde(skip)]
    pub fixture: Option<(String, String)>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Trace {
    pub invariant: String,
    pub sequential: bool,
    pub message: String,
    pub start: String,
    pub steps: Vec<Step>,
    /// Set when the trace could not be replayed on concrete states (a bug in the model:
    /// reported, never hidden).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_error: Option<String>,
    /// For a violation in a state where a waiting operation blocks the removal that would
    /// end the even count (`cure.blocked`): that removal, the rules that refuse it, and
    /// the operations without which it would be allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
    /// For a livelock (a liveness violation where the controller's steps go round
    /// forever): the step whose state the last step returns to; the steps after it repeat.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loop_from: Option<usize>,
}

pub fn summary(s: &State) -> String {
    let lock = match s.lock {
        Lock::Free => "free".to_string(),
        Lock::Removal(i) => format!("removal of {}", s.name(i)),
        Lock::Operation(k) => format!("operation {}", s.op_name(k)),
    };
    let cluster = match s.cluster {
        ClusterState::Live => "",
        ClusterState::Deleting => ", TalosCluster being deleted",
        ClusterState::Gone => ", TalosCluster gone",
        ClusterState::Missing => ", no TalosCluster",
    };
    let mut parts = vec![format!(
        "count {}, etcd members {} ({} healthy), approved control planes {} ({} joined and not held), workers {}, schedulable {}, lock {lock}{cluster}",
        s.count,
        s.members(),
        s.healthy(),
        s.approved_cps(),
        s.active(),
        s.workers(),
        s.schedulable
    )];
    let down: Vec<String> = s
        .machines
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.up && m.ever_cp() && !m.wiped && (m.approved || m.member))
        .map(|(i, _)| s.name(i))
        .collect();
    if !down.is_empty() {
        parts.push(format!("down: {}", down.join(", ")));
    }
    let deleting: Vec<String> = s
        .machines
        .iter()
        .enumerate()
        .filter(|(_, m)| m.deleting)
        .map(|(i, _)| s.name(i))
        .collect();
    if !deleting.is_empty() {
        parts.push(format!("being deleted: {}", deleting.join(", ")));
    }
    if !s.pending.is_empty() {
        let p: Vec<String> = s.pending.iter().map(|p| describe(s, p.req)).collect();
        parts.push(format!("in flight: {}", p.join("; ")));
    }
    if !s.ops.is_empty() {
        let o: Vec<String> = s
            .ops
            .iter()
            .enumerate()
            .map(|(k, o)| format!("{} {} {:?}", s.op_name(k), o.kind.name(), o.phase))
            .collect();
        parts.push(format!("operations: {}", o.join(", ")));
    }
    parts.join("; ")
}

pub fn describe(s: &State, req: Req) -> String {
    match req {
        Req::Approve(i) => format!(
            "kubectl patch talosmachine {} (spec.approved: true)",
            s.name(i)
        ),
        Req::Unapprove(i) => format!(
            "kubectl patch talosmachine {} (spec.approved: false)",
            s.name(i)
        ),
        Req::Move(i) => format!(
            "kubectl patch talosmachine {} (spec.clusterRef.name: {})",
            s.name(i),
            super::model::OTHER_CLUSTER
        ),
        Req::Reassign(i) => format!(
            "kubectl patch talosmachine {} (spec.role: {})",
            s.name(i),
            if s.machines.get(usize::from(i)).is_some_and(|m| m.cp()) {
                "worker"
            } else {
                "controlplane"
            }
        ),
        Req::Delete(i) => format!("kubectl annotate+delete talosmachine {}", s.name(i)),
        Req::Prune(i) => format!(
            "kubectl delete talosmachine {} without the allow-delete annotation (a GitOps prune)",
            s.name(i)
        ),
        Req::Collect(i) => format!(
            "the garbage collector deletes talosmachine {} (its TalosCluster is being deleted)",
            s.name(i)
        ),
        Req::Count(c) => {
            format!("kubectl patch taloscluster {CLUSTER} (spec.controlPlane.count: {c})")
        }
        Req::Unschedule => {
            format!("kubectl patch taloscluster {CLUSTER} (spec.schedulable: \"false\")")
        }
        Req::Reschedule => {
            format!("kubectl patch taloscluster {CLUSTER} (spec.schedulable: \"true\")")
        }
        Req::DeleteCluster => format!("kubectl annotate+delete taloscluster {CLUSTER}"),
        Req::PruneCluster => format!(
            "kubectl delete taloscluster {CLUSTER} without the allow-delete annotation (a GitOps prune)"
        ),
        Req::ForgeStatus(i) => format!(
            "someone other than the controller: kubectl patch talosmachine {} --subresource=status \
             (Ready=False NodeUnreachable, Removal DeadMemberRemoval, status.removal committed \
             with memberDead)",
            s.name(i)
        ),
        Req::CreateOperation(kind, t) => {
            let target = if kind.rolls() {
                ", no machine: a roll over the cluster".to_string()
            } else if t == super::model::NONE {
                String::new()
            } else {
                format!(", machine {}", s.name(t))
            };
            format!(
                "kubectl create talosoperation (kind {}{target})",
                kind.name()
            )
        }
    }
}

/// The AdmissionReview the API server sends for this request.
pub fn review_json(
    req_no: usize,
    req: Req,
    op: &Operation,
    old: Option<&Object>,
    new: Option<&Object>,
) -> String {
    let value = |o: Option<&Object>| -> serde_json::Value {
        match o {
            Some(Object::Machine(m)) => serde_json::to_value(m).unwrap_or_default(),
            Some(Object::Cluster(c)) => serde_json::to_value(c).unwrap_or_default(),
            Some(Object::Operation(x)) => serde_json::to_value(x).unwrap_or_default(),
            Some(Object::Backup(b)) => serde_json::to_value(b).unwrap_or_default(),
            Some(Object::Patch(p)) => serde_json::to_value(p).unwrap_or_default(),
            None => serde_json::Value::Null,
        }
    };
    let (kind, resource, name) = match new.or(old) {
        Some(Object::Machine(m)) => ("TalosMachine", "talosmachines", m.name().to_string()),
        Some(Object::Cluster(c)) => ("TalosCluster", "talosclusters", c.name().to_string()),
        Some(Object::Operation(o)) => ("TalosOperation", "talosoperations", o.name().to_string()),
        Some(Object::Backup(b)) => ("TalosEtcdBackup", "talosetcdbackups", b.name().to_string()),
        Some(Object::Patch(p)) => (
            "TalosConfigPatch",
            "talosconfigpatches",
            p.name().to_string(),
        ),
        None => ("TalosMachine", "talosmachines", String::new()),
    };
    let operation = match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    };
    let mut review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("00000000-0000-4000-8000-{req_no:012}"),
            "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": kind},
            "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": resource},
            "requestKind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": kind},
            "requestResource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": resource},
            "name": name,
            "namespace": NAMESPACE,
            "operation": operation,
            "userInfo": {"username": "ichor-rules-verify"},
            "object": value(new),
            "oldObject": value(old),
            "dryRun": false,
        }
    });
    if matches!(req, Req::ForgeStatus(_)) {
        review["request"]["subResource"] = "status".into();
        review["request"]["requestSubResource"] = "status".into();
    }
    serde_json::to_string_pretty(&review).unwrap_or_default() + "\n"
}

/// The live objects as `kubectl get -o yaml` streams them.
pub fn objects_yaml(snap: &Snapshot) -> String {
    let mut docs = Vec::new();
    for c in &snap.clusters {
        docs.push(serde_yaml::to_string(c).unwrap_or_default());
    }
    for m in &snap.machines {
        docs.push(serde_yaml::to_string(m).unwrap_or_default());
    }
    for o in &snap.operations {
        docs.push(serde_yaml::to_string(o).unwrap_or_default());
    }
    docs.join("---\n")
}

fn text_of(
    model: &Model<'_>,
    s: &State,
    n: &Next,
    step_no: usize,
    steps: &[Step],
) -> (&'static str, String) {
    let step = MODEL_STEPS
        .get(usize::from(n.effect.step))
        .copied()
        .unwrap_or("");
    match n.mv {
        Move::Admit { req, in_flight } => {
            let who = if matches!(req, Req::Collect(_)) {
                "api-server"
            } else {
                "person"
            };
            let tail = if in_flight {
                "; in flight: not committed yet"
            } else {
                ""
            };
            (
                who,
                format!(
                    "{} (admitted on the state after step {}{tail})",
                    describe(s, req),
                    step_no - 1
                ),
            )
        }
        Move::Commit(k) => {
            let req = s.pending.get(usize::from(k)).map(|p| p.req);
            let what = req.map(|r| describe(s, r)).unwrap_or_default();
            let when = steps
                .iter()
                .rev()
                .find(|x| x.text.starts_with(&what) && x.text.contains("in flight"))
                .map(|x| format!(" (admitted at step {})", x.n))
                .unwrap_or_default();
            if step == "conflict" {
                (
                    "api-server",
                    format!(
                        "the write of {what}{when} conflicts (resourceVersion changed): dropped"
                    ),
                )
            } else {
                ("api-server", format!("commits {what}{when}"))
            }
        }
        Move::Apply(i) => {
            let name = s.name(i);
            let t = match step {
                "join" => format!("controller: applies {name}: it joins etcd"),
                "hold" => format!("controller: holds {name} (Ready=False; nothing applied)"),
                _ => format!("controller: lifts the hold on {name}"),
            };
            ("controller", t)
        }
        Move::Probe(i) => {
            let m = &s.machines[usize::from(i)];
            let t = if m.up {
                format!(
                    "controller: the probe finds {} answering again (Ready condition cleared)",
                    s.name(i)
                )
            } else {
                format!(
                    "controller: the probe marks {} Ready=False NodeUnreachable",
                    s.name(i)
                )
            };
            ("controller", t)
        }
        Move::Removal(i)
        | Move::RemovalLost(i)
        | Move::RemovalCrash(i)
        | Move::RemovalRefused(i) => {
            let name = s.name(i);
            let before = s.machines.get(usize::from(i)).map_or(0, |m| m.done);
            let after_done = n
                .state
                .names
                .iter()
                .position(|x| Some(x) == s.names.get(usize::from(i)))
                .and_then(|j| n.state.machines.get(j))
                .filter(|m| m.ever_cp())
                .map_or(before, |m| m.done);
            let plan = model.objects.plan.unwrap_or(&[]);
            let new_bits = after_done & !before;
            let texts: Vec<&str> = plan
                .iter()
                .enumerate()
                .filter(|(k, _)| new_bits & (1 << k) != 0)
                .map(|(_, st)| st.text.as_str())
                .collect();
            let done = texts.join(", ");
            let mut t = match (step, texts.is_empty()) {
                ("refused", _) => format!(
                    "controller: the removal of {name} is refused or waits; the lock is released"
                ),
                ("release-finalizer", true) => {
                    format!("controller: release finalizer of {name}: the TalosMachine is gone")
                }
                ("release-finalizer", false) => format!(
                    "controller: removes {name} ({done}, release finalizer): the TalosMachine is gone"
                ),
                ("lock", true) => format!(
                    "controller: takes the cluster lock for the removal of {name} (the next step waits)"
                ),
                (_, false) => format!("controller: removes {name}: {done} (then stops or waits)"),
                (other, true) => format!("controller: {other} {name} (then stops or waits)"),
            };
            match n.mv {
                Move::RemovalLost(_) => t.push_str(
                    "; a Talos call that acted lost its answer (the controller saw no answer)",
                ),
                Move::RemovalCrash(_) => {
                    t.push_str("; the controller crashed right after a Talos call that acted")
                }
                Move::RemovalRefused(_) => t.push_str(
                    "; a Talos call that would have acted was refused, and nothing changed",
                ),
                _ => {}
            }
            ("controller", t)
        }
        Move::Operation(k)
        | Move::OperationLost(k)
        | Move::OperationCrash(k)
        | Move::OperationRefused(k) => {
            let o = s.ops[usize::from(k)];
            let at = o.at();
            let target = if o.kind.rolls() {
                if at == super::model::NONE || at == super::model::GONE {
                    " over the cluster".to_string()
                } else {
                    format!(" over the cluster, at {}", s.name(at))
                }
            } else if o.target == super::model::NONE || o.target == super::model::GONE {
                String::new()
            } else {
                format!(" of {}", s.name(o.target))
            };
            let what = format!("operation {} ({}{target})", s.op_name(k), o.kind.name());
            let after = n.state.ops.get(usize::from(k)).map(|x| x.phase);
            let mut t = match step {
                "operation-park" => format!("controller: parks {what} (the count is even)"),
                "operation-resume" => format!("controller: resumes {what}"),
                "operation-run" => format!(
                    "controller: takes the cluster lock and runs {what}'s plan as far as it goes"
                ),
                "node-down" => {
                    format!("controller: runs {what}'s plan: its call takes the node down")
                }
                _ => match after {
                    Some(super::model::Phase::Succeeded) => {
                        format!("controller: {what} finishes; the lock is released")
                    }
                    Some(super::model::Phase::Failed) => {
                        format!(
                            "controller: {what} fails (a gate did not pass); the lock is released"
                        )
                    }
                    _ => format!("controller: runs {what}'s plan as far as it goes"),
                },
            };
            match n.mv {
                Move::OperationLost(_) => {
                    t.push_str("; the answer to a Talos call that acted was lost")
                }
                Move::OperationCrash(_) => {
                    t.push_str("; the controller crashed right after a Talos call that acted")
                }
                Move::OperationRefused(_) => t.push_str(
                    "; a Talos call that would have acted was refused, and nothing changed",
                ),
                _ => {}
            }
            ("controller", t)
        }
        Move::Teardown => (
            "controller",
            format!("controller: TalosCluster {CLUSTER} is gone (no machine refers to it)"),
        ),
        Move::NodeDies(i) => ("environment", format!("node {} dies", s.name(i))),
        Move::NodeReturns(i) => ("environment", format!("node {} answers again", s.name(i))),
        Move::NodeReturnsBehind(i) => (
            "environment",
            format!(
                "node {} answers again, its etcd member not caught up yet",
                s.name(i)
            ),
        ),
        Move::EtcdCatchesUp(i) => (
            "environment",
            format!(
                "the etcd member of node {} has caught up: healthy again",
                s.name(i)
            ),
        ),
        Move::UpgradeNotTaken(i) => (
            "environment",
            format!(
                "node {} answers again, running its old version: the upgrade did not take",
                s.name(i)
            ),
        ),
        Move::PdbBlocks => (
            "environment",
            "a PodDisruptionBudget blocks evictions from the nodes being drained".into(),
        ),
        Move::PdbLifts => ("environment", "the PodDisruptionBudget lifts".into()),
        Move::LockExpires => (
            "environment",
            format!(
                "the cluster's lock, held by {}, expires: its holder kept it past the lock's \
                 duration without renewing it",
                match s.lock {
                    super::model::Lock::Removal(h) => format!("the removal of {}", s.name(h)),
                    super::model::Lock::Operation(k) => format!("TalosOperation {}", s.op_name(k)),
                    super::model::Lock::Free => "nobody".into(),
                }
            ),
        ),
        Move::SnapshotTaken => (
            "environment",
            format!(
                "TalosEtcdBackup {} takes a verified etcd snapshot",
                super::model::BACKUP
            ),
        ),
        Move::SnapshotAges => (
            "environment",
            format!(
                "the newest snapshot of TalosEtcdBackup {} grows older than the rules allow",
                super::model::BACKUP
            ),
        ),
        Move::TimePasses(k) => (
            "environment",
            format!(
                "time passes: the step TalosOperation {} is at outlasts its `within`",
                s.op_name(k)
            ),
        ),
    }
}

/// Replays the path to a violation on concrete states and tells it.
pub fn build(
    model: &Model<'_>,
    ex: &Exploration,
    checks: &[InvariantCheck],
    v: &Violation,
) -> Trace {
    let check = &checks[v.invariant];
    let mut trace = Trace {
        invariant: check.meta.name.clone(),
        sequential: check.meta.sequential,
        message: v.message.clone(),
        start: String::new(),
        steps: Vec::new(),
        replay_error: None,
        blocked: None,
        loop_from: None,
    };
    let path = path_to(ex, v.from);
    let Some(first) = path.first() else {
        return trace;
    };
    let start_key = &ex.keys[*first as usize];
    let Some(mut s) = State::initial(&model.bounds)
        .into_iter()
        .find(|c| key_of(c).as_slice() == start_key)
    else {
        trace.replay_error = Some("no starting state matches the trace".into());
        return trace;
    };
    trace.start = summary(&s);
    let mut fired = Fired::default();
    let mut nexts = Vec::new();
    let mut targets: Vec<(Vec<u8>, bool)> = path[1..]
        .iter()
        .map(|id| (ex.keys[*id as usize].to_vec(), false))
        .collect();
    if let Some(k) = &v.to_key {
        targets.push((k.clone(), true));
    }
    // A liveness violation goes on: to where the controller has nothing left to do, or
    // round a livelock.
    if let Some(at) = v.loop_at {
        trace.loop_from = Some(path.len() - 1 + at);
    }
    targets.extend(
        v.lasso
            .iter()
            .map(|id| (ex.keys[*id as usize].to_vec(), false)),
    );
    for (n, (want, last)) in targets.iter().enumerate() {
        let step_no = n + 1;
        let lazy = Lazy::new(&model.objects, &s);
        nexts.clear();
        model.successors(&s, &lazy, &mut Memo::default(), &mut fired, &mut nexts);
        let snap = lazy.get();
        let before = Facts::of_state(&s);
        let found = nexts.iter().position(|x| {
            key_of(&x.state) == *want
                && (!last || {
                    let f = Facts::of_transition(&before, &x.state, &x.effect);
                    matches!(check.holds(&f, x.state.concurrent), Outcome::Broken(_))
                })
        });
        let Some(pos) = found else {
            trace.replay_error = Some(if *last {
                format!(
                    "step {step_no} ({:?}, breaking the invariant) could not be replayed",
                    v.mv
                )
            } else {
                format!("step {step_no} could not be replayed")
            });
            return trace;
        };
        let next = nexts.swap_remove(pos);
        let (actor, text) = text_of(model, &s, &next, step_no, &trace.steps);
        let mut rules = Vec::new();
        let mut fixture = None;
        if let Move::Admit { req, .. } = next.mv {
            if let Some(d) = model.admit(&s, snap, req) {
                rules = d
                    .warnings
                    .iter()
                    .map(|f| format!("{} (warn)", f.rule))
                    .collect();
                if rules.is_empty() {
                    rules.push("no rule refused".into());
                }
            }
            if let Some((op, old, new)) = model.objects.request(&s, snap, req) {
                fixture = Some((
                    objects_yaml(snap),
                    review_json(step_no, req, &op, old.as_ref(), new.as_ref()),
                ));
            }
        }
        s = next.state;
        trace.steps.push(Step {
            n: step_no,
            actor,
            text,
            rules,
            state: summary(&s),
            fixture,
        });
    }
    if v.to_key.is_none() {
        trace.blocked = blocked(model, &s);
    }
    trace
}

/// In words, the removal that operations waiting for the even count block in `s`, if any.
fn blocked(model: &Model<'_>, s: &State) -> Option<String> {
    let lazy = Lazy::new(&model.objects, s);
    let mut nexts = Vec::new();
    let outcomes = model.successors(
        s,
        &lazy,
        &mut Memo::default(),
        &mut Fired::default(),
        &mut nexts,
    );
    let (i, waiting) = outcomes.cure_blocked?;
    let req = Req::Delete(i);
    let rules: Vec<String> = model
        .admit(s, lazy.get(), req)
        .map(|d| d.refusals.iter().map(|f| f.rule.clone()).collect())
        .unwrap_or_default();
    let ops: Vec<String> = (0..s.ops.len())
        .filter(|k| *k < 64 && waiting & (1 << k) != 0)
        .map(|k| s.op_name(k))
        .collect();
    Some(format!(
        "{} is refused here by {}; without {} it would be allowed",
        describe(s, req),
        rules.join(", "),
        ops.join(", ")
    ))
}
