//! Decision records at the controller (issue 38), end to end: the webhook (in-process, its
//! decision recorded) admits a deletion or an operation, the controller (in-process, against
//! the in-process API server and Talos stand-ins backed by a real etcd) runs it, and the
//! one decision log (a file sink) holds the webhook's decision, each controller decision
//! and one record per plan step with its Talos calls, the `actor_id` Talos gave the action,
//! the node's new boot time and the link to the admission. `ichor-rules replay` reads the
//! same log: every decision reproduced, every step record skipped with a word.

use crate::support::apiserver::ApiServer;
use crate::support::controller::*;
use crate::support::etcd::EtcdCluster;
use crate::support::objects;
use crate::support::talos::TalosApi;
use base64::Engine;
use ichor_rules::runtime::admission::parse_review;
use ichor_rules::runtime::controller::Context;
use ichor_rules::runtime::live::LiveReader;
use ichor_rules::runtime::metrics::Metrics;
use ichor_rules::runtime::records::{self, Recorder, Sink};
use ichor_rules::runtime::step_records::{self, ControllerRecord, StepRecord};
use ichor_rules::runtime::webhook::{Webhook, decide_request};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(40);

/// The log, its recorder, and the webhook that writes to it.
struct Recording {
    path: PathBuf,
    recorder: Arc<Recorder>,
    webhook: Webhook,
}

impl Recording {
    fn start(name: &str, api: &ApiServer) -> Recording {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("decisions-{name}-{}.ndjson", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let metrics = Arc::new(Metrics::default());
        let recorder = Recorder::start(
            Sink::File {
                path: path.clone(),
                max_bytes: 1 << 30,
                keep: 1,
            },
            4096,
            metrics.clone(),
        )
        .expect("the recorder starts");
        let webhook = Webhook {
            rules: rules(),
            reader: LiveReader::new(api.client(), Duration::from_secs(3)),
            metrics,
            api_ready: Default::default(),
            controller_username: Some("system:serviceaccount:ichor-system:ichor-rules".into()),
            records: Some(recorder.clone()),
        };
        Recording {
            path,
            recorder,
            webhook,
        }
    }

    /// The webhook decides `review`; its decision id (it must allow).
    async fn admit(&self, review: Value) -> String {
        let req = parse_review(&serde_json::to_vec(&review).expect("json")).expect("a review");
        let answer = decide_request(&self.webhook, &req).await;
        let resp = answer.response.expect("a response");
        assert!(resp.allowed, "the webhook refused: {:?}", resp.result);
        resp.audit_annotations
            .get("decision-id")
            .cloned()
            .expect("a decision id")
    }

    fn ctx(&self, api: &ApiServer, talos: &TalosApi, identity: &str) -> Arc<Context> {
        Arc::new(
            Context::new(
                api.client(),
                rules(),
                Some(Arc::new(talos.tls())),
                fast_settings(identity),
                Arc::new(Metrics::default()),
            )
            .with_records(self.recorder.clone()),
        )
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap_or_default()
    }

    fn steps(&self) -> Vec<StepRecord> {
        step_records::read_steps(&self.text()).expect("the step records parse")
    }

    fn decisions(&self) -> Vec<ControllerRecord> {
        step_records::read_decisions(&self.text()).expect("the controller's records parse")
    }

    /// Waits until the log holds a step record `text` of `target` that is done.
    async fn step_done(&self, target: &str, text: &str) {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            if self
                .steps()
                .iter()
                .any(|s| s.target.name == target && s.step.text == text && s.result == "done")
            {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no record of `{text}` done for {target}; the log:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `ichor-rules replay LOG`: its exit code and what it printed.
fn replay(log: &Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .arg("replay")
        .arg(log)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the binary runs");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn add_machine(api: &ApiServer, talos: &TalosApi, name: &str, index: usize) {
    let mut m = control_plane(name, u32::try_from(index).expect("small") + 1);
    m["spec"]["endpoint"] = json!(talos.node(index).endpoint());
    api.insert(m);
    api.insert(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    }));
}

/// Steps recorded done for `target`, by text: each step of the plan (its place) exactly
/// once.
fn done_once(steps: &[StepRecord], target: &str) -> Vec<String> {
    let mut done: Vec<(usize, String)> = steps
        .iter()
        .filter(|s| s.target.name == target && s.result == "done")
        .map(|s| (s.step.index, s.step.text.clone()))
        .collect();
    let n = done.len();
    done.sort();
    done.dedup();
    assert_eq!(done.len(), n, "a step recorded done twice: {steps:#?}");
    done.into_iter().map(|(_, t)| t).collect()
}

/// A removal admitted by the webhook, then run by the controller: the log holds the
/// webhook's decision, the controller's decision linked to it (its id, request uid and
/// digest) with its facts and their objects, one record per plan step that ran (the reset
/// with the `actor_id` Talos gave it), and each step names the decision that let it run.
/// A dead member's removal records `member.dead` with the sibling asked and what it
/// answered. Replay reproduces every decision and skips the steps, saying so; the Talos
/// credentials' Secret appears nowhere in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_is_recorded_from_its_admission_to_the_reset() {
    let names = ["cp-1", "cp-2", "cp-3", "cp-4"];
    let talos = TalosApi::start(EtcdCluster::start_named(&names).await).await;
    let api = ApiServer::start().await;
    // The cluster's own talosconfig Secret (the credentials the removal uses), and another
    // Secret with a value of its own: neither may reach a record.
    let talosconfig = talos.talosconfig_yaml();
    let encoded = base64::engine::general_purpose::STANDARD.encode(&talosconfig);
    api.insert(
        objects::cluster("prod", 3)
            .namespace(NS)
            .schedulable("true")
            .secret(json!({"name": "prod-talos", "key": "talosconfig"}))
            .build(),
    );
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-talos", "namespace": NS},
        "type": "Opaque",
        "data": {"talosconfig": encoded}
    }));
    const DECOY: &str = "ZGVjb3ktc2VjcmV0LXZhbHVlLTM4";
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "store-keys", "namespace": NS},
        "data": {"secret_access_key": DECOY}
    }));
    for (i, n) in names.iter().enumerate() {
        add_machine(&api, &talos, n, i);
    }
    let rec = Recording::start("removal", &api);
    let _c = Running::start(rec.ctx(&api, &talos, "controller-1"));
    wait_for("finalizers", WAIT, || {
        names.iter().all(|n| has_finalizer(&api, n))
    })
    .await;

    // 1. cp-4 is deleted, the webhook allowing it first (as the API server asks it).
    let stored = get(&api, "TalosMachine", "cp-4").expect("cp-4");
    let admitted = rec
        .admit(objects::review("req-delete-cp-4", "DELETE", Some(&stored), None).build())
        .await;
    // A dry run of the same deletion afterwards (`kubectl delete --dry-run=server`): it is
    // recorded as one, and is not the admission the removal links to.
    let mut dry = objects::review("req-dry-delete-cp-4", "DELETE", Some(&stored), None).build();
    dry["request"]["dryRun"] = json!(true);
    let dry_id = rec.admit(dry).await;
    delete(&api, "TalosMachine", "cp-4").await;
    wait_for("cp-4 removed", WAIT, || {
        get(&api, "TalosMachine", "cp-4").is_none()
    })
    .await;
    rec.step_done("cp-4", "release finalizer").await;

    let table = rules().current().expect("the shipped rules");
    let decisions = rec.decisions();
    let allowed: Vec<&ControllerRecord> = decisions
        .iter()
        .filter(|d| d.target.name == "cp-4" && d.decision.verdict == "allow")
        .collect();
    assert_eq!(
        allowed.len(),
        1,
        "one decision let the removal run: {decisions:#?}"
    );
    let d = allowed[0];
    assert_eq!(d.decision.site, "controller");
    assert_eq!(d.target.kind, "TalosMachine");
    assert_eq!(d.target.namespace, NS);
    assert!(!d.target.uid.is_empty(), "{d:?}");
    let ev = &d.decision.events[0];
    assert_eq!(
        (ev.verb.as_str(), ev.subject.as_str()),
        ("remove", "controlplane")
    );
    let approved = ev
        .facts
        .iter()
        .find(|f| f.name == "approved")
        .expect("the count of approved control planes");
    assert_eq!(approved.value, json!(4), "{ev:?}");
    assert!(
        approved
            .from
            .iter()
            .filter_map(|&i| ev.objects.get(i as usize))
            .all(|o| o.kind == "TalosMachine" && o.resource_version.is_some()),
        "counted from the machines, each with its resourceVersion: {ev:?}"
    );
    let link = d.admission.as_ref().expect("linked to its admission");
    assert_eq!(link.decision, admitted);
    assert_eq!(link.request_uid, "req-delete-cp-4");
    assert_eq!(link.operation, "DELETE");
    assert_eq!(link.digest, d.decision.rules.digest);
    assert_eq!(
        Some(link.object_uid.as_str()),
        stored["metadata"]["uid"].as_str()
    );
    assert_eq!(link.object_uid, d.target.uid);
    // This webhook asks no client certificate: the link says its caller was not verified.
    assert!(!link.caller_verified, "{link:?}");
    assert!(d.decision.rules.digest.starts_with("sha256:"), "{d:?}");
    // The webhook's records: the dry run says so; both name the object's uid.
    let webhook: Vec<records::Record> = records::read_log(&rec.text())
        .expect("the log parses")
        .into_iter()
        .filter(|r| r.site == "webhook")
        .collect();
    let request = |id: &str| {
        webhook
            .iter()
            .find(|r| r.id == id)
            .and_then(|r| r.request.clone())
            .unwrap_or_else(|| panic!("no webhook record {id}: {webhook:#?}"))
    };
    assert!(request(&dry_id).dry_run);
    assert!(!request(&admitted).dry_run);
    assert_eq!(request(&admitted).object_uid, link.object_uid);
    assert_eq!(request(&dry_id).object_uid, link.object_uid);

    // One record per step that ran, each done once, in the plan's order, each naming the
    // decision that let it run and the admission.
    let steps = rec.steps();
    let plan: Vec<String> = table
        .plan(
            ichor_rules::vocab::Verb::Remove,
            ichor_rules::vocab::Subject::ControlPlane,
        )
        .expect("a removal plan")
        .steps
        .iter()
        .map(|s| s.text.clone())
        .collect();
    let done = done_once(&steps, "cp-4");
    for must in [
        "drain node",
        "etcd leave",
        "talos reset",
        "release finalizer",
    ] {
        assert!(
            done.iter().any(|s| s == must),
            "{must} not recorded: {done:?}"
        );
        assert!(
            plan.iter().any(|s| s == must),
            "{must} is not a step: {plan:?}"
        );
    }
    for s in steps.iter().filter(|s| s.target.name == "cp-4") {
        assert_eq!(s.decision.as_deref(), Some(d.decision.id.as_str()), "{s:?}");
        assert_eq!(s.admission.as_ref(), Some(link), "{s:?}");
        assert_eq!(plan.get(s.step.index), Some(&s.step.text), "{s:?}");
    }
    let reset = steps
        .iter()
        .find(|s| s.target.name == "cp-4" && s.step.text == "talos reset" && s.result == "done")
        .expect("the reset");
    let call = reset
        .effects
        .iter()
        .find(|e| e.call.starts_with("Reset"))
        .expect("the Reset call");
    assert_eq!(call.result, "ok");
    assert_eq!(call.node, "TalosMachine cp-4");
    assert_eq!(call.actor_id.as_deref(), Some("cp-4-reset-1"), "{call:?}");
    let leave = steps
        .iter()
        .find(|s| s.target.name == "cp-4" && s.step.text == "etcd leave")
        .expect("the leave");
    assert!(
        leave
            .effects
            .iter()
            .any(|e| e.call == "EtcdLeaveCluster" && e.result == "ok"),
        "{leave:?}"
    );

    // 2. cp-3 dies and is deleted: its removal below the count asks etcd whether its member
    // is dead, through a healthy sibling, and the record says which and what it answered.
    talos.etcd.kill(talos.by_name("cp-3").index());
    talos.by_name("cp-3").stop().await;
    delete(&api, "TalosMachine", "cp-3").await;
    wait_for("cp-3 removed", WAIT, || {
        get(&api, "TalosMachine", "cp-3").is_none()
    })
    .await;
    rec.step_done("cp-3", "release finalizer").await;
    let decisions = rec.decisions();
    let dead = decisions
        .iter()
        .find(|d| d.target.name == "cp-3" && d.decision.verdict == "allow")
        .expect("the dead member's removal decided");
    let fact = dead.decision.events[0]
        .facts
        .iter()
        .find(|f| f.name == "member.dead")
        .expect("member.dead among the facts");
    assert_eq!(fact.value, json!(true));
    let asked = dead
        .etcd
        .iter()
        .find(|a| a.fact == "member.dead")
        .expect("how member.dead was asked");
    assert_eq!(asked.value, 1);
    assert!(!asked.why.is_empty());
    let through: Vec<&step_records::Effect> = asked
        .asked
        .iter()
        .filter(|e| e.call == "EtcdMemberList" && e.result == "ok")
        .collect();
    assert!(
        through.iter().any(|e| {
            (e.node.contains("cp-1") || e.node.contains("cp-2"))
                && e.answer.as_deref().is_some_and(|a| a.contains("cp-3"))
        }),
        "a sibling's member list, naming cp-3: {asked:#?}"
    );
    assert!(dead.admission.is_none(), "no webhook saw this deletion");
    // What to look for in another process's webhook log: the object's life.
    assert!(
        dead.target.created.is_some() && dead.target.deleted.is_some(),
        "{dead:?}"
    );

    // 3. Replay: every decision (the webhook's and the controller's) reproduced; the steps
    // skipped, and said so.
    let text = rec.text();
    let (code, said) = replay(&rec.path);
    assert_eq!(code, Some(0), "{said}");
    let n_decisions = records::read_log(&text).expect("parses").len();
    let n_steps = rec.steps().len();
    assert!(n_steps >= 8, "{n_steps}");
    assert!(
        said.contains(&format!("{n_decisions} reproduced")),
        "{n_decisions} decisions: {said}"
    );
    assert!(
        said.contains(&format!("skipped {n_steps} controller step record(s)")),
        "{said}"
    );

    // 4. A refusal's condition names its rule and the decision's record; the refusal
    // decided again at every reconcile keeps that first citation (no rewrite, one Event).
    delete(&api, "TalosMachine", "cp-2").await;
    let cited = |m: &str| m.contains("(rule ") && m.contains("; decision ");
    let mut message = String::new();
    wait_for("cp-2 refused", WAIT, || {
        let m = get(&api, "TalosMachine", "cp-2")
            .and_then(|o| condition(&o, "Removal"))
            .filter(|c| c["reason"] == "RemovalRefused")
            .and_then(|c| c["message"].as_str().map(str::to_string));
        message = m.unwrap_or_default();
        cited(&message)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = get(&api, "TalosMachine", "cp-2")
        .and_then(|o| condition(&o, "Removal"))
        .and_then(|c| c["message"].as_str().map(str::to_string))
        .unwrap_or_default();
    assert_eq!(
        again, message,
        "the citation stays while the refusal stands"
    );
    assert_eq!(events(&api, "cp-2", "RemovalRefused").len(), 1);
    let id = message
        .rsplit_once("; decision ")
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .expect("a decision id");
    let rules: Vec<&str> = message
        .rsplit_once("(rule ")
        .and_then(|(_, rest)| rest.split_once(';'))
        .map(|(r, _)| r.split(", ").collect())
        .expect("the rules");
    let refusal = rec
        .decisions()
        .into_iter()
        .find(|d| d.decision.id == id)
        .unwrap_or_else(|| panic!("no record {id}:\n{}", rec.text()));
    assert_eq!(refusal.decision.verdict, "refuse");
    assert_eq!(refusal.target.name, "cp-2");
    assert_eq!(refusal.decision.deciding, rules, "{refusal:?}");
    let refusals = rec
        .decisions()
        .into_iter()
        .filter(|d| d.target.name == "cp-2" && d.decision.verdict == "refuse")
        .count();
    assert!(
        refusals >= 2,
        "each reconcile's decision is recorded: {refusals}"
    );
    let text = rec.text();

    // 5. No Secret's value, encoded or not, nor the credentials in it, is in the log.
    for needle in [encoded.as_str(), DECOY, talosconfig.as_str()] {
        assert!(!text.contains(needle), "a Secret's value in the log");
    }
    for line in talosconfig.lines().map(str::trim).filter(|l| l.len() > 24) {
        let value = line.split_once(": ").map_or(line, |(_, v)| v);
        assert!(
            value.len() < 24 || !text.contains(value),
            "a talosconfig line in the log: {line}"
        );
    }
}

/// An operation admitted by the webhook, then run by the controller: each step's decision
/// (the `step operation` rules, decided again before every step) is recorded and linked to
/// the admission of the operation's creation; each step that ran is recorded once done,
/// the reboot with the `actor_id` Talos gave it, and the wait for the node with its new
/// boot time. Replay reproduces every decision of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_is_recorded_step_by_step_with_the_new_boot_time() {
    let names = ["cp-1", "cp-2", "cp-3"];
    let talos = TalosApi::start(EtcdCluster::start_named(&names).await).await;
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in names.iter().enumerate() {
        add_machine(&api, &talos, n, i);
    }
    talos.node(1).set_downtime(Duration::from_millis(1500));
    let booted = talos.node(1).boot_time();
    let rec = Recording::start("operation", &api);
    let mut op = objects::operation("reboot-cp-2", "reboot").build();
    op["spec"]["machine"] = json!("cp-2");
    op["metadata"]["namespace"] = json!(NS);
    // As the API server does: the object is stamped (its uid, its creation time) before
    // the validating webhook is asked, which sees it so and keeps its uid.
    let stored = api.insert(op);
    let admitted = rec
        .admit(objects::review("req-create-reboot", "CREATE", None, Some(&stored)).build())
        .await;
    let _c = Running::start(rec.ctx(&api, &talos, "controller-1"));
    wait_for("the reboot succeeds", WAIT, || {
        get(&api, "TalosOperation", "reboot-cp-2")
            .is_some_and(|o| o["status"]["phase"] == "Succeeded")
    })
    .await;
    rec.step_done("reboot-cp-2", "uncordon node").await;

    let steps = rec.steps();
    let done = done_once(&steps, "reboot-cp-2");
    for must in ["cordon node", "drain node", "talos reboot", "uncordon node"] {
        assert!(
            done.iter().any(|s| s == must),
            "{must} not recorded: {done:?}"
        );
    }
    let decisions = rec.decisions();
    let ours: Vec<&ControllerRecord> = decisions
        .iter()
        .filter(|d| d.target.name == "reboot-cp-2")
        .collect();
    assert!(!ours.is_empty());
    for d in &ours {
        assert_eq!(d.target.kind, "TalosOperation");
        let link = d
            .admission
            .as_ref()
            .expect("linked to the creation's admission");
        assert_eq!(link.decision, admitted);
        assert_eq!(link.request_uid, "req-create-reboot");
        assert_eq!(link.operation, "CREATE");
        assert_eq!(
            Some(link.object_uid.as_str()),
            stored["metadata"]["uid"].as_str()
        );
    }
    // Each step that ran names a recorded decision of its own operation, taken before it.
    for s in steps.iter().filter(|s| s.target.name == "reboot-cp-2") {
        let id = s.decision.as_deref().expect("the decision it followed");
        let d = ours
            .iter()
            .find(|d| d.decision.id == id)
            .unwrap_or_else(|| panic!("{id} is not a recorded decision: {s:?}"));
        assert_eq!(d.decision.verdict, "allow");
        assert_eq!(d.decision.events[0].verb, "step", "{d:?}");
        assert!(d.decision.time <= s.time);
    }
    let reboot = steps
        .iter()
        .find(|s| s.target.name == "reboot-cp-2" && s.step.text == "talos reboot")
        .expect("the reboot step");
    let call = reboot
        .effects
        .iter()
        .find(|e| e.call == "Reboot")
        .expect("the Reboot call");
    assert_eq!(call.actor_id.as_deref(), Some("cp-2-reboot"), "{call:?}");
    assert_eq!(call.node, "TalosMachine cp-2");
    let back = steps
        .iter()
        .find(|s| {
            s.target.name == "reboot-cp-2"
                && s.step.text.starts_with("wait node-back")
                && s.result == "done"
        })
        .expect("the node back");
    let now_booted = talos.node(1).boot_time();
    assert!(now_booted > booted);
    assert_eq!(back.boot_time, Some(now_booted), "{back:?}");

    let (code, said) = replay(&rec.path);
    assert_eq!(code, Some(0), "{said}");
    let n_decisions = records::read_log(&rec.text()).expect("parses").len();
    assert!(
        said.contains(&format!("{n_decisions} reproduced")),
        "{n_decisions} decisions: {said}"
    );
}

/// The over-cap hold at the controller (outside any plan): its decision is recorded with
/// the machine as its target and verdict `hold`, the condition cites that decision (and
/// keeps citing it on later reconciles), and the decision that lifts the hold is recorded
/// too. The allow of a machine that was never held is not recorded at every reconcile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_outside_a_plan_is_recorded_and_cited() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 1));
    api.insert(control_plane("cp-a", 1));
    api.insert(control_plane("cp-b", 2));
    api.insert(control_plane("cp-c", 3));
    let talos = TalosApi::start(EtcdCluster::start_named(&["cp-a"]).await).await;
    let rec = Recording::start("hold", &api);
    let _c = Running::start(rec.ctx(&api, &talos, "controller-1"));
    wait_for("cp-c held", WAIT, || {
        cond(&api, "TalosMachine", "cp-c", "Ready")
            == Some(("False".into(), "ControlPlaneOverCap".into()))
    })
    .await;
    let message = |api: &ApiServer| {
        condition(&get(api, "TalosMachine", "cp-c").expect("cp-c"), "Ready").expect("Ready")
            ["message"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let first = message(&api);
    let id = first
        .rsplit_once("decision ")
        .map(|(_, id)| id.trim_end_matches(')').to_string())
        .unwrap_or_else(|| panic!("the hold cites no decision: {first}"));
    assert!(first.contains("rule over-cap"), "{first}");
    let held = |d: &&ControllerRecord| d.target.name == "cp-c" && d.decision.verdict == "hold";
    wait_for("the hold recorded", WAIT, || {
        rec.decisions()
            .iter()
            .any(|d| held(&d) && d.decision.id == id)
    })
    .await;
    // Later reconciles decide again (recorded) and cite the first decision still.
    wait_for("a second hold recorded", WAIT, || {
        rec.decisions().iter().filter(held).count() >= 2
    })
    .await;
    assert_eq!(message(&api), first);
    assert!(
        !rec.decisions().iter().any(|d| d.target.name == "cp-a"),
        "a machine never held is not recorded at every reconcile"
    );
    // Raising the count lifts the hold: that decision is recorded, allowing.
    patch_spec(
        &api,
        "TalosCluster",
        "prod",
        json!({"controlPlane": {"count": 3}}),
    )
    .await;
    wait_for("cp-c released", WAIT, || {
        cond(&api, "TalosMachine", "cp-c", "Ready").is_none()
    })
    .await;
    wait_for("the lift recorded", WAIT, || {
        rec.decisions()
            .iter()
            .any(|d| d.target.name == "cp-c" && d.decision.verdict == "allow")
    })
    .await;
    let (code, out) = replay(&rec.path);
    assert_eq!(code, Some(0), "{out}");
}

/// An operation parked while the control-plane count is even (a `hold run operation`
/// rule, outside any plan): the park is recorded with the operation as its target, its
/// `Paused` condition cites that decision, and the decision that ends the park is
/// recorded too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_operation_is_recorded_and_cited() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3", "cp-4"].iter().enumerate() {
        api.insert(control_plane(n, u32::try_from(i).expect("small")));
    }
    api.insert(operation("upgrade-1", "upgrade"));
    let talos = TalosApi::start(EtcdCluster::start_named(&["cp-1"]).await).await;
    let rec = Recording::start("park", &api);
    let _c = Running::start(rec.ctx(&api, &talos, "controller-1"));
    wait_for("upgrade parked", WAIT, || {
        cond(&api, "TalosOperation", "upgrade-1", "Paused")
            == Some(("True".into(), "ClusterTransitioning".into()))
    })
    .await;
    let op = get(&api, "TalosOperation", "upgrade-1").expect("op");
    let message = condition(&op, "Paused").expect("Paused")["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(message.contains("rule parked-for-transition"), "{message}");
    let id = message
        .rsplit_once("decision ")
        .map(|(_, id)| id.trim_end_matches(')').to_string())
        .unwrap_or_else(|| panic!("the park cites no decision: {message}"));
    wait_for("the park recorded", WAIT, || {
        rec.decisions().iter().any(|d| {
            d.decision.id == id
                && d.target.kind == "TalosOperation"
                && d.target.name == "upgrade-1"
                && d.decision.verdict == "hold"
        })
    })
    .await;
    patch_spec(&api, "TalosMachine", "cp-4", json!({"approved": false})).await;
    wait_for("the end of the park recorded", WAIT, || {
        rec.decisions()
            .iter()
            .any(|d| d.target.name == "upgrade-1" && d.decision.verdict == "allow")
    })
    .await;
    let (code, out) = replay(&rec.path);
    assert_eq!(code, Some(0), "{out}");
}

/// The webhook's side of the chart's two Deployments: its own recorder (its admissions),
/// and its metrics port over HTTPS with `/admissions`, tokens reviewed by the API server.
async fn webhook_port(
    api: &ApiServer,
    webhook: &Recording,
    dir: &Path,
) -> (
    std::net::SocketAddr,
    rustls::pki_types::CertificateDer<'static>,
) {
    use ichor_rules::runtime::metrics_auth::{Access, Reviewer, metrics_router};
    let ca = crate::support::https::write_cert(dir);
    let cert = Arc::new(
        ichor_rules::runtime::tls::ReloadingCert::new(dir.join("tls.crt"), dir.join("tls.key"))
            .expect("the certificate"),
    );
    let tls = Arc::new(cert.server_config().expect("a TLS configuration"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let metrics = Arc::new(Metrics::default());
    let app = metrics_router(
        metrics.clone(),
        Access::Reviewed(Box::new(Reviewer::new(api.client()))),
        true,
        Some(webhook.recorder.clone()),
    );
    tokio::spawn(ichor_rules::runtime::server::serve_tls_with(
        listener,
        tls,
        app,
        ichor_rules::runtime::server::Limits::default(),
        metrics,
        std::future::pending(),
    ));
    (addr, ca)
}

/// The metadata of a stored object, as the controller reads it, being deleted now.
fn deleting_meta(obj: &Value) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    let mut meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
        serde_json::from_value(obj["metadata"].clone()).expect("metadata");
    meta.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    meta
}

/// The chart's two Deployments: the webhook decides in one process and keeps its
/// admissions, the controller runs in another (its own recorder: nothing kept in its
/// process) and asks the webhook's `/admissions` over HTTPS with its token. The removal's
/// decision and every step record carry the webhook's decision id and request uid. The
/// endpoint answers no token 401, a user without `get` on `/admissions` 403 and a bad
/// query 400; a controller without the permission records `admission_lookup: forbidden`
/// and no `admission`, and counts it; an earlier same-named object's admission is not
/// taken for a new one's deletion. A DELETE review forged beside the real one (a made-up
/// user, within the second) is answered beside it and neither is linked (`ambiguous`);
/// the real one alone is linked, but not by a controller that never loaded its rules
/// (`digest-unknown`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_in_another_process_links_to_the_webhooks_admission() {
    use crate::metrics_auth::{client_config, get as get_url};
    use ichor_rules::runtime::admission_link::{Linked, Lookup, LookupConfig};
    const CONTROLLER: &str = "system:serviceaccount:ichor-system:ichor-rules-controller";
    let names = ["cp-1", "cp-2", "cp-3", "cp-4"];
    let talos = TalosApi::start(EtcdCluster::start_named(&names).await).await;
    let api = ApiServer::start().await;
    api.add_service_account_token("tok-controller", "ichor-system", "ichor-rules-controller");
    api.add_service_account_token("tok-app", "shop", "frontend");
    api.allow_non_resource(CONTROLLER, "get", "/admissions");
    let encoded = base64::engine::general_purpose::STANDARD.encode(talos.talosconfig_yaml());
    api.insert(
        objects::cluster("prod", 3)
            .namespace(NS)
            .schedulable("true")
            .secret(json!({"name": "prod-talos", "key": "talosconfig"}))
            .build(),
    );
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-talos", "namespace": NS},
        "type": "Opaque",
        "data": {"talosconfig": encoded}
    }));
    for (i, n) in names.iter().enumerate() {
        add_machine(&api, &talos, n, i);
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("admission-link-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let webhook = Recording::start("split-webhook", &api);
    let (addr, ca) = webhook_port(&api, &webhook, &dir).await;
    let token = dir.join("token");
    std::fs::write(&token, "tok-controller\n").expect("token");
    let lookup_config = |token: PathBuf| LookupConfig {
        url: format!("https://127.0.0.1:{}/admissions", addr.port()),
        ca: dir.join("tls.crt"),
        peers: None,
        token,
        timeout: Duration::from_secs(3),
    };
    let metrics = Arc::new(Metrics::default());
    let lookup =
        Arc::new(Lookup::new(lookup_config(token.clone()), metrics.clone()).expect("lookup"));
    let controller = Recording::start("split-controller", &api);
    let ctx = Arc::new(
        Context::new(
            api.client(),
            rules(),
            Some(Arc::new(talos.tls())),
            fast_settings("controller-1"),
            metrics.clone(),
        )
        .with_records(controller.recorder.clone())
        .with_admission_lookup(lookup.clone()),
    );
    let _c = Running::start(ctx);
    wait_for("finalizers", WAIT, || {
        names.iter().all(|n| has_finalizer(&api, n))
    })
    .await;

    // 1. The webhook allows cp-4's deletion; its port answers it to the controller only.
    let stored = get(&api, "TalosMachine", "cp-4").expect("cp-4");
    let admitted = webhook
        .admit(objects::review("req-delete-cp-4", "DELETE", Some(&stored), None).build())
        .await;
    let tls = client_config(Some(&ca));
    let query = "/admissions?kind=TalosMachine&namespace=infra&name=cp-4&operation=DELETE";
    let (code, _) = get_url(addr, Some(&tls), query, None).await.expect("get");
    assert_eq!(code, 401, "no token");
    let (code, body) = get_url(addr, Some(&tls), query, Some("tok-app"))
        .await
        .expect("get");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("may not get /admissions"), "{body}");
    let (code, body) = get_url(
        addr,
        Some(&tls),
        "/admissions?kind=Secret&namespace=infra&name=cp-4&operation=DELETE",
        Some("tok-controller"),
    )
    .await
    .expect("get");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("no admission of Secret"), "{body}");
    let (code, body) = get_url(addr, Some(&tls), query, Some("tok-controller"))
        .await
        .expect("get");
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        answer["admissions"][0]["decision"],
        json!(admitted),
        "{body}"
    );
    assert_eq!(answer["admissions"][0]["request_uid"], "req-delete-cp-4");
    assert_eq!(
        answer["admissions"][0]["object_uid"], stored["metadata"]["uid"],
        "{body}"
    );
    // The webhook's metrics never name what a caller asked.
    let (_, scraped) = get_url(addr, Some(&tls), "/metrics", Some("tok-controller"))
        .await
        .expect("get");
    assert!(
        !scraped.contains("cp-4") && !scraped.contains("Secret"),
        "{scraped}"
    );

    // 1b. Without `--client-ca` anyone reaching the port can post a DELETE review: one of
    // cp-3's, with a made-up user, right after the real one. The webhook answers both, and
    // the controller links neither, whichever it would have taken.
    let known = rules().loaded_digests();
    assert_eq!(known.len(), 1);
    // (A lookup of its own: the controller's caches what it is asked.)
    let probe =
        Lookup::new(lookup_config(token.clone()), Arc::new(Metrics::default())).expect("lookup");
    let cp3 = get(&api, "TalosMachine", "cp-3").expect("cp-3");
    let real = webhook
        .admit(objects::review("req-delete-cp-3", "DELETE", Some(&cp3), None).build())
        .await;
    let forged = webhook
        .admit(
            objects::review("req-forged", "DELETE", Some(&cp3), None)
                .authenticated_user("mallory")
                .build(),
        )
        .await;
    let (code, body) = get_url(
        addr,
        Some(&tls),
        "/admissions?kind=TalosMachine&namespace=infra&name=cp-3&operation=DELETE",
        Some("tok-controller"),
    )
    .await
    .expect("get");
    assert_eq!(code, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("JSON");
    let answered: Vec<&Value> = answer["admissions"]
        .as_array()
        .expect("admissions")
        .iter()
        .map(|a| &a["decision"])
        .collect();
    assert_eq!(answered, vec![&json!(real), &json!(forged)], "{body}");
    let cp3_deleting = deleting_meta(&cp3);
    assert_eq!(
        probe
            .find("TalosMachine", &cp3_deleting, "DELETE", &known)
            .await,
        Linked {
            admission: None,
            why: Some("ambiguous")
        }
    );
    // The real one alone (no forged review) links; under rules this controller never
    // loaded (a well-formed digest it does not know), it does not.
    let cp1 = get(&api, "TalosMachine", "cp-1").expect("cp-1");
    let alone = webhook
        .admit(objects::review("req-delete-cp-1", "DELETE", Some(&cp1), None).build())
        .await;
    let cp1_deleting = deleting_meta(&cp1);
    let unknown = vec![format!("sha256:{}", "0".repeat(64))];
    let other_rules =
        Lookup::new(lookup_config(token.clone()), Arc::new(Metrics::default())).expect("lookup");
    assert_eq!(
        other_rules
            .find("TalosMachine", &cp1_deleting, "DELETE", &unknown)
            .await,
        Linked {
            admission: None,
            why: Some("digest-unknown")
        }
    );
    let linked = probe
        .find("TalosMachine", &cp1_deleting, "DELETE", &known)
        .await;
    assert_eq!(linked.admission.map(|a| a.decision), Some(alone));

    // 2. The controller, in its own process, links every record of the removal to it.
    delete(&api, "TalosMachine", "cp-4").await;
    controller.step_done("cp-4", "release finalizer").await;
    assert!(
        webhook.steps().is_empty(),
        "the webhook's log holds no step"
    );
    let decisions = controller.decisions();
    let d = decisions
        .iter()
        .find(|d| d.target.name == "cp-4" && d.decision.verdict == "allow")
        .expect("the removal decided");
    let link = d.admission.as_ref().expect("linked across processes");
    assert_eq!(link.decision, admitted);
    assert_eq!(link.request_uid, "req-delete-cp-4");
    assert_eq!(link.operation, "DELETE");
    assert_eq!(link.digest, d.decision.rules.digest);
    assert_eq!(d.admission_lookup, None);
    let steps: Vec<StepRecord> = controller
        .steps()
        .into_iter()
        .filter(|s| s.target.name == "cp-4")
        .collect();
    assert!(
        steps.iter().any(|s| s.step.text == "talos reset"),
        "{steps:#?}"
    );
    for s in &steps {
        assert_eq!(s.admission.as_ref(), Some(link), "{s:?}");
        assert_eq!(s.admission_lookup, None, "{s:?}");
    }

    // 3. A new cp-4, deleted: the webhook still keeps the first one's admission, of
    // another uid (and decided before this object existed); it is not taken for this one.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mut again = stored.clone();
    again["metadata"]["uid"] = json!("uid-of-the-second-cp-4");
    again["metadata"]["creationTimestamp"] = json!(
        k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .expect("round")
            .to_string()
    );
    let second = deleting_meta(&again);
    let linked = lookup
        .find("TalosMachine", &second, "DELETE", &rules().loaded_digests())
        .await;
    assert_eq!(
        linked,
        Linked {
            admission: None,
            why: Some("uid-mismatch")
        }
    );
    // The first cp-4 itself still links (the same answer, checked the same way).
    let first = deleting_meta(&stored);
    let linked = lookup
        .find("TalosMachine", &first, "DELETE", &rules().loaded_digests())
        .await;
    assert_eq!(linked.admission.map(|a| a.decision), Some(admitted.clone()));

    // 4. Without the permission: 403, no link, the record says why, and it is counted.
    std::fs::write(&token, "tok-app\n").expect("token");
    let fresh =
        Lookup::new(lookup_config(token.clone()), Arc::new(Metrics::default())).expect("lookup");
    assert_eq!(
        fresh
            .find("TalosMachine", &first, "DELETE", &rules().loaded_digests())
            .await,
        Linked {
            admission: None,
            why: Some("forbidden")
        }
    );
    delete(&api, "TalosMachine", "cp-3").await;
    let mut refused = None;
    wait_for("cp-3's removal decided", WAIT, || {
        refused = controller
            .decisions()
            .into_iter()
            .find(|d| d.target.name == "cp-3");
        refused.is_some()
    })
    .await;
    let refused = refused.expect("decided");
    assert_eq!(refused.admission, None, "{refused:?}");
    assert_eq!(
        refused.admission_lookup.as_deref(),
        Some("forbidden"),
        "{refused:?}"
    );
    let text = controller.text();
    assert!(
        text.contains("\"admission_lookup\":\"forbidden\""),
        "{text}"
    );
    let rendered = metrics.render();
    let failed: u64 = rendered
        .lines()
        .find_map(|l| {
            l.strip_prefix("ichor_rules_admission_lookup_failures_total{reason=\"forbidden\"} ")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(failed >= 1, "{rendered}");
    assert!(
        !rendered.contains("admission_lookup_failures_total{reason=\"not-"),
        "finding none is no failure: {rendered}"
    );
}
