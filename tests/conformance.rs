//! Conformance replay: walks of `verify`'s model, seeded and random among the moves a real
//! run can take here, replayed against the real parts: the webhook's decision on real
//! AdmissionReview JSON with live reads, the controller's reconcile of each machine, the
//! in-process API server, the Talos API stand-ins and a REAL etcd cluster. After every move
//! the real world and the model are reduced to the same view
//! (`ichor_rules::verify::conform::View`, by the same functions); the real step must be one
//! the model allows from the same state (one of its successors by that move has the real
//! view), and the walk goes on from the model state it matched. Every request the model
//! refuses in a state is sent too, and the webhook must refuse it.
//!
//! A disagreement fails with both traces side by side. The walks are bounded in number
//! (`ICHOR_CONFORMANCE_WALKS`, default 10) and in time (`ICHOR_CONFORMANCE_SECONDS`, default
//! 120): each one starts a fresh etcd cluster.

use crate::support::apiserver::ApiServer;
use crate::support::controller as harness;
use crate::support::etcd::EtcdCluster;
use crate::support::objects;
use crate::support::talos::TalosApi;

use ichor_rules::compile::Table;
use ichor_rules::runtime::admission::parse_review;
use ichor_rules::runtime::controller::Context;
use ichor_rules::runtime::live::LiveReader;
use ichor_rules::runtime::metrics::Metrics;
use ichor_rules::runtime::objects::{Object, TalosCluster, TalosMachine};
use ichor_rules::runtime::reload::{Reload, Rules};
use ichor_rules::runtime::webhook::{Webhook, decide_request};
use ichor_rules::verify::conform::{self, View};
use ichor_rules::verify::invariant::{Facts, InvariantCheck, Outcome};
use ichor_rules::verify::model::{Bounds, Model, Move, NAMESPACE, Next, Req, State};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MOVES: usize = 18;

fn shipped() -> PathBuf {
    concat!(env!("CARGO_MANIFEST_DIR"), "/rules").into()
}

fn table_of(rules: &Path) -> Table {
    ichor_rules::ruleset::load(&[rules.to_path_buf()])
        .expect("the rules load")
        .table
        .expect("a table")
}

fn bounds() -> Bounds {
    Bounds {
        max_control_planes: 3,
        max_workers: 0,
        max_failures: 1,
        max_operations: 0,
        in_flight: 0,
        max_requests: Some(6),
        depth: 32,
        rolls: false,
        roll_width: 1,
        roll_kind: ichor_rules::verify::RollKind::Reboot,
        all_kinds: false,
        backups: false,
        lifecycle: false,
        clock: false,
    }
}

/// The real parts of one walk.
struct Real {
    api: ApiServer,
    talos: TalosApi,
    ctx: Arc<Context>,
    webhook: Webhook,
}

impl Real {
    /// The real world of the model state `s`: its objects as the model builds them (each
    /// endpoint the stand-in of its node), an etcd member and a Talos stand-in per
    /// machine, a Kubernetes Node each.
    async fn of(model: &Model<'_>, s: &State, rules: &Path) -> Real {
        let load = || {
            let r = Arc::new(Rules::new(vec![rules.to_path_buf()]));
            assert!(
                matches!(r.reload(), Reload::Replaced { .. }),
                "the rules load"
            );
            r
        };
        let names: Vec<String> = (0..s.machines.len()).map(|i| s.name(i)).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let etcd = EtcdCluster::start_named(&refs).await;
        let talos = TalosApi::start(etcd).await;
        let api = ApiServer::start().await;
        if let Some(c) = model.objects.cluster(s) {
            api.insert(serde_json::to_value(c).expect("cluster json"));
        }
        for (i, name) in names.iter().enumerate() {
            let mut m = serde_json::to_value(model.objects.machine(s, i)).expect("json");
            m["spec"]["endpoint"] = json!(talos.by_name(name).endpoint());
            api.insert(m);
            api.insert(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name},
                "spec": {},
                "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}
            }));
        }
        let mut settings = harness::fast_settings("controller-1");
        // A walk never waits for a lock to expire (the model's locks do not).
        settings.lock_duration = Duration::from_secs(600);
        let ctx = Arc::new(Context::new(
            api.client(),
            load(),
            Some(Arc::new(talos.tls())),
            settings,
            Arc::new(Metrics::default()),
        ));
        let webhook = Webhook {
            rules: load(),
            reader: LiveReader::new(api.client(), Duration::from_secs(5)),
            metrics: Arc::new(Metrics::default()),
            api_ready: Default::default(),
            controller_username: Some("system:serviceaccount:ichor-system:controller".into()),
            records: None,
        };
        talos
            .etcd
            .wait_healthy(names.len())
            .await
            .expect("etcd healthy");
        Real {
            api,
            talos,
            ctx,
            webhook,
        }
    }

    fn machine(&self, name: &str) -> Option<Value> {
        self.api
            .objects("TalosMachine", Some(NAMESPACE))
            .into_iter()
            .find(|m| m["metadata"]["name"] == name)
    }

    /// The real world's view.
    async fn view(&self, plan: &[ichor_rules::compile::PlanStep]) -> View {
        let members = self.talos.etcd.member_names().await;
        let nodes = self.api.objects("Node", None);
        let mut v = View::default();
        for m in self.api.objects("TalosMachine", Some(NAMESPACE)) {
            let tm: TalosMachine = serde_json::from_value(m).expect("a TalosMachine");
            let name = tm.metadata.name.clone().unwrap_or_default();
            let mut mv = conform::object_view(plan, &tm);
            mv.member = members.contains(&name);
            let node = self.talos.by_name(&name);
            mv.answers = node.is_serving() && !node.is_wiped();
            mv.wiped = node.is_wiped();
            mv.cordoned = nodes
                .iter()
                .any(|n| n["metadata"]["name"] == name && n["spec"]["unschedulable"] == true);
            v.machines.insert(name, mv);
        }
        v.members = members.iter().cloned().collect();
        v.count = self
            .api
            .objects("TalosCluster", Some(NAMESPACE))
            .first()
            .and_then(|c| c["spec"]["controlPlane"]["count"].as_i64());
        v.lock = harness::lock_leases(&self.api)
            .iter()
            .filter_map(|l| l["spec"]["holderIdentity"].as_str())
            .find(|h| !h.is_empty())
            .map(str::to_string);
        v
    }

    /// Sends `req` as the model builds it, on the real objects, to the webhook's decision;
    /// commits it when allowed (`commit`). Whether it was allowed.
    async fn request(&self, model: &Model<'_>, s: &State, req: Req, commit: bool) -> bool {
        let snap = model.objects.snapshot(s);
        let (op, old, new) = model
            .objects
            .request(s, &snap, req)
            .expect("the model can make the request");
        let client = self.api.test_client();
        let machines: Api<TalosMachine> = Api::namespaced(client.clone(), NAMESPACE);
        let clusters: Api<TalosCluster> = Api::namespaced(client, NAMESPACE);
        let (kind, name, mut real_old) = match old.as_ref().or(new.as_ref()) {
            Some(Object::Machine(m)) => {
                let name = m.metadata.name.clone().unwrap_or_default();
                let real = self.machine(&name).expect("the machine is there");
                ("TalosMachine", name, real)
            }
            Some(Object::Cluster(c)) => {
                let name = c.metadata.name.clone().unwrap_or_default();
                let real = self
                    .api
                    .objects("TalosCluster", Some(NAMESPACE))
                    .into_iter()
                    .next()
                    .expect("the cluster is there");
                ("TalosCluster", name, real)
            }
            _ => panic!("no operation request is replayed"),
        };
        // The annotations the model's old object has (`kubectl annotate` before a delete)
        // are put on the real object first.
        let annotations = match &old {
            Some(Object::Machine(m)) => m.metadata.annotations.clone(),
            Some(Object::Cluster(c)) => c.metadata.annotations.clone(),
            _ => None,
        }
        .unwrap_or_default();
        if commit && !annotations.is_empty() {
            let body = json!({"metadata": {"annotations": annotations}});
            let pp = PatchParams::default();
            if kind == "TalosMachine" {
                machines
                    .patch(&name, &pp, &Patch::Merge(&body))
                    .await
                    .expect("annotate");
            } else {
                clusters
                    .patch(&name, &pp, &Patch::Merge(&body))
                    .await
                    .expect("annotate");
            }
        }
        for (k, val) in &annotations {
            real_old["metadata"]["annotations"][k] = json!(val);
        }
        let real_new = new.as_ref().map(|n| {
            let mut v = real_old.clone();
            v["spec"] = match n {
                Object::Machine(m) => {
                    let mut spec = serde_json::to_value(&m.spec).expect("spec");
                    spec["endpoint"] = real_old["spec"]["endpoint"].clone();
                    spec
                }
                Object::Cluster(c) => serde_json::to_value(&c.spec).expect("spec"),
                Object::Operation(_) => unreachable!("no operation request is replayed"),
                Object::Backup(_) => unreachable!("no backup request is replayed"),
                Object::Patch(_) => unreachable!("no patch request is replayed"),
            };
            v
        });
        let op_name = format!("{op:?}").to_uppercase();
        let review = objects::review(
            &format!("conformance-{}", self.api.resource_version()),
            &op_name,
            Some(&real_old),
            real_new.as_ref(),
        )
        .build();
        let parsed = parse_review(&serde_json::to_vec(&review).expect("json")).expect("parses");
        let answer = decide_request(&self.webhook, &parsed).await;
        let allowed = answer.response.as_ref().is_some_and(|r| r.allowed);
        if allowed && commit {
            let pp = PatchParams::default();
            match (kind, &real_new) {
                ("TalosMachine", Some(n)) => {
                    machines
                        .patch(&name, &pp, &Patch::Merge(&json!({"spec": n["spec"]})))
                        .await
                        .expect("patch the machine");
                }
                ("TalosMachine", None) => {
                    machines
                        .delete(&name, &DeleteParams::default())
                        .await
                        .expect("delete the machine");
                }
                (_, Some(n)) => {
                    clusters
                        .patch(&name, &pp, &Patch::Merge(&json!({"spec": n["spec"]})))
                        .await
                        .expect("patch the cluster");
                }
                (_, None) => {
                    clusters
                        .delete(&name, &DeleteParams::default())
                        .await
                        .expect("delete the cluster");
                }
            }
        }
        allowed
    }

    /// The controller's reconcile of one machine, as its watch would run it: whether it
    /// ended without an error (an error ends it where it was, as a crash would).
    async fn reconcile(&self, name: &str) -> bool {
        let Some(m) = self.machine(name) else {
            return true;
        };
        // The model's clock has let every reset settle; the real one waits it out.
        if m["status"]["removal"]["startedAt"].is_string() {
            tokio::time::sleep(self.ctx.settings.reset_settle + Duration::from_millis(200)).await;
        }
        let tm: TalosMachine = serde_json::from_value(m).expect("a TalosMachine");
        let result =
            ichor_rules::runtime::controller::machine::reconcile(Arc::new(tm), self.ctx.clone())
                .await;
        if std::env::var_os("ICHOR_CONFORMANCE_VERBOSE").is_some() {
            eprintln!(
                "reconcile {name}: {result:?}; status {}",
                self.machine(name)
                    .map(|m| m["status"].to_string())
                    .unwrap_or_default()
            );
        }
        result.is_ok()
    }

    async fn node_dies(&self, name: &str) {
        let node = self.talos.by_name(name);
        node.stop().await;
        self.talos.etcd.kill(node.index());
    }
}

/// Replays move `mv` of the model in the real world and matches it: the model state the
/// real step reached (`Err` with both sides when none of the model's successors by that
/// move is what the real run did).
async fn step(
    model: &Model<'_>,
    real: &Real,
    s: &State,
    mv: Move,
    trail: &mut Vec<String>,
) -> Result<Next, String> {
    let plan = model.objects.plan.unwrap_or(&[]);
    let nexts = conform::successors(model, s);
    let said = conform::describe(s, &mv);
    // A reconcile that ended without an error ran to its end: the model's whole run, not
    // one stopped after a status write.
    let mut whole = false;
    match mv {
        Move::Admit { req, .. } => {
            if !real.request(model, s, req, true).await {
                return Err(format!(
                    "after\n  {}\nthe webhook refuses `{said}`, which the model allows",
                    trail.join("\n  ")
                ));
            }
        }
        Move::Removal(i) => whole = real.reconcile(&s.name(i)).await,
        Move::NodeDies(i) => real.node_dies(&s.name(i)).await,
        other => unreachable!("{other:?} is not replayed"),
    }
    trail.push(said.clone());
    let seen = real.view(plan).await;
    if std::env::var_os("ICHOR_CONFORMANCE_VERBOSE").is_some() {
        eprintln!("{said}: {seen:#?}");
    }
    let mut matched = conform::matching(model, &nexts, mv, &seen);
    if whole {
        let last = nexts.iter().rposition(|n| n.mv == mv);
        matched.retain(|n| last.is_some_and(|k| std::ptr::eq(*n, &nexts[k])));
    }
    // A Talos call that acted but whose answer was lost (a timeout: the node or etcd went
    // away while it answered) is the model's RemovalLost, and one refused (etcd refusing a
    // reconfiguration it judges unsafe) its RemovalRefused: the same reconcile with that
    // failure, whatever the failures spent so far.
    let lost = match mv {
        Move::Removal(i) if matched.is_empty() => {
            let mut t = s.clone();
            t.failures = 0;
            let mut lost = conform::successors(model, &t);
            lost.retain(|n| {
                n.mv == Move::RemovalLost(i)
                    || n.mv == Move::RemovalCrash(i)
                    || n.mv == Move::RemovalRefused(i)
            });
            lost
        }
        _ => Vec::new(),
    };
    if !lost.is_empty() {
        matched = lost
            .iter()
            .filter(|n| conform::model_view(model, &n.state) == seen)
            .collect();
        if let Some(n) = matched.last() {
            trail.push(format!("  (the model's {:?})", n.mv));
        }
    }
    let Some(next) = matched.last() else {
        let expected: Vec<String> = nexts
            .iter()
            .filter(|n| n.mv == mv)
            .map(|n| conform::differences(&conform::model_view(model, &n.state), &seen))
            .map(|d| d.join("\n    "))
            .collect();
        return Err(format!(
            "the real run left the model at `{said}`, after\n  {}\n\
             the model's successors by that move differ from the real state:\n    {}",
            trail.join("\n  "),
            expected.join("\n  or\n    ")
        ));
    };
    let mut next = Next {
        mv: next.mv,
        state: next.state.clone(),
        effect: next.effect,
    };
    next.state.failures = next.state.failures.max(s.failures);
    Ok(next)
}

/// The checks every state of a walk gets before its move: the real start is the model's,
/// every request the model refuses the webhook refuses, and a reconcile the model says
/// changes nothing changes nothing real.
async fn check_state(
    model: &Model<'_>,
    real: &Real,
    s: &State,
    trail: &[String],
) -> Result<(), String> {
    let plan = model.objects.plan.unwrap_or(&[]);
    let here = real.view(plan).await;
    let expected = conform::model_view(model, s);
    if here != expected {
        return Err(format!(
            "after\n  {}\nthe real state is not the model's:\n    {}",
            trail.join("\n  "),
            conform::differences(&expected, &here).join("\n    ")
        ));
    }
    for req in conform::refused(model, s) {
        let mv = Move::Admit {
            req,
            in_flight: false,
        };
        if real.request(model, s, req, false).await {
            return Err(format!(
                "after\n  {}\nthe webhook allows `{}`, which the model refuses",
                trail.join("\n  "),
                conform::describe(s, &mv)
            ));
        }
    }
    let nexts = conform::successors(model, s);
    for i in conform::waiting_removals(s, &nexts) {
        real.reconcile(&s.name(i)).await;
        let after = real.view(plan).await;
        if after != here {
            return Err(format!(
                "after\n  {}\nthe controller's reconcile of {} changed the real state where \
                 the model's waits:\n    {}",
                trail.join("\n  "),
                s.name(i),
                conform::differences(&here, &after).join("\n    ")
            ));
        }
    }
    Ok(())
}

/// One seeded walk; `Err` with both traces when the real run leaves the model.
async fn walk(table: &Table, seed: u64) -> Result<usize, String> {
    let model = Model::new(table, bounds()).expect("model");
    let mut s = conform::start(&model, 3).expect("a starting state");
    let real = Real::of(&model, &s, &shipped()).await;
    let mut rng = conform::Rng::new(seed);
    let mut trail: Vec<String> = Vec::new();
    for _ in 0..MOVES {
        check_state(&model, &real, &s, &trail)
            .await
            .map_err(|e| format!("seed {seed}: {e}"))?;
        let mut choices: Vec<Move> = conform::successors(&model, &s)
            .iter()
            .map(|n| n.mv)
            .filter(conform::replayable)
            .collect();
        choices.dedup();
        if choices.is_empty() {
            break;
        }
        // Weighted: the controller's moves first, then people's edits of machines, then
        // the declared count and failures, so walks go deep into removals.
        let weight = |m: &Move| match m {
            Move::Removal(_) => 12,
            Move::Admit {
                req: Req::Count(_), ..
            } => 4,
            Move::Admit { .. } => 6,
            _ => 1,
        };
        let total: usize = choices.iter().map(weight).sum();
        let mut at = rng.below(total);
        let mut mv = choices[0];
        for m in &choices {
            if at < weight(m) {
                mv = *m;
                break;
            }
            at -= weight(m);
        }
        s = step(&model, &real, &s, mv, &mut trail)
            .await
            .map_err(|e| format!("seed {seed}: {e}"))?
            .state;
    }
    eprintln!("seed {seed}:\n  {}", trail.join("\n  "));
    Ok(trail.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_walks_of_the_model_are_runs_of_the_real_controller() {
    let table = table_of(&shipped());
    let walks: u64 = std::env::var("ICHOR_CONFORMANCE_WALKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let budget = Duration::from_secs(
        std::env::var("ICHOR_CONFORMANCE_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(120),
    );
    let started = Instant::now();
    let (mut done, mut moves) = (0, 0);
    for seed in 1..=walks {
        if started.elapsed() > budget {
            break;
        }
        match walk(&table, seed).await {
            Ok(n) => moves += n,
            Err(e) => panic!("{e}"),
        }
        done += 1;
    }
    eprintln!(
        "conformance: {done} walks, {moves} moves, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(done >= 1, "no walk ran within the budget");
    assert!(moves >= done, "the walks took {moves} moves");
}

/// A copy of the shipped rules with the statement starting `head` removed from `file`.
fn weakened(name: &str, file: &str, head: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("conformance-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    for entry in std::fs::read_dir(shipped()).expect("rules/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "rules") {
            continue;
        }
        let mut text = std::fs::read_to_string(&path).expect("read");
        if path.file_name().is_some_and(|f| f == file) {
            let start = text.find(head).unwrap_or_else(|| panic!("no `{head}`"));
            let end = text[start..]
                .find("\n\n")
                .map_or(text.len(), |e| start + e + 1);
            text = format!("{}{}", &text[..start], &text[end..]);
        }
        std::fs::write(dir.join(path.file_name().expect("name")), text).expect("write");
    }
    dir
}

/// A counterexample of `verify` is a real story: without the `healthy-quorum` rule, the
/// shortest replayable counterexample (a control plane's node dies, a healthy one is
/// deleted and removed) is replayed step by step with the weakened rules in the webhook
/// and the controller, every real step is the model's, and at its end the real etcd has
/// lost its healthy majority as the model said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counterexample_of_verify_replays_as_a_real_loss_of_the_majority() {
    let rules = weakened("healthy-quorum", "removal.rules", "rule healthy-quorum\n");
    let table = table_of(&rules);
    let model = Model::new(&table, bounds()).expect("model");
    let checks: Vec<InvariantCheck> = table.invariants.iter().map(InvariantCheck::new).collect();
    let start = conform::start(&model, 3).expect("a starting state");
    let cx = conform::counterexample(&model, &checks, &start, 6)
        .expect("verify refutes the rules without healthy-quorum");
    assert_eq!(cx.invariant, "healthy-majority", "{}", cx.message);
    {
        let mut at = start.clone();
        for (mv, next) in &cx.path {
            eprintln!(
                "cx: {} -> {:?}",
                conform::describe(&at, mv),
                conform::model_view(&model, next)
            );
            at = next.clone();
        }
    }
    let real = Real::of(&model, &start, &rules).await;
    let mut s = start;
    let mut trail = Vec::new();
    let mut broken = false;
    for (mv, _) in &cx.path {
        check_state(&model, &real, &s, &trail)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let next = step(&model, &real, &s, *mv, &mut trail)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // The step the real run took is one the model calls a violation too.
        let facts = Facts::of_transition(&Facts::of_state(&s), &next.state, &next.effect);
        broken |= checks.iter().any(|c| {
            c.meta.name == "healthy-majority"
                && matches!(c.holds(&facts, next.state.concurrent), Outcome::Broken(_))
        });
        s = next.state;
    }
    if !broken {
        // etcd itself refused the reconfiguration (its strict reconfiguration check, once
        // it has seen the dead member go): the run is the model's refused call, and the
        // majority held in both.
        assert!(
            trail.iter().any(|t| t.contains("RemovalRefused")),
            "after\n  {}\nthe model's majority held along the real run, and no call was refused",
            trail.join("\n  ")
        );
        eprintln!(
            "replayed; etcd refused the leave:\n  {}",
            trail.join("\n  ")
        );
        return;
    }
    // …and the real etcd cannot serve a linearizable read through any member that runs:
    // its healthy majority is gone.
    let etcd = &real.talos.etcd;
    let deadline = Instant::now() + Duration::from_secs(15);
    let serving = loop {
        let mut serving = Vec::new();
        for i in etcd.running() {
            let port: u16 = etcd
                .client_url(i)
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("a port");
            let read = tokio::time::timeout(
                Duration::from_secs(2),
                crate::support::etcd::post(port, "/v3/kv/range", json!({"key": "YQ=="})),
            )
            .await;
            if matches!(read, Ok(Ok(_))) {
                serving.push(etcd.name(i));
            }
        }
        if serving.is_empty() || Instant::now() > deadline {
            break serving;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        serving.is_empty(),
        "after\n  {}\nthe real etcd still serves reads through {serving:?} ({})",
        trail.join("\n  "),
        cx.message
    );
    eprintln!("replayed:\n  {}\n{}", trail.join("\n  "), cx.message);
}
