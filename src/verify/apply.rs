//! A machine's configuration applied, explored (issue 37): the product's own apply
//! procedure (`exec::apply::reconcile`, the one the controller runs for every approved
//! machine the rules let through, walking the `plan apply <role>` of the table given)
//! in a model world of one node and the API server's copy of
//! the machine's status, reconciled again and again with any one fault at any of its calls:
//! an `ApplyConfiguration` (dry run or real) that crashes the controller before or after it
//! acts, acts and loses its answer, is refused by Talos, or cannot be made; and the status
//! write at the reconcile's end lost to a crash. Between reconciles the world may change
//! the cluster's base (a new configuration to apply) and reboot the node (the roll's reboot:
//! it runs what was staged). Three starting points: a node whose changes apply without a
//! reboot, one whose changes need one, and one in maintenance mode with no configuration;
//! each once for a control plane and once for a worker (each role's plan is explored).
//!
//! Every state reached is checked:
//!
//! - `applied-runs`: the configuration the status records applied (`appliedHash`) is one
//!   the node has run: a staged configuration is never counted applied before its reboot,
//!   and a lost answer never records what did not happen;
//! - `no-reboot-by-apply`: no real `ApplyConfiguration` reboots a configured node (a change
//!   that needs a reboot is staged, and the roll reboots one node at a time);
//! - `dry-run-first`: nothing is applied (or staged) that Talos' dry run did not pass: every
//!   real `ApplyConfiguration` follows, in the same reconcile, a dry run of the same
//!   configuration on the same API that Talos answered with success;
//! - `apply-ends`: from the state reached, reconciles without faults (with the roll's
//!   reboot whenever something is staged) record the current configuration applied.

use super::procedure::{Crashed, Report, unused_world_parts};
use crate::compile::Table;
use crate::runtime::controller::status::{self, Conditions};
use crate::runtime::exec::apply::{ApplyError, ApplyWorld, BaseError, TalosApi, reconcile};
use crate::runtime::exec::{Call, Node, NodeError, Reply, World, run_now};
use crate::runtime::live::Reads;
use crate::runtime::objects::{Snapshot, TalosCluster, TalosConfigPatch, TalosMachine};
use crate::runtime::render::{Base, Rendered};
use crate::runtime::talos::{Applied, ApplyMode};
use k8s_openapi::jiff::Timestamp;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// What a fault does to the call it hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The controller stops before the call acts (the status write: it is never made).
    CrashBefore,
    /// The call acts, then the controller stops.
    CrashAfter,
    /// The call acts; its answer is lost (the procedure sees Talos fail).
    Lost,
    /// Talos refuses it without acting.
    Refused,
    /// The call cannot be made (no credentials, no endpoint).
    Unavailable,
}

const FAULTS: [Fault; 5] = [
    Fault::CrashBefore,
    Fault::CrashAfter,
    Fault::Lost,
    Fault::Refused,
    Fault::Unavailable,
];

/// A misbehaving world, to show that the invariants can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// The status write records the staged configuration applied: as if the procedure
    /// counted a staged configuration before the node ran it.
    StagedCountedApplied,
    /// A real apply in mode `auto` of a change that needs a reboot: as if the procedure
    /// applied it without staging.
    ApplyAuto,
}

/// The node, as Talos keeps it. Configurations are numbered by the base's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Talos {
    running: Option<u8>,
    staged: Option<u8>,
    maintenance: bool,
    /// A change of the running configuration needs a reboot.
    reboot_for_change: bool,
    /// Configurations the node has run (a bit each).
    ran: u8,
    /// A real apply rebooted the configured node.
    rebooted_by_apply: bool,
    /// A real apply sent a configuration no dry run passed before it.
    unchecked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The machine is a worker (its role's `plan apply worker` runs), else a control plane.
    worker: bool,
    talos: Talos,
    /// The base's version (0 or 1).
    base: u8,
    /// The machine's status as the API server has it, as JSON text.
    status: String,
    step: u8,
}

fn hash(version: u8) -> String {
    format!("{version:064x}")
}

fn version(hash: &str) -> Option<u8> {
    u8::from_str_radix(hash, 16).ok()
}

struct ModelApply {
    now: Timestamp,
    talos: Talos,
    base: Arc<Base>,
    calls: usize,
    fault: Option<(usize, Fault)>,
    mutant: Option<Mutant>,
    /// The configuration and API Talos' dry run passed last in this reconcile.
    passed: Option<(u8, TalosApi)>,
}

impl ModelApply {
    fn fault(&mut self) -> Option<Fault> {
        let k = self.calls;
        self.calls += 1;
        self.fault.filter(|(at, _)| *at == k).map(|(_, f)| f)
    }
}

impl World for ModelApply {
    type Error = Crashed;

    fn now(&self) -> Timestamp {
        self.now
    }

    unused_world_parts!("apply");

    async fn talos(
        &mut self,
        _cluster: &str,
        _node: Node<'_>,
        _call: Call,
    ) -> Result<Result<Reply, NodeError>, Crashed> {
        Ok(Err(NodeError::NoEndpoint(
            "the apply model makes no such call".into(),
        )))
    }

    async fn read(&mut self, _cluster: &str, _reads: Reads) -> Result<Arc<Snapshot>, Crashed> {
        Err(Crashed)
    }
}

impl ApplyWorld for ModelApply {
    async fn base(
        &mut self,
        _namespace: &str,
        _name: &str,
    ) -> Result<Result<Arc<Base>, BaseError>, Crashed> {
        Ok(Ok(self.base.clone()))
    }

    async fn patches(
        &mut self,
        _cluster: &TalosCluster,
    ) -> Result<Result<Vec<TalosConfigPatch>, String>, Crashed> {
        Ok(Ok(Vec::new()))
    }

    /// The configuration of the base's version (the model's base carries it as its
    /// digest).
    fn render(
        &mut self,
        base: &Base,
        _m: &TalosMachine,
        _patches: &[&TalosConfigPatch],
    ) -> Result<Rendered, String> {
        Ok(Rendered {
            text: String::new(),
            sha256: base.digest.clone(),
        })
    }

    async fn apply_configuration(
        &mut self,
        _m: &TalosMachine,
        api: TalosApi,
        config: &Rendered,
        mode: ApplyMode,
        dry_run: bool,
    ) -> Result<Result<Applied, ApplyError>, Crashed> {
        let fault = self.fault();
        match fault {
            Some(Fault::CrashBefore) => return Err(Crashed),
            Some(Fault::Refused) => {
                return Ok(Err(ApplyError::Talos("refused by the model".into())));
            }
            Some(Fault::Unavailable) => {
                return Ok(Err(ApplyError::Unavailable("nothing to dial".into())));
            }
            _ => {}
        }
        let Some(v) = version(&config.sha256) else {
            return Ok(Err(ApplyError::Talos("not a configuration".into())));
        };
        let t = &mut self.talos;
        if (api == TalosApi::Maintenance) != t.maintenance {
            return Ok(Err(ApplyError::Talos("wrong API for this node".into())));
        }
        if !dry_run && self.passed != Some((v, api)) {
            t.unchecked = true;
        }
        let change = t.running != Some(v);
        let reboot = change && t.reboot_for_change && !t.maintenance;
        let mode =
            if self.mutant == Some(Mutant::ApplyAuto) && !dry_run && mode == ApplyMode::Staged {
                ApplyMode::Auto
            } else {
                mode
            };
        let chosen = match mode {
            ApplyMode::Staged => ApplyMode::Staged,
            ApplyMode::NoReboot if reboot => {
                return Ok(Err(ApplyError::Talos(
                    "the change requires a reboot".into(),
                )));
            }
            _ if reboot || t.maintenance => ApplyMode::Reboot,
            _ => ApplyMode::NoReboot,
        };
        if !dry_run {
            if t.maintenance {
                // Installed; the node reboots into it.
                t.maintenance = false;
                t.running = Some(v);
            } else if chosen == ApplyMode::Staged {
                t.staged = Some(v);
            } else {
                if chosen == ApplyMode::Reboot {
                    t.rebooted_by_apply = true;
                    t.staged = None;
                }
                t.running = Some(v);
            }
            if let Some(r) = t.running {
                t.ran |= 1 << r;
            }
        }
        if dry_run {
            self.passed = Some((v, api));
        }
        Ok(match fault {
            Some(Fault::CrashAfter) if !dry_run => return Err(Crashed),
            Some(Fault::Lost) if !dry_run => Err(ApplyError::Talos("connection reset".into())),
            _ => Ok(Applied {
                mode: chosen,
                details: "done".into(),
                warnings: Vec::new(),
            }),
        })
    }
}

fn cluster() -> Option<TalosCluster> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
        "metadata": {"name": "prod", "namespace": "infra"},
        "spec": {"controlPlane": {"count": 1}, "baseConfigSecretRef": {"name": "prod-base"}}
    }))
    .ok()
}

/// The machine of the state: `cp-1`, or `worker-1` for a worker.
fn machine(worker: bool, status: &str) -> Option<TalosMachine> {
    let status: serde_json::Value = serde_json::from_str(status).ok()?;
    let (name, role) = if worker {
        ("worker-1", "worker")
    } else {
        ("cp-1", "controlplane")
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
        "metadata": {"name": name, "namespace": "infra"},
        "spec": {"clusterRef": {"name": "prod"}, "role": role, "approved": true,
                 "endpoint": "10.0.0.1"},
        "status": status
    }))
    .ok()
}

/// The status of a machine as JSON text (`{}` when none).
fn status_text(m: &TalosMachine) -> String {
    m.status
        .as_ref()
        .and_then(|s| serde_json::to_string(s).ok())
        .unwrap_or_else(|| "{}".into())
}

struct Setup<'t> {
    table: &'t Table,
    cluster: TalosCluster,
    epoch: Timestamp,
    mutant: Option<Mutant>,
}

impl Setup<'_> {
    /// One reconcile with `fault` (the call after the last `ApplyConfiguration` is the
    /// status write): the world after it, its calls, and whether it ended.
    fn reconcile(&self, s: &State, fault: Option<(usize, Fault)>) -> Option<(State, usize, bool)> {
        let before = machine(s.worker, &s.status)?;
        let mut next = before.clone();
        let now = self
            .epoch
            .checked_add(Duration::from_secs(60 * u64::from(s.step)))
            .unwrap_or(self.epoch);
        // The machine's probe, which runs first in its reconcile (`controller::machine`): a
        // node in maintenance mode answers only the maintenance API.
        if s.talos.maintenance {
            status::set_at(
                now,
                next.conditions_mut(),
                "Maintenance",
                true,
                "MaintenanceMode",
                "the node is in Talos' maintenance mode (not configured yet)",
            );
        } else {
            status::remove(next.conditions_mut(), "Maintenance");
        }
        let mut w = ModelApply {
            now,
            talos: s.talos,
            base: Arc::new(Base {
                controlplane: Vec::new(),
                worker: Vec::new(),
                digest: hash(s.base),
            }),
            calls: 0,
            fault,
            mutant: self.mutant,
            passed: None,
        };
        let snapshot = Snapshot {
            machines: vec![before.clone()],
            clusters: vec![self.cluster.clone()],
            ..Snapshot::default()
        };
        let ran = run_now(reconcile(
            &mut w,
            self.table,
            &snapshot,
            Some(&self.cluster),
            &before,
            &mut next,
        ));
        let mut n = State {
            worker: s.worker,
            talos: w.talos,
            base: s.base,
            status: s.status.clone(),
            step: s.step.saturating_add(1),
        };
        let ended = matches!(ran, Some(Ok(_)));
        // The machine's reconcile writes its status at its end: a call of its own.
        let write = w.fault();
        if ended && write != Some(Fault::CrashBefore) {
            if self.mutant == Some(Mutant::StagedCountedApplied)
                && let Some(c) = next.status.as_mut().and_then(|s| s.config.as_mut())
                && c.staged_hash.is_some()
            {
                c.applied_hash = c.staged_hash.clone();
            }
            n.status = status_text(&next);
        }
        Some((n, w.calls, ended && write != Some(Fault::CrashBefore)))
    }

    fn check(&self, s: &State) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let applied = machine(s.worker, &s.status)
            .and_then(|m| m.applied_config_hash().map(str::to_string))
            .and_then(|h| version(&h));
        if let Some(v) = applied
            && s.talos.ran & (1 << v) == 0
        {
            out.push((
                "applied-runs",
                format!("configuration {v} is recorded applied, and the node never ran it"),
            ));
        }
        if s.talos.rebooted_by_apply {
            out.push((
                "no-reboot-by-apply",
                "an ApplyConfiguration rebooted the configured node".into(),
            ));
        }
        if s.talos.unchecked {
            out.push((
                "dry-run-first",
                "a configuration was applied that no dry run of Talos passed before it".into(),
            ));
        }
        out
    }

    /// Whether reconciles without faults, with the roll's reboot whenever something is
    /// staged, record the current configuration applied within ten rounds.
    fn ends(&self, s: &State) -> Result<(), String> {
        let mut s = s.clone();
        for _ in 0..10 {
            let applied = machine(s.worker, &s.status)
                .and_then(|m| m.applied_config_hash().map(str::to_string))
                .and_then(|h| version(&h));
            if applied == Some(s.base) && s.talos.running == Some(s.base) {
                return Ok(());
            }
            if let Some(v) = s.talos.staged.take() {
                s.talos.running = Some(v);
                s.talos.ran |= 1 << v;
            }
            let Some((n, _, _)) = self.reconcile(&s, None) else {
                return Err("the model's objects did not build".into());
            };
            s = n;
        }
        Err(format!(
            "ten reconciles without a fault, with reboots, leave configuration {} unapplied \
             (the node runs {:?}, staged {:?}; status {})",
            s.base, s.talos.running, s.talos.staged, s.status
        ))
    }
}

/// Explores `depth` steps from each starting node, breadth-first: a step is a reconcile
/// with any one fault at any of its calls, the base changing (once), or the node rebooting
/// into what was staged; once with the machine a control plane and once a worker.
/// `table`: the rules whose `plan apply controlplane` and `plan apply worker` the
/// procedure runs; `mutant` makes the world misbehave.
pub fn explore(table: &Table, depth: u8, mutant: Option<Mutant>) -> Report {
    let mut report = Report::default();
    let Some(cluster) = cluster() else {
        return report;
    };
    let setup = Setup {
        table,
        cluster,
        epoch: Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH),
        mutant,
    };
    let configured = |reboot_for_change| Talos {
        running: Some(0),
        staged: None,
        maintenance: false,
        reboot_for_change,
        ran: 1,
        rebooted_by_apply: false,
        unchecked: false,
    };
    let starts = [
        (
            configured(false),
            "{}".to_string(),
            "a node whose changes need no reboot",
        ),
        (
            configured(true),
            "{}".to_string(),
            "a node whose changes need a reboot",
        ),
        (
            Talos {
                running: None,
                staged: None,
                maintenance: true,
                reboot_for_change: true,
                ran: 0,
                rebooted_by_apply: false,
                unchecked: false,
            },
            "{}".to_string(),
            "a node in maintenance mode",
        ),
    ];
    let mut seen: HashSet<State> = HashSet::new();
    let mut queue: VecDeque<(State, Vec<String>)> = VecDeque::new();
    for worker in [false, true] {
        for (talos, status, what) in &starts {
            let s = State {
                worker,
                talos: *talos,
                base: 0,
                status: status.clone(),
                step: 0,
            };
            seen.insert(s.clone());
            let role = if worker {
                "a worker"
            } else {
                "a control plane"
            };
            queue.push_back((s, vec![format!("from {role}, {what}")]));
        }
    }
    while let Some((s, path)) = queue.pop_front() {
        report.states += 1;
        for (invariant, why) in setup.check(&s) {
            report.violate(invariant, &path, why);
        }
        if let Err(why) = setup.ends(&s) {
            report.violate("apply-ends", &path, why);
        }
        if s.step >= depth {
            continue;
        }
        let mut next: Vec<(State, String)> = Vec::new();
        if s.base == 0 {
            let mut n = s.clone();
            n.base = 1;
            n.step += 1;
            next.push((n, "the base changes".into()));
        }
        if let Some(v) = s.talos.staged {
            let mut n = s.clone();
            n.talos.running = Some(v);
            n.talos.staged = None;
            n.talos.ran |= 1 << v;
            n.step += 1;
            next.push((n, "the roll reboots the node".into()));
        }
        let mut plans = vec![None];
        let mut k = 0;
        while k < plans.len() {
            let fault = plans[k];
            k += 1;
            let Some((n, calls, ended)) = setup.reconcile(&s, fault) else {
                continue;
            };
            report.reconciles += 1;
            if fault.is_none() {
                for c in 0..calls {
                    for f in FAULTS {
                        plans.push(Some((c, f)));
                    }
                }
            }
            let how = match fault {
                None => String::new(),
                Some((c, f)) => format!(", {f:?} at call {c}"),
            };
            let end = if ended { "" } else { " (stopped)" };
            next.push((n, format!("reconciled{how}{end}")));
        }
        for (n, step) in next {
            if seen.insert(n.clone()) {
                let mut p = path.clone();
                p.push(step);
                queue.push_back((n, p));
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::procedure::shipped_edited;

    fn shipped() -> Table {
        shipped_edited(str::to_string)
    }

    /// The shipped rules with the step `step` taken out of both `plan apply` (each such
    /// line removed).
    fn without_step(step: &str) -> Table {
        let line = format!("  do {step}\n");
        let t = shipped_edited(|t| t.replace(&line, ""));
        let plan = t
            .plan(
                crate::vocab::Verb::Apply,
                crate::vocab::Subject::ControlPlane,
            )
            .expect("the plan");
        assert!(plan.steps.iter().all(|s| s.text != step), "{step} removed");
        t
    }

    #[test]
    fn the_apply_procedure_holds_every_invariant_under_every_fault() {
        let r = explore(&shipped(), 5, None);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert!(r.states > 50, "{r:?}");
        assert!(r.reconciles > r.states, "{r:?}");
    }

    #[test]
    fn a_plan_apply_without_its_talos_apply_config_is_refuted() {
        let r = explore(&without_step("talos apply-config"), 2, None);
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "apply-ends")
            .unwrap_or_else(|| panic!("{r:?}"));
        assert!(v.why.contains("unapplied"), "{v:?}");
    }

    #[test]
    fn a_plan_apply_without_its_render_is_refuted() {
        let r = explore(&without_step("config render"), 2, None);
        assert!(
            r.violations.iter().any(|v| v.invariant == "apply-ends"),
            "{r:?}"
        );
    }

    #[test]
    fn a_plan_apply_without_talos_dry_run_is_refuted() {
        let r = explore(&without_step("talos dry-run"), 2, None);
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "dry-run-first")
            .unwrap_or_else(|| panic!("{r:?}"));
        assert!(v.why.contains("no dry run"), "{v:?}");
        // What else it breaks: nothing the dry run's absence alone explains otherwise.
        assert!(
            !r.violations.iter().any(|v| v.invariant == "applied-runs"),
            "{r:?}"
        );
    }

    #[test]
    fn a_dry_run_after_the_apply_is_refuted() {
        let t = shipped_edited(|t| {
            t.replace(
                "  do talos dry-run\n  do talos apply-config\n",
                "  do talos apply-config\n  do talos dry-run\n",
            )
        });
        let r = explore(&t, 2, None);
        assert!(
            r.violations.iter().any(|v| v.invariant == "dry-run-first"),
            "{r:?}"
        );
    }

    /// Each role's plan is explored: the worker's weakened alone (its `talos apply-config`
    /// out, the control planes' kept) is refuted on a worker, and only there.
    #[test]
    fn a_plan_apply_worker_weakened_alone_is_refuted() {
        let t = shipped_edited(|t| {
            t.replace(
                "plan apply worker\n  do config render\n  do talos dry-run\n  do talos apply-config\n",
                "plan apply worker\n  do config render\n  do talos dry-run\n",
            )
        });
        let worker = t
            .plan(crate::vocab::Verb::Apply, crate::vocab::Subject::Worker)
            .expect("the worker's plan");
        assert_eq!(worker.steps.len(), 2, "the worker's plan weakened");
        let r = explore(&t, 2, None);
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "apply-ends")
            .unwrap_or_else(|| panic!("{r:?}"));
        assert!(v.trace[0].starts_with("from a worker"), "{v:?}");
    }

    #[test]
    fn a_staged_configuration_counted_applied_is_refuted() {
        let r = explore(&shipped(), 3, Some(Mutant::StagedCountedApplied));
        let v = r
            .violations
            .iter()
            .find(|v| v.invariant == "applied-runs")
            .unwrap_or_else(|| panic!("{r:?}"));
        assert!(v.trace[0].contains("need a reboot"), "{v:?}");
    }

    #[test]
    fn a_change_applied_without_staging_is_refuted() {
        let r = explore(&shipped(), 3, Some(Mutant::ApplyAuto));
        assert!(
            r.violations
                .iter()
                .any(|v| v.invariant == "no-reboot-by-apply"),
            "{r:?}"
        );
    }
}
