//! A new cluster's bootstrap, explored (issue 37): the product's own bootstrap procedure
//! (`exec::bootstrap::reconcile`, the one the controller runs, decided by the `bootstrap
//! controlplane` rules of the table given) in a model world of three control planes and
//! the TalosCluster's status, reconciled again and again by two controllers: one reads the
//! cluster as it is, the other as it was one step before (a stale read, so both may decide
//! from the same state). Any one fault may hit any call of a reconcile: a crash before or
//! after the call acts, an answer lost after it acted, a call that never reaches the node,
//! a refusal by Talos that did nothing, a node with nothing to dial it with. etcd started by
//! a `Bootstrap` lists no member until it has started (a step of the world of its own), and
//! Talos refuses a `Bootstrap` on a node whose etcd has data, as it does.
//!
//! Three starting points: a new cluster (no etcd anywhere); an existing one whose first
//! control plane was replaced (etcd runs on the second and third, none on the new first
//! one, and nothing is recorded on the TalosCluster: adopted, or restored from elsewhere);
//! and a new cluster whose third control plane is in Talos' maintenance mode, not
//! configured (it fails the cluster's handshake and answers only the maintenance API; the
//! controller decides no bootstrap for it).
//!
//! Every state reached is checked:
//!
//! - `bootstrap-once`: no `Bootstrap` reaches a node once etcd has been started anywhere
//!   (by an earlier `Bootstrap`, or running already): a second one would start a second
//!   etcd cluster beside the first, or is a call the rules say is never sent again.
//! - `bootstrap-ends`: from the state reached, reconciles without faults bootstrap the
//!   cluster (some control plane's etcd runs), or the TalosCluster's record says why they
//!   cannot and what a person does (a recorded call etcd never confirms: it may have reached
//!   the node, so the controller never sends it again).

use super::procedure::{Crashed, Report, unused_world_parts};
use crate::compile::Table;
use crate::runtime::exec::bootstrap::{BootstrapWorld, reconcile};
use crate::runtime::exec::{Call, Node, NodeError, Reply, Timing, World, run_now};
use crate::runtime::live::Reads;
use crate::runtime::objects::{BootstrapRecord, Snapshot, TalosCluster, TalosMachine};
use crate::runtime::talos::{EtcdMember, TalosError};
use k8s_openapi::jiff::Timestamp;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

/// The control planes of the model, in rank order.
const NODES: usize = 3;

/// What a fault does to the call it hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The controller stops before the call acts (a read: before it is answered).
    CrashBefore,
    /// The call acts, then the controller stops.
    CrashAfter,
    /// A `Bootstrap` acts; its answer is lost (the procedure sees no answer).
    Lost,
    /// The call never reaches the node (the procedure sees no answer).
    Unreached,
    /// Talos refuses a `Bootstrap` without acting (for example: not ready for it yet).
    Refused,
    /// There is nothing to dial the node with (its credentials or its endpoint are gone).
    NotDialled,
}

const FAULTS: [Fault; 6] = [
    Fault::CrashBefore,
    Fault::CrashAfter,
    Fault::Lost,
    Fault::Unreached,
    Fault::Refused,
    Fault::NotDialled,
];

/// A misbehaving world, to show that the invariants can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// A guarded record write succeeds whatever was read: as if the procedure recorded
    /// without naming the resourceVersion it read.
    Unguarded,
    /// Record writes drop their message: as if the procedure left an unconfirmed
    /// bootstrap unexplained.
    Silent,
}

/// A node's etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Etcd {
    /// No data: waiting to be bootstrapped or to join.
    None,
    /// Bootstrapped, not yet started: it lists no member yet.
    Starting,
    Running,
    /// In Talos' maintenance mode: no configuration yet (an unconfigured spare), so no
    /// etcd. Its cluster API fails the handshake; its maintenance API answers. The
    /// controller does not decide its bootstrap (it is not configured).
    Maintenance,
}

/// The world between reconciles.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The TalosCluster's `status.bootstrap`, as JSON text.
    record: Option<String>,
    etcd: [Etcd; NODES],
    /// The cluster as the stale controller read it (one step before), whether nothing was
    /// written since (its resourceVersion still current), and the nodes' etcd as it then
    /// answered (its reads of etcd happened then too; its calls act on the world as it is).
    stale: Option<(Option<String>, bool, [Etcd; NODES])>,
    /// A `Bootstrap` reached a node after etcd had been started somewhere.
    again: bool,
    /// Steps so far (the clock: one minute each).
    step: u8,
}

struct ModelBootstrap {
    now: Timestamp,
    record: Option<BootstrapRecord>,
    etcd: [Etcd; NODES],
    /// The nodes' etcd as this reconcile's reads see it (as it was, for a stale read).
    seen: [Etcd; NODES],
    /// The reconcile read the cluster as it is (its guarded writes can succeed).
    current: bool,
    wrote: bool,
    again: bool,
    calls: usize,
    fault: Option<(usize, Fault)>,
    mutant: Option<Mutant>,
}

impl ModelBootstrap {
    fn fault(&mut self) -> Option<Fault> {
        let k = self.calls;
        self.calls += 1;
        self.fault.filter(|(at, _)| *at == k).map(|(_, f)| f)
    }

    fn started(&self) -> bool {
        self.etcd
            .iter()
            .any(|e| matches!(e, Etcd::Starting | Etcd::Running))
    }
}

/// The index of the model's node `m` (`cp-1` is 0).
fn index(m: &TalosMachine) -> Option<usize> {
    m.name()
        .strip_prefix("cp-")
        .and_then(|n| n.parse::<usize>().ok())
        .and_then(|n| n.checked_sub(1))
        .filter(|i| *i < NODES)
}

fn failed(code: Code, message: &str) -> NodeError {
    NodeError::Talos(TalosError::Failed {
        endpoint: "model".into(),
        node: None,
        code,
        message: message.into(),
    })
}

fn unreachable() -> NodeError {
    NodeError::Talos(TalosError::Unreachable {
        endpoint: "model".into(),
        node: None,
        detail: "no answer".into(),
    })
}

impl World for ModelBootstrap {
    type Error = Crashed;

    fn now(&self) -> Timestamp {
        self.now
    }

    unused_world_parts!("bootstrap");

    async fn talos(
        &mut self,
        _cluster: &str,
        node: Node<'_>,
        call: Call,
    ) -> Result<Result<Reply, NodeError>, Crashed> {
        let (m, maintenance_api) = match node {
            Node::Endpoint(m) => (m, false),
            Node::Maintenance(m) => (m, true),
            Node::Via(..) => {
                return Ok(Err(NodeError::NoEndpoint(
                    "the model dials no proxy".into(),
                )));
            }
        };
        let Some(i) = index(m) else {
            return Ok(Err(NodeError::NoEndpoint(m.name().to_string())));
        };
        let fault = self.fault();
        if fault == Some(Fault::CrashBefore) {
            return Err(Crashed);
        }
        // Only a node in maintenance mode answers there, and only there.
        let in_maintenance = self.etcd[i] == Etcd::Maintenance;
        if maintenance_api || in_maintenance {
            return Ok(match fault {
                Some(Fault::NotDialled) => Err(NodeError::NoEndpoint(m.name().to_string())),
                Some(Fault::Unreached | Fault::Lost) => Err(unreachable()),
                _ if maintenance_api && in_maintenance && call == Call::Version => {
                    Ok(Reply::Version("v1.12.0 (maintenance)".into()))
                }
                _ if maintenance_api && in_maintenance => Err(failed(
                    Code::Unimplemented,
                    "not available in maintenance mode",
                )),
                _ => Err(unreachable()),
            });
        }
        match call {
            Call::EtcdMemberList => Ok(match fault {
                Some(Fault::Unreached | Fault::Lost) => Err(unreachable()),
                Some(Fault::NotDialled) => Err(NodeError::NoEndpoint(m.name().to_string())),
                _ if self.seen[i] == Etcd::Running => Ok(Reply::Members(
                    (0..NODES)
                        .filter(|j| self.seen[*j] == Etcd::Running)
                        .map(|j| EtcdMember {
                            id: j as u64 + 1,
                            hostname: format!("cp-{}", j + 1),
                            peer_urls: Vec::new(),
                            client_urls: Vec::new(),
                            is_learner: false,
                        })
                        .collect(),
                )),
                _ => Err(failed(Code::Unavailable, "etcd is not running")),
            }),
            Call::Bootstrap => {
                match fault {
                    Some(Fault::Unreached) => return Ok(Err(unreachable())),
                    Some(Fault::Refused) => {
                        return Ok(Err(failed(
                            Code::FailedPrecondition,
                            "the machine is not ready to be bootstrapped",
                        )));
                    }
                    Some(Fault::NotDialled) => {
                        return Ok(Err(NodeError::NoEndpoint(m.name().to_string())));
                    }
                    _ => {}
                }
                // The call reaches the node.
                if self.started() {
                    self.again = true;
                }
                let answer = if self.etcd[i] == Etcd::None {
                    self.etcd[i] = Etcd::Starting;
                    Ok(Reply::Done)
                } else {
                    Err(failed(
                        Code::AlreadyExists,
                        "etcd data directory is not empty",
                    ))
                };
                match fault {
                    Some(Fault::CrashAfter) => Err(Crashed),
                    Some(Fault::Lost) => Ok(Err(unreachable())),
                    _ => Ok(answer),
                }
            }
            // The etcd data directory: not empty once a Bootstrap reached the node (or its
            // etcd ran).
            Call::List { .. } => Ok(match fault {
                Some(Fault::Unreached | Fault::Lost) => Err(unreachable()),
                Some(Fault::NotDialled) => Err(NodeError::NoEndpoint(m.name().to_string())),
                _ => Ok(Reply::Entries(u64::from(matches!(
                    self.seen[i],
                    Etcd::Starting | Etcd::Running
                )))),
            }),
            _ => Ok(Err(NodeError::NoEndpoint(
                "the bootstrap model makes no such call".into(),
            ))),
        }
    }

    async fn read(&mut self, _cluster: &str, _reads: Reads) -> Result<Arc<Snapshot>, Crashed> {
        Err(Crashed)
    }
}

impl BootstrapWorld for ModelBootstrap {
    async fn record_bootstrap(
        &mut self,
        _cluster: &TalosCluster,
        record: Option<&BootstrapRecord>,
        guard: bool,
    ) -> Result<bool, Crashed> {
        let fault = self.fault();
        if fault == Some(Fault::CrashBefore) {
            return Err(Crashed);
        }
        if guard && (!self.current || self.wrote) && self.mutant != Some(Mutant::Unguarded) {
            return Ok(false);
        }
        self.record = record.cloned();
        if self.mutant == Some(Mutant::Silent)
            && let Some(r) = self.record.as_mut()
        {
            r.message = None;
        }
        self.wrote = true;
        match fault {
            Some(Fault::CrashAfter) => Err(Crashed),
            _ => Ok(true),
        }
    }

    async fn cluster_event(&mut self, _on: &TalosCluster, _w: bool, _r: &str, _n: String) {}
}

fn cluster(record: Option<&str>, current: bool) -> Option<TalosCluster> {
    let mut c: TalosCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "prod", "namespace": "infra",
                     "resourceVersion": if current { "2" } else { "1" }},
        "spec": {"controlPlane": {"count": 3}, "baseConfigSecretRef": {"name": "prod-base"}}
    }))
    .ok()?;
    if let Some(text) = record {
        let r: BootstrapRecord = serde_json::from_str(text).ok()?;
        c.status.get_or_insert_with(Default::default).bootstrap = Some(r);
    }
    Some(c)
}

fn machines() -> Option<Vec<TalosMachine>> {
    (1..=NODES)
        .map(|i| {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
                "metadata": {"name": format!("cp-{i}"), "namespace": "infra"},
                "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane",
                         "approved": true, "endpoint": format!("10.0.0.{i}")}
            }))
            .ok()
        })
        .collect()
}

/// The model's fixed parts: the table, the control planes, the timing, the epoch.
struct Setup<'t> {
    table: &'t Table,
    machines: Vec<TalosMachine>,
    timing: Timing,
    epoch: Timestamp,
    mutant: Option<Mutant>,
}

impl<'t> Setup<'t> {
    fn new(table: &'t Table, mutant: Option<Mutant>, epoch: Timestamp) -> Option<Setup<'t>> {
        Some(Setup {
            table,
            machines: machines()?,
            timing: Timing {
                refused_requeue: Duration::from_secs(60),
                lock_retry: Duration::from_secs(5),
                drain_retry: Duration::from_secs(5),
                reset_settle: Duration::from_secs(5),
                sent_deadline: Duration::from_secs(600),
            },
            epoch,
            mutant,
        })
    }

    fn now(&self, step: u8) -> Timestamp {
        self.epoch
            .checked_add(Duration::from_secs(60 * u64::from(step)))
            .unwrap_or(self.epoch)
    }

    /// One reconcile of machine `i` by a controller that read `record` (`current`: as it
    /// is now), with `fault`; the world after it, its acting calls, and whether it ended.
    fn reconcile(
        &self,
        s: &State,
        i: usize,
        read: (Option<&str>, bool, [Etcd; NODES]),
        fault: Option<(usize, Fault)>,
    ) -> Option<(ModelBootstrap, bool)> {
        let (record, current, seen) = read;
        let snapshot = Snapshot {
            machines: self.machines.clone(),
            clusters: vec![cluster(record, current)?],
            ..Snapshot::default()
        };
        let live = self.machines.get(i)?;
        let mut w = ModelBootstrap {
            now: self.now(s.step),
            record: s
                .record
                .as_deref()
                .and_then(|t| serde_json::from_str(t).ok()),
            etcd: s.etcd,
            seen,
            current,
            wrote: false,
            again: s.again,
            calls: 0,
            fault,
            mutant: self.mutant,
        };
        let identity = if current {
            "controller-a"
        } else {
            "controller-b"
        };
        let ran = run_now(reconcile(
            &mut w,
            self.table,
            &self.timing,
            identity,
            &snapshot,
            live,
        ));
        let ended = matches!(ran, Some(Ok(_)));
        Some((w, ended))
    }

    /// Whether reconciles without faults, of every control plane by a controller reading
    /// the cluster as it is, with etcd starting where it was bootstrapped, bootstrap the
    /// cluster or leave a record saying why not, within ten minutes.
    fn ends(&self, s: &State) -> Result<(), String> {
        let mut s = s.clone();
        for _ in 0..10 {
            for e in s.etcd.iter_mut() {
                if *e == Etcd::Starting {
                    *e = Etcd::Running;
                }
            }
            if s.etcd.contains(&Etcd::Running) {
                return Ok(());
            }
            for i in 0..NODES {
                if s.etcd[i] == Etcd::Maintenance {
                    continue;
                }
                let record = s.record.clone();
                let Some((w, _)) = self.reconcile(&s, i, (record.as_deref(), true, s.etcd), None)
                else {
                    return Err("the model's objects did not build".into());
                };
                s.record = w
                    .record
                    .as_ref()
                    .and_then(|r| serde_json::to_string(r).ok());
                s.etcd = w.etcd;
            }
            s.step = s.step.saturating_add(1);
        }
        let record: Option<BootstrapRecord> = s
            .record
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok());
        match record {
            Some(r) if !r.confirmed && r.message.is_some() => Ok(()),
            Some(r) => Err(format!(
                "ten minutes of reconciles without a fault leave etcd unstarted and the \
                 record {} unexplained",
                serde_json::to_string(&r).unwrap_or_default()
            )),
            None => Err(
                "ten minutes of reconciles without a fault leave etcd unstarted and nothing \
                 recorded"
                    .into(),
            ),
        }
    }
}

/// The states the exploration starts from, as the report names them.
pub const STARTS: [&str; 3] = [
    "a new cluster (no etcd anywhere)",
    "a cluster whose etcd runs on cp-2 and cp-3, cp-1 new (nothing recorded)",
    "a new cluster whose cp-3 is in Talos' maintenance mode (not configured yet)",
];

/// Explores `depth` steps from each of [`STARTS`], breadth-first: a step is etcd starting where it was bootstrapped, or a
/// reconcile of any control plane by either controller with any one fault at any of its
/// calls. `table`: the rules that decide the bootstrap; `mutant` makes the world misbehave.
pub fn explore(table: &Table, depth: u8, mutant: Option<Mutant>) -> Report {
    let mut report = Report::default();
    let epoch = Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
    let Some(setup) = Setup::new(table, mutant, epoch) else {
        return report;
    };
    let starts = [
        [Etcd::None, Etcd::None, Etcd::None],
        [Etcd::None, Etcd::Running, Etcd::Running],
        [Etcd::None, Etcd::None, Etcd::Maintenance],
    ];
    let mut seen: HashSet<State> = HashSet::new();
    let mut queue: VecDeque<(State, Vec<String>)> = VecDeque::new();
    for (etcd, start) in starts.into_iter().zip(STARTS) {
        let s = State {
            record: None,
            etcd,
            stale: None,
            again: false,
            step: 0,
        };
        seen.insert(s.clone());
        queue.push_back((s, vec![format!("from {start}")]));
    }
    while let Some((s, path)) = queue.pop_front() {
        report.states += 1;
        if let Err(why) = setup.ends(&s) {
            report.violate("bootstrap-ends", &path, why);
        }
        if s.step >= depth {
            continue;
        }
        let mut next: Vec<(State, String)> = Vec::new();
        // etcd starting where it was bootstrapped.
        if s.etcd.contains(&Etcd::Starting) {
            let mut n = s.clone();
            for e in n.etcd.iter_mut() {
                if *e == Etcd::Starting {
                    *e = Etcd::Running;
                }
            }
            n.stale = Some((s.record.clone(), true, s.etcd));
            n.step += 1;
            next.push((n, "etcd starts".into()));
        }
        let mut reads = vec![(s.record.clone(), true, s.etcd)];
        if let Some((r, current, seen)) = &s.stale {
            reads.push((r.clone(), *current, *seen));
        }
        for (ri, (read, current, seen)) in reads.iter().enumerate() {
            for i in 0..NODES {
                // Not configured: the controller does not decide its bootstrap.
                if s.etcd[i] == Etcd::Maintenance {
                    continue;
                }
                let mut plans = vec![None];
                let mut k = 0;
                while k < plans.len() {
                    let fault = plans[k];
                    k += 1;
                    let Some((w, ended)) =
                        setup.reconcile(&s, i, (read.as_deref(), *current, *seen), fault)
                    else {
                        continue;
                    };
                    report.reconciles += 1;
                    if fault.is_none() {
                        for c in 0..w.calls {
                            for f in FAULTS {
                                plans.push(Some((c, f)));
                            }
                        }
                    }
                    let n = State {
                        record: w
                            .record
                            .as_ref()
                            .and_then(|r| serde_json::to_string(r).ok()),
                        etcd: w.etcd,
                        stale: Some((s.record.clone(), !w.wrote, s.etcd)),
                        again: w.again,
                        step: s.step + 1,
                    };
                    let who = if ri == 0 { "fresh" } else { "stale" };
                    let how = match fault {
                        None => String::new(),
                        Some((c, f)) => format!(", {f:?} at call {c}"),
                    };
                    let end = if ended { "" } else { " (stopped)" };
                    next.push((n, format!("cp-{} reconciled, {who} read{how}{end}", i + 1)));
                }
            }
        }
        for (n, step) in next {
            let mut p = path.clone();
            p.push(step);
            if n.again {
                report.violate(
                    "bootstrap-once",
                    &p,
                    "a Bootstrap reached a node after etcd had been started".into(),
                );
            }
            if seen.insert(n.clone()) {
                queue.push_back((n, p));
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Table {
        without(None)
    }

    /// The shipped rules, the rule `drop` removed (up to the next blank line).
    fn without(drop: Option<&str>) -> Table {
        let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rules");
        let mut files =
            crate::ruleset::read_sources(std::slice::from_ref(&root)).expect("the shipped rules");
        if let Some(head) = drop {
            let f = files
                .iter_mut()
                .find(|f| f.text.contains(head))
                .expect("the rule");
            let start = f.text.find(head).expect("the rule");
            let end = f.text[start..]
                .find("\n\n")
                .map_or(f.text.len(), |e| start + e + 1);
            let text = format!("{}{}", &f.text[..start], &f.text[end..]);
            *f = crate::diagnostics::SourceFile::new(f.path.clone(), text);
        }
        crate::ruleset::build(files)
            .table
            .expect("the rules compile")
    }

    #[test]
    fn the_shipped_bootstrap_holds_both_invariants_under_every_fault() {
        let r = explore(&shipped(), 4, None);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert!(r.states > 100, "{r:?}");
        assert!(r.reconciles > r.states, "{r:?}");
    }

    /// The shipped rules with `edit` made to admission.rules' text.
    fn edited(edit: impl Fn(&str) -> String) -> Table {
        crate::verify::procedure::shipped_edited(|t| {
            if t.contains("plan bootstrap controlplane\n") {
                edit(t)
            } else {
                t.to_string()
            }
        })
    }

    #[test]
    fn a_plan_bootstrap_without_its_talos_bootstrap_is_refuted() {
        let t = edited(|t| t.replace("  do talos bootstrap\n", ""));
        let plan = t
            .plan(
                crate::vocab::Verb::Bootstrap,
                crate::vocab::Subject::ControlPlane,
            )
            .expect("the plan, empty");
        assert!(plan.steps.is_empty());
        let r = explore(&t, 2, None);
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "bootstrap-ends")
            .unwrap_or_else(|| panic!("{r:?}"));
        assert!(v.trace[0].contains("a new cluster"), "{v:?}");
        // A table with no such plan at all: nothing bootstrapped either, refuted the same.
        let none = edited(|t| {
            let at = t.find("plan bootstrap controlplane\n").expect("the plan");
            t[..at].to_string()
        });
        assert!(
            none.plan(
                crate::vocab::Verb::Bootstrap,
                crate::vocab::Subject::ControlPlane
            )
            .is_none()
        );
        let r = explore(&none, 2, None);
        assert!(
            r.violations.iter().any(|v| v.invariant == "bootstrap-ends"),
            "{r:?}"
        );
    }

    #[test]
    fn a_plan_bootstrap_guarded_off_for_the_first_control_plane_is_refuted() {
        let t = edited(|t| {
            t.replace(
                "  do talos bootstrap\n",
                "  do talos bootstrap when rank != 1\n",
            )
        });
        let r = explore(&t, 2, None);
        assert!(
            r.violations.iter().any(|v| v.invariant == "bootstrap-ends"),
            "{r:?}"
        );
    }

    #[test]
    fn a_talos_bootstrap_written_twice_is_still_sent_once() {
        let t = edited(|t| {
            t.replace(
                "  do talos bootstrap\n",
                "  do talos bootstrap\n  do talos bootstrap\n",
            )
        });
        let r = explore(&t, 4, None);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // One reconcile of the first control plane of a new cluster: one Bootstrap sent.
        let setup = Setup::new(&t, None, Timestamp::UNIX_EPOCH).expect("the model's objects");
        let s = State {
            record: None,
            etcd: [Etcd::None; NODES],
            stale: None,
            again: false,
            step: 0,
        };
        let (w, ended) = setup
            .reconcile(&s, 0, (None, true, s.etcd), None)
            .expect("a reconcile");
        assert!(ended);
        assert_eq!(w.etcd[0], Etcd::Starting);
        assert!(!w.again);
    }

    #[test]
    fn an_unconfigured_control_plane_in_maintenance_mode_does_not_hold_the_bootstrap_up() {
        let t = shipped();
        let setup = Setup::new(&t, None, Timestamp::UNIX_EPOCH).expect("the model's objects");
        let s = State {
            record: None,
            etcd: [Etcd::None, Etcd::None, Etcd::Maintenance],
            stale: None,
            again: false,
            step: 0,
        };
        let (w, ended) = setup
            .reconcile(&s, 0, (None, true, s.etcd), None)
            .expect("a reconcile");
        assert!(ended);
        assert_eq!(w.etcd[0], Etcd::Starting, "{:?}", w.record);
        // Its maintenance API not answering either: unreadable, nothing sent. cp-3 is the
        // last control plane asked: its cluster-API call is call 4, its maintenance call 5.
        let (w, _) = setup
            .reconcile(&s, 0, (None, true, s.etcd), Some((5, Fault::Unreached)))
            .expect("a reconcile");
        assert_eq!(w.etcd, s.etcd);
        assert!(w.record.is_none(), "{:?}", w.record);
        assert_eq!(
            w.calls, 6,
            "members and data of cp-1, cp-2; cp-3 over both APIs"
        );
    }

    #[test]
    fn a_record_written_without_its_guard_lets_two_controllers_bootstrap() {
        let r = explore(&shipped(), 3, Some(Mutant::Unguarded));
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "bootstrap-once")
            .unwrap_or_else(|| panic!("{r:?}"));
        assert!(v.trace.iter().any(|t| t.contains("stale read")), "{v:?}");
    }

    #[test]
    fn an_unconfirmed_bootstrap_left_unexplained_is_refuted() {
        let r = explore(&shipped(), 3, Some(Mutant::Silent));
        assert!(
            r.violations.iter().any(|v| v.invariant == "bootstrap-ends"),
            "{r:?}"
        );
        assert!(
            !r.violations.iter().any(|v| v.invariant == "bootstrap-once"),
            "{r:?}"
        );
    }

    #[test]
    fn without_bootstrap_etcd_exists_a_replaced_first_control_plane_starts_a_second_etcd() {
        let r = explore(&without(Some("rule bootstrap-etcd-exists\n")), 2, None);
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "bootstrap-once")
            .unwrap_or_else(|| panic!("{r:?}"));
        assert_eq!(v.trace.len(), 2, "{v:?}");
        assert!(v.trace[0].contains("etcd runs on cp-2 and cp-3"), "{v:?}");
    }

    #[test]
    fn a_bootstrap_that_certainly_did_not_act_is_withdrawn_and_decided_again() {
        use crate::runtime::exec::bootstrap::maybe_acted;
        let t = shipped();
        let setup = Setup::new(&t, None, Timestamp::UNIX_EPOCH).expect("the model's objects");
        let s = State {
            record: None,
            etcd: [Etcd::None; NODES],
            stale: None,
            again: false,
            step: 0,
        };
        // The calls of a reconcile of cp-1: etcd's members and data directory of each
        // control plane (calls 0 to 5), the record (6), the Bootstrap (7).
        for (fault, withdrawn) in [
            (Fault::NotDialled, true),
            (Fault::Refused, true),
            (Fault::Unreached, false),
            (Fault::Lost, false),
        ] {
            let (w, ended) = setup
                .reconcile(&s, 0, (None, true, s.etcd), Some((7, fault)))
                .expect("a reconcile");
            assert!(ended, "{fault:?}");
            assert_eq!(w.record.is_none(), withdrawn, "{fault:?}: {:?}", w.record);
        }
        assert!(!maybe_acted(&NodeError::NoEndpoint("cp-1".into())));
        assert!(!maybe_acted(&failed(
            Code::AlreadyExists,
            "etcd data directory is not empty"
        )));
        assert!(maybe_acted(&failed(Code::Unknown, "?")));
        assert!(maybe_acted(&failed(Code::DeadlineExceeded, "?")));
        assert!(maybe_acted(&unreachable()));
        // Withdrawn: the next reconcile decides again and sends it.
        let (w, _) = setup
            .reconcile(&s, 0, (None, true, s.etcd), None)
            .expect("a reconcile");
        assert_eq!(w.etcd[0], Etcd::Starting);
        assert!(
            w.record.as_ref().is_some_and(|r| r.confirmed),
            "{:?}",
            w.record
        );
    }

    #[test]
    fn a_recorded_bootstrap_etcd_never_confirms_is_explained_once_after_two_minutes() {
        let t = shipped();
        let setup = Setup::new(&t, None, Timestamp::UNIX_EPOCH).expect("the model's objects");
        let mut s = State {
            record: None,
            etcd: [Etcd::None; NODES],
            stale: None,
            again: false,
            step: 0,
        };
        // The controller stops right after recording (call 6: the record write).
        let (w, ended) = setup
            .reconcile(&s, 0, (None, true, s.etcd), Some((6, Fault::CrashAfter)))
            .expect("a reconcile");
        assert!(!ended);
        let recorded = w.record.clone().expect("recorded");
        assert!(recorded.message.is_none() && !recorded.confirmed);
        s.record = serde_json::to_string(&recorded).ok();
        let mut said = Vec::new();
        for step in 1..=4u8 {
            s.step = step;
            let (w, _) = setup
                .reconcile(&s, 0, (s.record.clone().as_deref(), true, s.etcd), None)
                .expect("a reconcile");
            assert_eq!(w.etcd, [Etcd::None; NODES], "never sent again");
            let r = w.record.clone().expect("kept");
            said.push(r.message.clone());
            s.record = serde_json::to_string(&r).ok();
        }
        // Nothing said in the first two minutes; said at two, and the same words after.
        assert_eq!(said[0], None);
        let words = said[1].clone().expect("said after two minutes");
        assert!(words.contains("talosctl -n cp-1 bootstrap"), "{words}");
        assert!(words.contains("never sends it again"), "{words}");
        assert_eq!(said[2].as_deref(), Some(words.as_str()));
        assert_eq!(said[3].as_deref(), Some(words.as_str()));
    }
}
