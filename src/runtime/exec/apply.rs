//! Applying a machine's Talos configuration (issue 37), as one procedure over an
//! [`ApplyWorld`]: the controller runs it with real I/O (`controller::configure`: the base
//! Secret, the TalosConfigPatches, Talos' `ApplyConfiguration`); `verify --check-trace`
//! replays it from a step log.
//!
//! One reconcile of an approved machine the rules let through (a held one never gets here)
//! whose node answers runs the steps of the table's plan for its role (`plan apply
//! controlplane`, `plan apply worker`: the shipped ones are `config render`, `talos
//! dry-run`, `talos apply-config`), in order, each whose `when`/`unless` guards hold; a
//! table with no such plan applies nothing and says so (`Configured=False`, `NoPlan`).
//!
//! 1. `config render`: the cluster's base (its Secret, read live and parsed by the world:
//!    never logged, never copied into status or Events), then the cluster's patches; the
//!    digest of both is recorded (`status.config.inputs`, which the roll waits on). Then
//!    the render (the base for the machine's role, the patches selecting it in order, its
//!    identity); its hash is recorded (`renderedHash`). The hash applied already: done, the
//!    steps after it are skipped.
//! 2. `talos dry-run`: Talos' own check first, `ApplyConfiguration` with `dry_run`, on the
//!    maintenance API when the node is in maintenance mode. A refusal is said with Talos'
//!    words, and the reconcile ends there.
//! 3. `talos apply-config`: a node in maintenance mode gets its first configuration there
//!    (it installs it and reboots into it). Else: a change Talos can make without a reboot
//!    is applied `no-reboot` and recorded applied; one that needs a reboot is staged and
//!    recorded staged (never applied: the roll's reboot applies it, `controller::roll`).
//!    With no dry run before it in the plan, it applies `no-reboot` (Talos refuses a
//!    change that needs a reboot: never a reboot by an apply).
//!
//! A step that needs the render with none before it, or a step of another procedure (the
//! checker refuses both kinds of table: this is for one built past it), ends the reconcile
//! with `Configured=False` saying so; a plan that ends without applying says that too.
//!
//! What it found is left in the machine's status (`next`), which the machine's reconcile
//! writes once, at its end (the probe's, the configuration's and the bootstrap's together);
//! a step log keeps it with the reconcile's end, and its replay compares it.
//!
//! Resuming: every step is safe to take again. Re-applying the configuration a node runs
//! is a no-op in Talos, so an apply whose answer (or whose status write) was lost is
//! applied again and recorded then. A configuration staged already (its hash recorded
//! staged) whose dry run still says it needs a reboot is not staged again: it waits for its
//! reboot; once the node runs it, the dry run says no reboot is needed and it is recorded
//! applied. A staged apply whose record was lost is staged again (the same configuration:
//! Talos keeps one) and recorded then; it is never counted applied before the node runs
//! it, because only a dry run answering "no reboot" on the running node records it so.
//!
//! A failure sets `Configured=False` with its reason and message and is retried later each
//! time (the time since the failure began, between 5 s and 5 min).

use super::{Note, Outcome, Wait, World};
use crate::compile::Table;
use crate::runtime::configpatch::{parse_patch, render_machine};
use crate::runtime::controller::status::{self, Conditions};
use crate::runtime::decide::reconcile_machine_event;
use crate::runtime::objects::{
    MachineConfigStatus, Snapshot, TalosCluster, TalosConfigPatch, TalosMachine, patches_for,
};
use crate::runtime::render::{Base, CONTROLPLANE_KEY, Rendered, WORKER_KEY};
use crate::runtime::talos::{Applied, ApplyMode};
use crate::vocab::{Action as BuiltIn, Verb};
use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;
use std::time::Duration;

/// The condition a machine reports its configuration in.
pub const CONFIGURED: &str = "Configured";

/// Why the base Secret gave no base.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BaseError {
    /// There is no such Secret.
    Missing,
    /// It could not be read (an API error).
    Unreadable(String),
    /// It lacks `controlplane.yaml` or `worker.yaml`.
    Incomplete,
    /// Its texts do not parse (the error shows no content of the Secret).
    Invalid(String),
}

/// Which Talos API an `ApplyConfiguration` goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TalosApi {
    /// The node's mTLS API, with its cluster's credentials.
    Cluster,
    /// The maintenance API of a node with no configuration yet (`talosctl --insecure`).
    Maintenance,
}

/// Why an `ApplyConfiguration` did not answer with success.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ApplyError {
    /// No call could be made (no credentials, no endpoint, a bad address).
    Unavailable(String),
    /// Talos answered with an error (its words), or did not answer.
    Talos(String),
}

/// What applying a configuration needs of the world beyond the [`World`].
#[allow(async_fn_in_trait)]
pub trait ApplyWorld: World {
    /// The base Secret `namespace/name`, read live and parsed.
    async fn base(
        &mut self,
        namespace: &str,
        name: &str,
    ) -> Result<Result<Arc<Base>, BaseError>, Self::Error>;

    /// The TalosConfigPatches of `cluster` (all of them, any order); `Err(why)` when they
    /// could not be listed.
    async fn patches(
        &mut self,
        cluster: &TalosCluster,
    ) -> Result<Result<Vec<TalosConfigPatch>, String>, Self::Error>;

    /// Renders `m` from `base` and `patches` (those selecting it, in order): pure. A world
    /// replaying a log answers the render it recorded (a log keeps the hash, never the
    /// configuration).
    fn render(
        &mut self,
        base: &Base,
        m: &TalosMachine,
        patches: &[&TalosConfigPatch],
    ) -> Result<Rendered, String> {
        let parsed: Vec<_> = patches.iter().map(|p| parse_patch(p)).collect();
        let pairs: Vec<_> = patches.iter().copied().zip(parsed.iter()).collect();
        render_machine(base, m, &pairs).map_err(|e| e.to_string())
    }

    /// `ApplyConfiguration` of `config` on `m`'s node, on `api`, in `mode`; a dry run
    /// changes nothing.
    async fn apply_configuration(
        &mut self,
        m: &TalosMachine,
        api: TalosApi,
        config: &Rendered,
        mode: ApplyMode,
        dry_run: bool,
    ) -> Result<Result<Applied, ApplyError>, Self::Error>;
}

/// The digest of what a cluster's machines are rendered from: the base's digest, and the
/// name and resourceVersion of each of the cluster's TalosConfigPatches (all of them, so
/// every machine of the cluster records the same digest for the same inputs). A machine
/// records it at each render (`status.config.inputs`); the roll compares it.
pub fn inputs_digest(base_digest: &str, patches: &[TalosConfigPatch]) -> String {
    let mut names: Vec<String> = patches
        .iter()
        .map(|p| {
            format!(
                "{} {}\n",
                p.name(),
                p.metadata.resource_version.as_deref().unwrap_or_default()
            )
        })
        .collect();
    names.sort();
    let text = format!("{base_digest}\n{}", names.concat());
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The first 12 characters of a hash (all of it when shorter; a replayed log's hash is
/// input, so never sliced inside a character).
fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// When to try a failed step again: as long as it has been failing, within 5 s and 5 min.
fn backoff(next: &TalosMachine, now: Timestamp) -> Duration {
    let since = next
        .configure_failing_since()
        .and_then(|t| now.duration_since(t.0).try_into().ok())
        .unwrap_or(Duration::ZERO);
    since.clamp(Duration::from_secs(5), Duration::from_secs(300))
}

/// What Talos' dry run answered, in words: the mode it would apply in (none: the plan ran
/// no dry run). Only the mode: the rest of a real dry run's answer is a diff of the
/// configuration, which may carry its secrets, so it never reaches a status, an Event or a
/// log.
fn dry_said(dry: Option<&Applied>) -> &'static str {
    match dry.map(|d| d.mode) {
        None => "none in the plan",
        Some(ApplyMode::Reboot) => "it needs a reboot",
        Some(ApplyMode::NoReboot) => "it applies without a reboot",
        Some(ApplyMode::Staged) => "it is staged",
        Some(ApplyMode::Auto) => "it applies",
        Some(ApplyMode::Try) => "it applies on trial",
    }
}

fn config_status(next: &mut TalosMachine) -> &mut MachineConfigStatus {
    next.status
        .get_or_insert_with(Default::default)
        .config
        .get_or_insert_with(Default::default)
}

fn set<W: World>(w: &W, next: &mut TalosMachine, ok: bool, reason: &str, message: &str) {
    status::set_at(
        w.now(),
        next.conditions_mut(),
        CONFIGURED,
        ok,
        reason,
        message,
    );
}

/// What the plan's steps so far found: the render, and Talos' dry run of it.
#[derive(Default)]
struct Applying {
    /// The configuration rendered (`config render`) and its hash.
    rendered: Option<(Rendered, String)>,
    /// What Talos' dry run answered (`talos dry-run`).
    dry: Option<Applied>,
}

/// How a step of the plan ended.
enum Step {
    /// On to the next step.
    Next,
    /// The reconcile ends here.
    End(Outcome),
}

/// One reconcile of the configuration of `before` (the machine as read; its node answers),
/// whose status so far is `next`'s (the reconcile's probe included), in `cluster` (read
/// live; `None`: it does not exist): the steps of the table's `plan apply <role>` in order,
/// each whose guards hold (read from `snapshot`, the machine's cluster as read). The caller
/// writes `next`'s status.
pub async fn reconcile<W: ApplyWorld>(
    w: &mut W,
    table: &Table,
    snapshot: &Snapshot,
    cluster: Option<&TalosCluster>,
    before: &TalosMachine,
    next: &mut TalosMachine,
) -> Result<Outcome, W::Error> {
    let Some(cluster) = cluster else {
        return Ok(Outcome::AwaitChange);
    };
    let Some(base_ref) = cluster.spec.base_config_secret_ref.as_ref() else {
        return Ok(Outcome::AwaitChange);
    };
    // Not an approved machine staying so (one being deleted is removed, not configured).
    let Some(ev) = reconcile_machine_event(before).filter(|e| e.event.0 == Verb::Apply) else {
        return Ok(Outcome::AwaitChange);
    };
    let subject = ev.event.1;
    let Some(plan) = table.plan(Verb::Apply, subject) else {
        let message = format!(
            "the rules have no `plan apply {}`; nothing is applied until they do",
            subject.name()
        );
        return Ok(fail(w, before, next, "NoPlan", message));
    };
    let mut a = Applying::default();
    for (k, step) in plan.steps.iter().enumerate() {
        let runs = match w.applies(table, snapshot, ev, &[], k, step) {
            Ok((runs, _)) => runs,
            Err(why) => {
                let message = format!("`{}` not decided: {why}", step.text);
                return Ok(fail(w, before, next, "StepRefused", message));
            }
        };
        if !runs {
            continue;
        }
        // No `Note::Step`: a step log counts a step begun as acting, and this plan runs at
        // every probe; its steps say themselves by their calls (the base, the render, each
        // `ApplyConfiguration`), so a quiet repeat stays one line of the log.
        let done = match step.action {
            BuiltIn::ConfigRender => {
                render(w, cluster, &base_ref.name, before, next, &mut a).await?
            }
            BuiltIn::TalosDryRun => dry_run(w, before, next, &mut a).await?,
            BuiltIn::TalosApplyConfig => apply(w, before, next, &a).await?,
            // Another procedure's steps: the checker refuses them in `plan apply`
            // (`ichor::check::action_not_in_plan`), so only a table built past it gets here.
            BuiltIn::LockCluster
            | BuiltIn::DrainNode
            | BuiltIn::EtcdForfeitLeadership
            | BuiltIn::EtcdLeave
            | BuiltIn::EtcdRemoveMember
            | BuiltIn::TalosReset
            | BuiltIn::TalosWipe
            | BuiltIn::EventWarning
            | BuiltIn::EventNormal
            | BuiltIn::ReleaseFinalizer
            | BuiltIn::EtcdHealthy
            | BuiltIn::CordonNode
            | BuiltIn::UncordonNode
            | BuiltIn::TalosReboot
            | BuiltIn::TalosShutdown
            | BuiltIn::TalosUpgrade
            | BuiltIn::TalosRollback
            | BuiltIn::WaitNodeBack
            | BuiltIn::TalosInstall
            | BuiltIn::TalosBootstrap
            | BuiltIn::EtcdSnapshot
            | BuiltIn::SnapshotsPrune => {
                let message = format!(
                    "`{}` is not a step of a machine's configuration apply; remove it from `plan apply {}`",
                    step.text,
                    subject.name()
                );
                Step::End(fail(w, before, next, "NotAnApplyStep", message))
            }
        };
        if let Step::End(outcome) = done {
            return Ok(outcome);
        }
    }
    // The plan ran to its end and applied nothing (it has no `talos apply-config`, or
    // its guard kept it out): said so, never counted applied.
    let what = a
        .rendered
        .as_ref()
        .map(|(_, h)| format!("configuration {}", short(h)))
        .unwrap_or_else(|| "no configuration (nothing rendered)".into());
    let message = format!(
        "`plan apply {}` ran to its end and applied {what}",
        subject.name()
    );
    set(w, next, false, "NotApplied", &message);
    Ok(Outcome::AwaitChange)
}

/// A failed step: `Configured=False` with its reason and message, retried later.
fn fail<W: World>(
    w: &mut W,
    live: &TalosMachine,
    next: &mut TalosMachine,
    reason: &str,
    message: String,
) -> Outcome {
    set(w, next, false, reason, &message);
    w.note(live, Note::Info(&format!("not configured: {reason}")));
    Outcome::Requeue {
        after: backoff(next, w.now()),
        wait: Wait::On(reason.to_string()),
    }
}

/// A step that needs the render, in a plan with no `config render` before it.
fn unrendered<W: World>(
    w: &mut W,
    live: &TalosMachine,
    next: &mut TalosMachine,
    text: &str,
) -> Step {
    let message =
        format!("`{text}` has no configuration to send: no `config render` ran before it");
    Step::End(fail(w, live, next, "NotRendered", message))
}

/// `config render`: the base (never logged) and the cluster's patches, their digest
/// recorded; the render, its hash recorded. The hash applied already: the apply is over.
async fn render<W: ApplyWorld>(
    w: &mut W,
    cluster: &TalosCluster,
    secret: &str,
    live: &TalosMachine,
    next: &mut TalosMachine,
    a: &mut Applying,
) -> Result<Step, W::Error> {
    let ns = live.namespace();
    let end = |w: &mut W, next: &mut TalosMachine, reason: &str, message: String| {
        Step::End(fail(w, live, next, reason, message))
    };
    let base = match w.base(ns, secret).await? {
        Ok(b) => b,
        Err(BaseError::Invalid(e)) => {
            let message = format!("the base Secret {ns}/{secret} does not read: {e}");
            return Ok(end(w, next, "BaseInvalid", message));
        }
        Err(BaseError::Incomplete) => {
            let message =
                format!("the base Secret {ns}/{secret} lacks {CONTROLPLANE_KEY} or {WORKER_KEY}");
            return Ok(end(w, next, "BaseInvalid", message));
        }
        Err(BaseError::Missing) => {
            let message = format!("the base Secret {ns}/{secret} does not exist");
            return Ok(end(w, next, "BaseSecretMissing", message));
        }
        Err(BaseError::Unreadable(e)) => {
            let message = format!("the base Secret {ns}/{secret} could not be read: {e}");
            return Ok(end(w, next, "BaseSecretUnreadable", message));
        }
    };
    let patches = match w.patches(cluster).await? {
        Ok(p) => p,
        Err(e) => {
            let message = format!(
                "the TalosConfigPatches of TalosCluster {ns}/{} could not be read: {e}",
                cluster.name()
            );
            return Ok(end(w, next, "PatchesUnreadable", message));
        }
    };
    config_status(next).inputs = Some(inputs_digest(&base.digest, &patches));
    let selected = patches_for(patches.iter(), live);
    let rendered = match w.render(&base, live, &selected) {
        Ok(r) => r,
        Err(e) => {
            let message = format!("its configuration does not render: {e}");
            return Ok(end(w, next, "RenderFailed", message));
        }
    };
    let hash = rendered.sha256.clone();
    config_status(next).rendered_hash = Some(hash.clone());
    if live.applied_config_hash() == Some(hash.as_str()) {
        let message = format!("configuration {} applied", short(&hash));
        // What the apply of this very configuration said (Talos' dry run and answer) is
        // kept; anything else is replaced.
        let said = next
            .configured_state()
            .is_some_and(|(ok, reason, said, _)| {
                ok && reason == Some("Applied") && said.is_some_and(|m| m.starts_with(&message))
            });
        if !said {
            set(w, next, true, "Applied", &message);
        }
        return Ok(Step::End(Outcome::AwaitChange));
    }
    a.rendered = Some((rendered, hash));
    Ok(Step::Next)
}

/// Where the configuration goes: a node in maintenance mode gets its first one over the
/// maintenance API (`talosctl apply-config --insecure`).
fn api_of(next: &TalosMachine) -> TalosApi {
    if next.in_maintenance() {
        TalosApi::Maintenance
    } else {
        TalosApi::Cluster
    }
}

/// `talos dry-run`: Talos' own check first, where the configuration will go. A refusal is
/// said with Talos' words.
async fn dry_run<W: ApplyWorld>(
    w: &mut W,
    live: &TalosMachine,
    next: &mut TalosMachine,
    a: &mut Applying,
) -> Result<Step, W::Error> {
    let Some((rendered, hash)) = a.rendered.as_ref() else {
        return Ok(unrendered(w, live, next, "talos dry-run"));
    };
    let api = api_of(next);
    Ok(
        match w
            .apply_configuration(live, api, rendered, ApplyMode::Auto, true)
            .await?
        {
            Ok(d) => {
                a.dry = Some(d);
                Step::Next
            }
            Err(ApplyError::Unavailable(e)) => Step::End(fail(w, live, next, "NodeUnavailable", e)),
            Err(ApplyError::Talos(e)) => {
                let message = format!("Talos refused configuration {}: {e}", short(hash));
                Step::End(fail(w, live, next, "DryRunRefused", message))
            }
        },
    )
}

/// `talos apply-config`: the first configuration of a node in maintenance mode (it installs
/// it and reboots into it); else, as the dry run said, applied without a reboot or staged
/// for the roll's. Without a dry run before it: `no-reboot` (Talos refuses a change that
/// needs a reboot).
async fn apply<W: ApplyWorld>(
    w: &mut W,
    live: &TalosMachine,
    next: &mut TalosMachine,
    a: &Applying,
) -> Result<Step, W::Error> {
    let Some((rendered, hash)) = a.rendered.as_ref() else {
        return Ok(unrendered(w, live, next, "talos apply-config"));
    };
    let hash = hash.clone();
    let dry = dry_said(a.dry.as_ref());
    let api = api_of(next);
    if api == TalosApi::Maintenance {
        return Ok(Step::End(
            match w
                .apply_configuration(live, api, rendered, ApplyMode::Auto, false)
                .await?
            {
                Ok(applied) => {
                    let c = config_status(next);
                    c.applied_hash = Some(hash.clone());
                    c.staged_hash = None;
                    status::remove(next.conditions_mut(), "Maintenance");
                    let message = format!(
                        "first configuration {} applied over the maintenance API (Talos' dry run: {dry}): the node installs it and reboots ({})",
                        short(&hash),
                        applied.details
                    );
                    set(w, next, true, "Applied", &message);
                    let said = format!(
                        "first configuration applied over the maintenance API: {}",
                        short(&hash)
                    );
                    w.note(live, Note::Info(&said));
                    Outcome::AwaitChange
                }
                Err(ApplyError::Unavailable(e)) => fail(w, live, next, "NodeUnavailable", e),
                Err(ApplyError::Talos(e)) => {
                    let message = format!(
                        "Talos (maintenance mode) did not apply configuration {}: {e}",
                        short(&hash)
                    );
                    fail(w, live, next, "ApplyFailed", message)
                }
            },
        ));
    }
    let needs_reboot = a.dry.as_ref().is_some_and(|d| d.mode == ApplyMode::Reboot);
    if needs_reboot && live.staged_config_hash() == Some(hash.as_str()) {
        // Staged already, and the node does not run it yet: staging it again would change
        // nothing. Its reboot (the roll) applies it.
        let message = format!(
            "configuration {} needs a reboot (Talos' dry run: {dry}): it is staged on the node and takes effect at its next reboot, which the controller rolls with a `reboot` TalosOperation, one node at a time",
            short(&hash),
        );
        set(w, next, false, "RebootRequired", &message);
        return Ok(Step::End(Outcome::Requeue {
            after: backoff(next, w.now()),
            wait: Wait::On("RebootRequired".into()),
        }));
    }
    let mode = if needs_reboot {
        ApplyMode::Staged
    } else {
        ApplyMode::NoReboot
    };
    Ok(Step::End(
        match w
            .apply_configuration(live, api, rendered, mode, false)
            .await?
        {
            Ok(applied) if needs_reboot => {
                config_status(next).staged_hash = Some(hash.clone());
                let message = format!(
                    "configuration {} needs a reboot (Talos' dry run: {dry}): it is staged on the node and takes effect at its next reboot, which the controller rolls with a `reboot` TalosOperation, one node at a time; Talos: {}",
                    short(&hash),
                    applied.details
                );
                set(w, next, false, "RebootRequired", &message);
                let said = format!(
                    "configuration staged: a reboot applies it: {}",
                    short(&hash)
                );
                w.note(live, Note::Info(&said));
                Outcome::Requeue {
                    after: backoff(next, w.now()),
                    wait: Wait::On("RebootRequired".into()),
                }
            }
            Ok(applied) => {
                let c = config_status(next);
                c.applied_hash = Some(hash.clone());
                c.staged_hash = None;
                let message = format!(
                    "configuration {} applied without a reboot (Talos' dry run: {dry}; Talos: {})",
                    short(&hash),
                    applied.details
                );
                set(w, next, true, "Applied", &message);
                let said = format!("configuration applied: {}", short(&hash));
                w.note(live, Note::Info(&said));
                Outcome::AwaitChange
            }
            Err(ApplyError::Unavailable(e)) => fail(w, live, next, "NodeUnavailable", e),
            Err(ApplyError::Talos(e)) => {
                let message = format!("Talos did not apply configuration {}: {e}", short(&hash));
                fail(w, live, next, "ApplyFailed", message)
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::exec::{Call, Drained, LockOp, Node, NodeError, Reply, run_now};
    use crate::runtime::live::Reads;
    use crate::verify::procedure::shipped_edited;

    const CP: &str = include_str!("../../../tests/fixtures/talos/controlplane.yaml");
    const WORKER: &str = include_str!("../../../tests/fixtures/talos/worker.yaml");

    /// A crash of the controller (or an API error): the reconcile ends there.
    #[derive(Debug)]
    struct Crash;

    /// One node as Talos keeps it, and the API server's copy of the machine's status.
    struct Mem {
        now: Timestamp,
        base: Arc<Base>,
        /// The sha256 of the configuration the node runs, and of the one staged.
        running: Option<String>,
        staged: Option<String>,
        maintenance: bool,
        /// A change of the running configuration needs a reboot.
        reboot_for_change: bool,
        /// The dry run refuses, with these words.
        refuse: Option<String>,
        /// The next real apply takes effect, and its answer is lost.
        lose_answer: bool,
        /// The next reconcile's status is never written (the controller stops before its
        /// write).
        crash_before_write: bool,
        /// Every `ApplyConfiguration`: mode and dry run.
        calls: Vec<(ApplyMode, bool)>,
    }

    impl Mem {
        fn new() -> Mem {
            Mem {
                now: "2026-12-05T10:00:00Z".parse().unwrap(),
                base: Arc::new(Base::parse(CP, WORKER, true).unwrap()),
                running: Some("an older configuration".into()),
                staged: None,
                maintenance: false,
                reboot_for_change: false,
                refuse: None,
                lose_answer: false,
                crash_before_write: false,
                calls: Vec::new(),
            }
        }

        /// The node reboots: it runs what was staged.
        fn reboot(&mut self) {
            if let Some(s) = self.staged.take() {
                self.running = Some(s);
            }
        }

        fn real_applies(&self) -> Vec<ApplyMode> {
            self.calls
                .iter()
                .filter(|(_, dry)| !dry)
                .map(|(m, _)| *m)
                .collect()
        }
    }

    impl World for Mem {
        type Error = Crash;
        fn now(&self) -> Timestamp {
            self.now
        }
        async fn credentials(&mut self, _: &str) -> Result<(), String> {
            Ok(())
        }
        async fn talos(
            &mut self,
            _: &str,
            _: Node<'_>,
            _: Call,
        ) -> Result<Result<Reply, NodeError>, Crash> {
            Err(Crash)
        }
        async fn lock(&mut self, _: &str, _: LockOp) -> Result<Result<(), String>, Crash> {
            Err(Crash)
        }
        async fn read(&mut self, _: &str, _: Reads) -> Result<Arc<Snapshot>, Crash> {
            Err(Crash)
        }
        async fn drain(&mut self, _: &str) -> Result<Result<Drained, String>, Crash> {
            Err(Crash)
        }
        async fn write_status(
            &mut self,
            _: &TalosMachine,
            _: &TalosMachine,
        ) -> Result<Option<String>, Crash> {
            Err(Crash)
        }
        async fn release_finalizer(&mut self, _: &TalosMachine) -> Result<(), Crash> {
            Err(Crash)
        }
        async fn event(&mut self, _: &TalosMachine, _: bool, _: &str, _: String) {}
        fn note(&mut self, _: &TalosMachine, _: Note<'_>) {}
    }

    impl ApplyWorld for Mem {
        async fn base(&mut self, _: &str, _: &str) -> Result<Result<Arc<Base>, BaseError>, Crash> {
            Ok(Ok(self.base.clone()))
        }
        async fn patches(
            &mut self,
            _: &TalosCluster,
        ) -> Result<Result<Vec<TalosConfigPatch>, String>, Crash> {
            Ok(Ok(Vec::new()))
        }
        async fn apply_configuration(
            &mut self,
            _: &TalosMachine,
            api: TalosApi,
            config: &Rendered,
            mode: ApplyMode,
            dry_run: bool,
        ) -> Result<Result<Applied, ApplyError>, Crash> {
            self.calls.push((mode, dry_run));
            if (api == TalosApi::Maintenance) != self.maintenance {
                return Ok(Err(ApplyError::Talos("wrong API for this node".into())));
            }
            if let Some(why) = &self.refuse {
                return Ok(Err(ApplyError::Talos(why.clone())));
            }
            let change = self.running.as_deref() != Some(config.sha256.as_str());
            let reboot = change && self.reboot_for_change && !self.maintenance;
            let chosen = match mode {
                ApplyMode::Staged => ApplyMode::Staged,
                ApplyMode::NoReboot if reboot => {
                    return Ok(Err(ApplyError::Talos(
                        "the change requires a reboot".into(),
                    )));
                }
                _ if reboot || self.maintenance => ApplyMode::Reboot,
                _ => ApplyMode::NoReboot,
            };
            if !dry_run {
                if self.maintenance {
                    self.maintenance = false;
                    self.running = Some(config.sha256.clone());
                } else if chosen == ApplyMode::Staged {
                    self.staged = Some(config.sha256.clone());
                } else {
                    self.running = Some(config.sha256.clone());
                }
                if std::mem::take(&mut self.lose_answer) {
                    return Ok(Err(ApplyError::Talos("connection reset".into())));
                }
            }
            Ok(Ok(Applied {
                mode: chosen,
                details: "done".into(),
                warnings: Vec::new(),
            }))
        }
    }

    fn cluster() -> TalosCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": "prod", "namespace": "default"},
            "spec": {"controlPlane": {"count": 3}, "baseConfigSecretRef": {"name": "prod-base"}}
        }))
        .unwrap()
    }

    fn machine() -> TalosMachine {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": "cp-1", "namespace": "default"},
            "spec": {"clusterRef": {"name": "prod"}, "role": "controlplane", "approved": true,
                     "endpoint": "10.0.0.1:50000"}
        }))
        .unwrap()
    }

    /// One reconcile of `m` (as the API server has it): its status is written (becomes the
    /// API server's copy) unless the controller stops first.
    fn reconcile_once(w: &mut Mem, m: &mut TalosMachine) -> Result<Outcome, Crash> {
        reconcile_with(w, m, &shipped_edited(str::to_string))
    }

    /// One reconcile by the `plan apply` of `table`.
    fn reconcile_with(w: &mut Mem, m: &mut TalosMachine, table: &Table) -> Result<Outcome, Crash> {
        let mut next = m.clone();
        let c = cluster();
        let snapshot = Snapshot {
            machines: vec![m.clone()],
            clusters: vec![c.clone()],
            ..Snapshot::default()
        };
        let out = run_now(reconcile(w, table, &snapshot, Some(&c), m, &mut next))
            .expect("an immediate world");
        if std::mem::take(&mut w.crash_before_write) {
            return Err(Crash);
        }
        if out.is_ok() {
            *m = next;
        }
        out
    }

    fn configured(m: &TalosMachine) -> (String, String, String) {
        let c = m.condition(CONFIGURED).expect("a Configured condition");
        (
            c.status.clone(),
            c.reason.clone().unwrap_or_default(),
            c.message.clone().unwrap_or_default(),
        )
    }

    #[test]
    fn no_reboot_needed_is_applied() {
        let (mut w, mut m) = (Mem::new(), machine());
        let out = reconcile_once(&mut w, &mut m).unwrap();
        assert_eq!(out, Outcome::AwaitChange);
        let hash = m
            .status
            .as_ref()
            .unwrap()
            .config
            .as_ref()
            .unwrap()
            .rendered_hash
            .clone();
        assert_eq!(m.applied_config_hash(), hash.as_deref());
        assert_eq!(w.running, hash);
        assert_eq!(
            w.calls,
            [(ApplyMode::Auto, true), (ApplyMode::NoReboot, false)]
        );
        let (status, reason, _) = configured(&m);
        assert_eq!((status.as_str(), reason.as_str()), ("True", "Applied"));
        assert!(
            m.status
                .as_ref()
                .unwrap()
                .config
                .as_ref()
                .unwrap()
                .inputs
                .is_some()
        );
        // Applied: the next reconcile asks Talos nothing.
        assert_eq!(
            reconcile_once(&mut w, &mut m).unwrap(),
            Outcome::AwaitChange
        );
        assert_eq!(w.calls.len(), 2);
    }

    #[test]
    fn a_change_needing_a_reboot_is_staged_never_applied_before_the_reboot() {
        let (mut w, mut m) = (Mem::new(), machine());
        w.reboot_for_change = true;
        let out = reconcile_once(&mut w, &mut m).unwrap();
        assert!(
            matches!(&out, Outcome::Requeue { wait: Wait::On(r), .. } if r == "RebootRequired"),
            "{out:?}"
        );
        let (status, reason, message) = configured(&m);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "RebootRequired")
        );
        assert!(message.contains("staged on the node"), "{message}");
        assert_eq!(m.applied_config_hash(), None);
        let hash = m.staged_config_hash().map(str::to_string);
        assert!(hash.is_some());
        assert_eq!(w.staged, hash);
        // Not staged again while it waits for its reboot, and not counted applied.
        for _ in 0..3 {
            reconcile_once(&mut w, &mut m).unwrap();
        }
        assert_eq!(w.real_applies(), [ApplyMode::Staged]);
        assert_eq!(m.applied_config_hash(), None);
        assert_eq!(configured(&m).1, "RebootRequired");
        // The roll's reboot: the node runs it, the next reconcile records it applied.
        w.reboot();
        assert_eq!(
            reconcile_once(&mut w, &mut m).unwrap(),
            Outcome::AwaitChange
        );
        assert_eq!(m.applied_config_hash(), hash.as_deref());
        assert_eq!(m.staged_config_hash(), None);
        assert_eq!(configured(&m).1, "Applied");
    }

    #[test]
    fn a_dry_run_refusal_is_said_with_talos_words_and_nothing_is_applied() {
        let (mut w, mut m) = (Mem::new(), machine());
        w.refuse = Some("kube-apiserver config is already set in v1alpha1 config".into());
        let out = reconcile_once(&mut w, &mut m).unwrap();
        assert!(
            matches!(&out, Outcome::Requeue { after, wait: Wait::On(r) }
                if r == "DryRunRefused" && *after == Duration::from_secs(5)),
            "{out:?}"
        );
        let (status, reason, message) = configured(&m);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "DryRunRefused")
        );
        assert!(
            message.contains("kube-apiserver config is already set"),
            "{message}"
        );
        assert!(w.real_applies().is_empty());
        assert_eq!(m.applied_config_hash(), None);
        // Retried later each time it keeps failing (within 5 s and 5 min).
        w.now = w.now.checked_add(Duration::from_secs(60)).unwrap();
        let out = reconcile_once(&mut w, &mut m).unwrap();
        assert!(
            matches!(&out, Outcome::Requeue { after, .. } if *after == Duration::from_secs(60)),
            "{out:?}"
        );
        assert!(w.real_applies().is_empty());
    }

    #[test]
    fn a_node_in_maintenance_gets_its_first_configuration_there() {
        let (mut w, mut m) = (Mem::new(), machine());
        w.maintenance = true;
        w.running = None;
        status::set_at(
            w.now,
            m.conditions_mut(),
            "Maintenance",
            true,
            "MaintenanceMode",
            "m",
        );
        assert_eq!(
            reconcile_once(&mut w, &mut m).unwrap(),
            Outcome::AwaitChange
        );
        assert_eq!(w.calls, [(ApplyMode::Auto, true), (ApplyMode::Auto, false)]);
        assert!(!w.maintenance);
        assert!(!m.in_maintenance());
        let (status, reason, message) = configured(&m);
        assert_eq!((status.as_str(), reason.as_str()), ("True", "Applied"));
        assert!(message.contains("maintenance API"), "{message}");
        assert_eq!(m.applied_config_hash(), w.running.as_deref());
    }

    #[test]
    fn an_apply_whose_answer_is_lost_converges_without_a_wrong_status() {
        let (mut w, mut m) = (Mem::new(), machine());
        w.lose_answer = true;
        reconcile_once(&mut w, &mut m).unwrap();
        // Talos took it; the controller does not know: not recorded applied.
        assert_eq!(configured(&m).1, "ApplyFailed");
        assert_eq!(m.applied_config_hash(), None);
        assert_eq!(
            reconcile_once(&mut w, &mut m).unwrap(),
            Outcome::AwaitChange
        );
        assert_eq!(m.applied_config_hash(), w.running.as_deref());
        assert_eq!(configured(&m).1, "Applied");
    }

    #[test]
    fn a_crash_after_the_apply_before_the_status_write_does_no_harm() {
        let (mut w, mut m) = (Mem::new(), machine());
        w.crash_before_write = true;
        assert!(reconcile_once(&mut w, &mut m).is_err());
        assert!(m.status.is_none(), "nothing recorded");
        assert_eq!(
            reconcile_once(&mut w, &mut m).unwrap(),
            Outcome::AwaitChange
        );
        assert_eq!(m.applied_config_hash(), w.running.as_deref());
        // The same configuration applied twice (Talos: a no-op), never anything else.
        assert_eq!(w.real_applies(), [ApplyMode::NoReboot, ApplyMode::NoReboot]);
    }

    #[test]
    fn a_staged_apply_whose_answer_is_lost_is_staged_once_more_then_waits() {
        let (mut w, mut m) = (Mem::new(), machine());
        w.reboot_for_change = true;
        w.lose_answer = true;
        reconcile_once(&mut w, &mut m).unwrap();
        assert_eq!(configured(&m).1, "ApplyFailed");
        assert_eq!(m.staged_config_hash(), None);
        assert!(w.staged.is_some());
        for _ in 0..3 {
            reconcile_once(&mut w, &mut m).unwrap();
        }
        // Staged once more (the same configuration), recorded staged, never applied.
        assert_eq!(w.real_applies(), [ApplyMode::Staged, ApplyMode::Staged]);
        assert_eq!(m.staged_config_hash(), w.staged.as_deref());
        assert_eq!(m.applied_config_hash(), None);
        assert_eq!(configured(&m).1, "RebootRequired");
    }

    #[test]
    fn a_short_hash_is_cut_only_where_it_can_be() {
        assert_eq!(short("0123456789abcdef"), "0123456789ab");
        assert_eq!(short("ab"), "ab");
        assert_eq!(short("ééééééé"), "éééééé");
        assert_eq!(short("aéééééé"), "aéééééé");
    }

    #[test]
    fn a_table_without_the_plan_applies_nothing_and_says_so() {
        let (mut w, mut m) = (Mem::new(), machine());
        let t = shipped_edited(|t| {
            t.replace(
                "plan apply controlplane\n  do config render\n  do talos dry-run\n  do talos apply-config\n",
                "",
            )
        });
        assert!(
            t.plan(Verb::Apply, crate::vocab::Subject::ControlPlane)
                .is_none()
        );
        let out = reconcile_with(&mut w, &mut m, &t).unwrap();
        assert!(
            matches!(&out, Outcome::Requeue { wait: Wait::On(r), .. } if r == "NoPlan"),
            "{out:?}"
        );
        let (status, reason, message) = configured(&m);
        assert_eq!((status.as_str(), reason.as_str()), ("False", "NoPlan"));
        assert_eq!(
            message,
            "the rules have no `plan apply controlplane`; nothing is applied until they do"
        );
        assert!(w.calls.is_empty());
    }

    #[test]
    fn the_steps_run_in_the_plans_order_and_a_guard_keeps_one_out() {
        // The dry run kept out by its guard: the apply is `no-reboot`, said so.
        let (mut w, mut m) = (Mem::new(), machine());
        let t = shipped_edited(|t| {
            t.replace("  do talos dry-run\n", "  do talos dry-run when false\n")
        });
        assert_eq!(
            reconcile_with(&mut w, &mut m, &t).unwrap(),
            Outcome::AwaitChange
        );
        assert_eq!(w.calls, [(ApplyMode::NoReboot, false)]);
        assert!(
            configured(&m)
                .2
                .contains("Talos' dry run: none in the plan")
        );
        // The apply before the render: nothing to send, said so.
        let (mut w, mut m) = (Mem::new(), machine());
        let t = shipped_edited(|t| {
            t.replace(
                "  do config render\n  do talos dry-run\n  do talos apply-config\n",
                "  do talos apply-config\n  do config render\n",
            )
        });
        reconcile_with(&mut w, &mut m, &t).unwrap();
        assert_eq!(configured(&m).1, "NotRendered");
        assert!(w.calls.is_empty());
        // No apply step: rendered, never counted applied.
        let (mut w, mut m) = (Mem::new(), machine());
        let t = shipped_edited(|t| t.replace("  do talos apply-config\n", ""));
        reconcile_with(&mut w, &mut m, &t).unwrap();
        assert_eq!(configured(&m).1, "NotApplied");
        assert_eq!(w.calls, [(ApplyMode::Auto, true)]);
        assert_eq!(m.applied_config_hash(), None);
    }

    #[test]
    fn no_cluster_or_no_base_is_nothing_to_do() {
        let (mut w, m) = (Mem::new(), machine());
        let mut next = m.clone();
        let t = shipped_edited(str::to_string);
        let s = Snapshot::default();
        let out = run_now(reconcile(&mut w, &t, &s, None, &m, &mut next)).unwrap();
        assert_eq!(out.unwrap(), Outcome::AwaitChange);
        let mut c = cluster();
        c.spec.base_config_secret_ref = None;
        let out = run_now(reconcile(&mut w, &t, &s, Some(&c), &m, &mut next)).unwrap();
        assert_eq!(out.unwrap(), Outcome::AwaitChange);
        assert!(w.calls.is_empty());
        assert_eq!(next, m);
    }
}
