//! Issue 37, the controller applies: approved machines the rules let through get the
//! configuration rendered from the cluster's base Secret and the patches that select them,
//! through `ApplyConfiguration` (a dry run first) on Talos stand-ins backed by a real etcd;
//! an unrelated patch reaches exactly the machines it selects; a change that needs a reboot
//! is staged, not rebooted all at once; an over-cap held machine receives nothing.

use crate::support::apiserver::ApiServer;
use crate::support::controller::*;
use crate::support::etcd::EtcdCluster;
use crate::support::talos::TalosApi;
use base64::Engine as _;
use ichor_rules::runtime::controller::Context;
use ichor_rules::runtime::metrics::Metrics;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const CP: &str = include_str!("fixtures/talos/controlplane.yaml");
const WORKER: &str = include_str!("fixtures/talos/worker.yaml");
const WAIT: Duration = Duration::from_secs(30);

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Control planes cp-1..cp-3 on stand-ins with a real etcd, in a cluster declaring `count`,
/// with the base Secret and the controller running.
async fn start(count: i64) -> (ApiServer, TalosApi, Ctl) {
    start_with(count, |_| {}).await
}

/// The controller of a test, its steps logged (`serve --step-log`): the log is checked
/// against the executor (`verify --check-trace`) when the controller is killed or the test
/// ends.
struct Ctl {
    running: Option<Running>,
    log: std::path::PathBuf,
}

impl Ctl {
    async fn kill(mut self) {
        if let Some(r) = self.running.take() {
            r.kill().await;
        }
        self.check();
    }

    /// The log as written so far (whole lines: a reconcile cut short is a controller
    /// stopped there).
    fn text(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        match text.rfind('\n') {
            Some(end) => text[..=end].to_string(),
            None => String::new(),
        }
    }

    fn check(&self) {
        let text = self.text();
        if text.is_empty() {
            return;
        }
        let (code, said) = check_step_log_text("config-as-written", &text);
        assert_eq!(
            code,
            Some(0),
            "the step log {} is not a behaviour of the model:\n{said}",
            self.log.display()
        );
    }
}

impl Drop for Ctl {
    fn drop(&mut self) {
        if self.running.take().is_some() && !std::thread::panicking() {
            self.check();
        }
    }
}

/// [`start`], with `before` done to the stand-ins before the controller starts.
async fn start_with(count: i64, before: impl FnOnce(&TalosApi)) -> (ApiServer, TalosApi, Ctl) {
    let talos = TalosApi::start(EtcdCluster::start(3).await).await;
    before(&talos);
    let api = ApiServer::start().await;
    let mut c = cluster("prod", count);
    c["spec"]["baseConfigSecretRef"] = json!({"name": "prod-base"});
    api.insert(c);
    api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "prod-base", "namespace": NS},
        "type": "Opaque",
        "data": {"controlplane.yaml": b64(CP), "worker.yaml": b64(WORKER)}
    }));
    for i in 0..3 {
        let name = format!("cp-{}", i + 1);
        let mut m = control_plane(&name, u32::try_from(i).unwrap() + 1);
        m["spec"]["endpoint"] = json!(talos.node(i).endpoint());
        api.insert(m);
        api.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }));
        talos.node(i).set_downtime(Duration::from_millis(800));
    }
    let log = step_log_path("config-controller");
    let ctx = context_logged(&api, "controller-0", Some(Arc::new(talos.tls())), &log);
    let running = Running::start(ctx);
    (
        api,
        talos,
        Ctl {
            running: Some(running),
            log,
        },
    )
}

/// The `apply` reconciles of machine `name` in a step log, in order: each one's lines
/// without its number and the times it asked, and whether it acted (an
/// `ApplyConfiguration` or an event).
fn apply_reconciles(log: &str, name: &str) -> Vec<(String, bool)> {
    let mut open: std::collections::BTreeMap<u64, (Vec<Value>, bool)> = Default::default();
    let mut done = Vec::new();
    for line in log.lines() {
        let Ok(mut v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(n) = v["reconcile"].as_u64() else {
            continue;
        };
        let op = v["op"].as_str().unwrap_or_default().to_string();
        if op == "begin" {
            if v["procedure"] == "apply" && v["object"]["machine"]["metadata"]["name"] == name {
                open.insert(n, (Vec::new(), false));
            } else {
                continue;
            }
        }
        let Some((lines, acted)) = open.get_mut(&n) else {
            continue;
        };
        *acted |= op == "apply_configuration" || op == "event";
        if op == "now" {
            continue;
        }
        if let Some(o) = v.as_object_mut() {
            o.remove("reconcile");
        }
        lines.push(v);
        if op == "end"
            && let Some((lines, acted)) = open.remove(&n)
        {
            done.push((Value::Array(lines).to_string(), acted));
        }
    }
    done
}

fn applied(api: &ApiServer, name: &str) -> Option<String> {
    get(api, "TalosMachine", name)?["status"]["config"]["appliedHash"]
        .as_str()
        .map(str::to_string)
}

fn sha(text: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn patch(name: &str, selector: Value, strategic: &str) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosConfigPatch",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterRef": {"name": "prod"}, "selector": selector,
                 "patches": {"strategic": strategic}}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_machines_get_their_configuration_and_a_patch_reaches_exactly_its_machines() {
    let (api, talos, ctl) = start(3).await;
    wait_for("every control plane configured", WAIT, || {
        (0..3).all(|i| {
            let name = format!("cp-{}", i + 1);
            talos
                .node(i)
                .config()
                .is_some_and(|c| applied(&api, &name) == Some(sha(&c)))
        })
    })
    .await;
    for i in 0..3 {
        let name = format!("cp-{}", i + 1);
        let config = talos.node(i).config().unwrap();
        assert!(
            config.contains(&format!("hostname: {name}")),
            "its identity: {config}"
        );
        assert_eq!(
            cond(&api, "TalosMachine", &name, "Configured"),
            Some(("True".into(), "Applied".into()))
        );
        // Ready follows: what was applied (with Talos' dry-run answer) and since when.
        assert_eq!(
            cond(&api, "TalosMachine", &name, "Ready"),
            Some(("True".into(), "Configured".into()))
        );
        let m = get(&api, "TalosMachine", &name).unwrap();
        let ready = condition(&m, "Ready").unwrap()["message"].to_string();
        let hash = applied(&api, &name).unwrap();
        assert!(
            ready.contains(&hash[..12])
                && ready.contains("Talos' dry run: it applies without a reboot")
                && ready.contains("(since 20"),
            "{ready}"
        );
        // A dry run before the apply, and the configuration itself in no status.
        assert!(talos.calls_to("ApplyConfiguration", &name) >= 2);
        let status = get(&api, "TalosMachine", &name).unwrap()["status"].to_string();
        assert!(!status.contains("SECRET-BASE"), "{status}");
    }
    let before: Vec<String> = (0..3).map(|i| talos.node(i).config().unwrap()).collect();
    // An unrelated patch for cp-2 alone.
    api.insert(patch(
        "sysctl",
        json!({"machines": ["cp-2"]}),
        "version: v1alpha1\nmachine:\n  sysctls:\n    vm.max_map_count: \"262144\"\n",
    ));
    wait_for("cp-2 gets the patch", WAIT, || {
        talos.node(1).config().is_some_and(|c| {
            c.contains("vm.max_map_count") && applied(&api, "cp-2") == Some(sha(&c))
        })
    })
    .await;
    // A few more reconciles of the others: nothing changes for them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(talos.node(0).config().unwrap(), before[0]);
    assert_eq!(talos.node(2).config().unwrap(), before[2]);
    // Each probe (500 ms apart) reconciled cp-1's configuration again, but the step log
    // holds no quiet reconcile twice in a row: the repeats are not logged.
    let logged = apply_reconciles(&ctl.text(), "cp-1");
    let probes = talos.calls_to("Version", "cp-1");
    assert!(
        !logged.is_empty() && logged.len() < probes,
        "{} apply reconciles of cp-1 logged for {probes} probes",
        logged.len(),
    );
    for pair in logged.windows(2) {
        assert!(
            pair[0].1 || pair[1].1 || pair[0].0 != pair[1].0,
            "a quiet repeat logged twice: {}",
            pair[1].0
        );
    }
    assert_eq!(
        talos.node(0).reboots() + talos.node(1).reboots() + talos.node(2).reboots(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_that_breaks_the_render_is_said_and_nothing_is_applied() {
    let (api, talos, _running) = start(3).await;
    wait_for("configured", WAIT, || applied(&api, "cp-1").is_some()).await;
    let calls = talos.calls_to("ApplyConfiguration", "cp-1");
    // Written past the webhook (the in-process API server has none): the controller
    // renders, fails, and says Talos' words; nothing is sent.
    api.insert(patch(
        "api",
        json!({"machines": ["cp-1"]}),
        "version: v1alpha1\ncluster:\n  apiServer:\n    image: x\n",
    ));
    wait_for("RenderFailed", WAIT, || {
        cond(&api, "TalosMachine", "cp-1", "Configured")
            == Some(("False".into(), "RenderFailed".into()))
    })
    .await;
    let m = get(&api, "TalosMachine", "cp-1").unwrap();
    let msg = condition(&m, "Configured").unwrap()["message"].to_string();
    assert!(
        msg.contains(
            "kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)"
        ),
        "{msg}"
    );
    assert_eq!(talos.calls_to("ApplyConfiguration", "cp-1"), calls);
}

/// One node whose Talos refuses the configuration while the others take it: the others
/// are applied; the refused one says Talos' words in `Configured` and `Ready` (False,
/// `DryRunRefused`), gets nothing, and is tried again until Talos takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_talos_refuses_is_said_and_retried_while_the_others_apply() {
    let (api, talos, _running) = start(3).await;
    wait_for("every control plane configured", WAIT, || {
        (1..=3).all(|i| applied(&api, &format!("cp-{i}")).is_some())
    })
    .await;
    let words = "unknown keys found during decoding: machine.frobnicate (a Talos of its own)";
    talos.node(1).refuse_configs(Some(words));
    let refused_before = talos.node(1).config();
    api.insert(patch(
        "sysctl",
        json!({"role": "controlplane"}),
        "version: v1alpha1\nmachine:\n  sysctls:\n    vm.max_map_count: \"262144\"\n",
    ));
    wait_for("cp-1 and cp-3 apply it, cp-2 says why not", WAIT, || {
        [0, 2].iter().all(|&i| {
            talos.node(i).config().is_some_and(|c| {
                c.contains("vm.max_map_count")
                    && applied(&api, &format!("cp-{}", i + 1)) == Some(sha(&c))
            })
        }) && cond(&api, "TalosMachine", "cp-2", "Configured")
            == Some(("False".into(), "DryRunRefused".into()))
    })
    .await;
    let m = get(&api, "TalosMachine", "cp-2").unwrap();
    let configured = condition(&m, "Configured").unwrap()["message"].to_string();
    assert!(configured.contains("machine.frobnicate"), "{configured}");
    assert_eq!(
        cond(&api, "TalosMachine", "cp-2", "Ready"),
        Some(("False".into(), "DryRunRefused".into()))
    );
    // Nothing reached cp-2's node; its old configuration is still the one recorded.
    assert_eq!(talos.node(1).config(), refused_before);
    assert_eq!(applied(&api, "cp-2"), refused_before.as_deref().map(sha));
    // Talos takes it again: cp-2 is applied at its next try (a backoff of 5 s at first).
    talos.node(1).refuse_configs(None);
    wait_for("cp-2 applied after all", WAIT, || {
        talos.node(1).config().is_some_and(|c| {
            c.contains("vm.max_map_count") && applied(&api, "cp-2") == Some(sha(&c))
        }) && cond(&api, "TalosMachine", "cp-2", "Ready")
            == Some(("True".into(), "Configured".into()))
    })
    .await;
}

/// ADR 0054: a control plane held over the cap gets nothing applied.
/// Waits (up to a minute) until the first TalosOperation of the namespace succeeded.
async fn first_roll_succeeds(api: &ApiServer, what: &str) {
    wait_for(what, Duration::from_secs(60), || {
        api.objects("TalosOperation", Some(NS))
            .first()
            .is_some_and(|o| o["status"]["phase"] == "Succeeded")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_cap_held_machine_receives_nothing() {
    // count 1: cp-1 and cp-2 (count + 1) go on, cp-3 (the newest) is held.
    let (api, talos, _running) = start(1).await;
    wait_for("cp-3 held", WAIT, || {
        cond(&api, "TalosMachine", "cp-3", "Ready").is_some_and(|(s, _)| s == "False")
    })
    .await;
    wait_for("the others configured", WAIT, || {
        applied(&api, "cp-1").is_some() && applied(&api, "cp-2").is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(talos.calls_to("ApplyConfiguration", "cp-3"), 0);
    assert!(talos.node(2).config().is_none());
    assert!(applied(&api, "cp-3").is_none());
    // A change needing a reboot rolls over the machines that get configuration: the held
    // one, which never renders anything, does not keep the roll waiting (it did: the roll
    // waited for every approved machine to render the change).
    api.insert(patch(
        "disk",
        json!({}),
        "version: v1alpha1\nmachine:\n  install:\n    disk: /dev/sdb\n",
    ));
    let rolls = || api.objects("TalosOperation", Some(NS));
    first_roll_succeeds(&api, "the controller's roll of cp-1 and cp-2 succeeds").await;
    assert_eq!(rolls()[0]["spec"]["machines"], json!(["cp-1", "cp-2"]));
    assert_eq!(talos.calls_to("ApplyConfiguration", "cp-3"), 0);
    assert!(talos.node(2).config().is_none());
}

/// A change that needs a reboot is staged on every node (nothing rebooted by the apply
/// itself), then the controller creates a `reboot` TalosOperation naming the staged
/// machines, which the operations' machinery rolls one node at a time under its gates;
/// each node boots into the staged configuration, and the controller records it applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_needing_a_reboot_is_staged_then_rolled_one_node_at_a_time() {
    let (api, talos, _running) = start(3).await;
    wait_for("configured", WAIT, || {
        (1..=3).all(|i| applied(&api, &format!("cp-{i}")).is_some())
    })
    .await;
    api.insert(patch(
        "disk",
        json!({}),
        "version: v1alpha1\nmachine:\n  install:\n    disk: /dev/sdb\n",
    ));
    // The staging of every node precedes any reboot: the apply itself reboots nothing.
    wait_for("staged everywhere", WAIT, || {
        (0..3).all(|i| talos.node(i).staged_config().is_some())
    })
    .await;
    let rolls = || api.objects("TalosOperation", Some(NS));
    first_roll_succeeds(&api, "the controller's roll succeeds").await;
    let roll = rolls().remove(0);
    assert!(
        roll["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("prod-config-"),
        "{roll}"
    );
    assert_eq!(
        roll["metadata"]["labels"]["ichor.maesh.dev/configuration-roll"],
        "true"
    );
    assert_eq!(roll["spec"]["kind"], "reboot");
    assert_eq!(roll["spec"]["machines"], json!(["cp-1", "cp-2", "cp-3"]));
    assert_eq!(events(&api, "prod", "ConfigurationRollStarted").len(), 1);
    wait_for("applied everywhere after the reboots", WAIT, || {
        (0..3).all(|i| {
            let name = format!("cp-{}", i + 1);
            talos.node(i).config().is_some_and(|c| {
                c.contains("disk: /dev/sdb") && applied(&api, &name) == Some(sha(&c))
            }) && cond(&api, "TalosMachine", &name, "Configured")
                == Some(("True".into(), "Applied".into()))
        })
    })
    .await;
    let downs = talos.downtimes();
    let order: Vec<&str> = downs.iter().map(|d| d.node.as_str()).collect();
    assert_eq!(order, ["cp-1", "cp-2", "cp-3"], "one at a time, in order");
    for d in &downs {
        let overlapping = downs
            .iter()
            .filter(|o| o.from <= d.from && o.to.is_none_or(|t| t > d.from))
            .count();
        assert_eq!(overlapping, 1, "{downs:?}");
    }
    // Applied everywhere: no other roll, no other reboot.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(rolls().len(), 1);
    assert_eq!(talos.downtimes().len(), 3);
}

/// A TalosConfigPatch written, and a change of the base Secret, re-render and re-apply the
/// cluster's machines at once: the controller watches patches, and publishes the base's new
/// digest (read again every `base_recheck`), which its machines' watch follows. Probes are
/// slowed to a minute here, so nothing but those watches can explain a prompt apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_written_patch_and_a_changed_base_are_applied_without_waiting_for_a_probe() {
    let (api, talos, running) = start(3).await;
    running.kill().await;
    let mut settings = fast_settings("controller-slow");
    settings.probe_interval = Duration::from_secs(60);
    let ctx = Arc::new(Context::new(
        api.client(),
        rules(),
        Some(Arc::new(talos.tls())),
        settings,
        Arc::new(Metrics::default()),
    ));
    let _slow = Running::start(ctx);
    wait_for("every control plane configured", WAIT, || {
        (0..3).all(|i| {
            let name = format!("cp-{}", i + 1);
            talos
                .node(i)
                .config()
                .is_some_and(|c| applied(&api, &name) == Some(sha(&c)))
        })
    })
    .await;
    // Let the first reconciles settle: from here on, only a watch brings a machine back
    // before a minute.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    api.insert(patch(
        "sysctl",
        json!({"machines": ["cp-2"]}),
        "version: v1alpha1\nmachine:\n  sysctls:\n    vm.max_map_count: \"262144\"\n",
    ));
    wait_for("cp-2 gets the patch", Duration::from_secs(15), || {
        talos.node(1).config().is_some_and(|c| {
            c.contains("vm.max_map_count") && applied(&api, "cp-2") == Some(sha(&c))
        })
    })
    .await;
    assert!(!talos.node(0).config().unwrap().contains("vm.max_map_count"));
    // The base Secret changes (a new kubelet image): every control plane gets it.
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(api.test_client(), NS);
    let changed = CP.replace("kubelet:v1.35.0", "kubelet:v1.35.1");
    secrets
        .patch(
            "prod-base",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"data": {"controlplane.yaml": b64(&changed)}})),
        )
        .await
        .unwrap();
    wait_for("the new base everywhere", Duration::from_secs(15), || {
        (0..3).all(|i| {
            let name = format!("cp-{}", i + 1);
            talos.node(i).config().is_some_and(|c| {
                c.contains("kubelet:v1.35.1") && applied(&api, &name) == Some(sha(&c))
            })
        })
    })
    .await;
    // cp-2 keeps its patch on the new base.
    assert!(talos.node(1).config().unwrap().contains("vm.max_map_count"));
    assert_eq!(talos.downtimes().len(), 0);
}

/// A node in Talos' maintenance mode (not configured yet) does not answer the cluster's
/// mTLS client; the controller finds it on the maintenance API, gives it its first
/// configuration there (`talosctl apply-config --insecure`), and talks mTLS to it once it
/// rebooted into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_in_maintenance_mode_gets_its_first_configuration_over_the_maintenance_api() {
    use ichor_rules::runtime::talos::TalosClient;
    let (api, talos, _running) = start_with(3, |t| t.node(2).maintenance()).await;
    let maintenance = |i: usize| {
        TalosClient::maintenance(&talos.node(i).endpoint(), Duration::from_secs(3)).unwrap()
    };
    // What the stand-in does, as Talos: a configured node refuses a client without a
    // certificate; a node in maintenance serves one, and only a few calls.
    assert!(maintenance(0).version().await.is_err());
    wait_for("cp-3 configured over the maintenance API", WAIT, || {
        cond(&api, "TalosMachine", "cp-3", "Configured") == Some(("True".into(), "Applied".into()))
    })
    .await;
    let m = get(&api, "TalosMachine", "cp-3").unwrap();
    let msg = condition(&m, "Configured").unwrap()["message"].to_string();
    assert!(msg.contains("over the maintenance API"), "{msg}");
    assert!(!talos.node(2).in_maintenance());
    let config = talos.node(2).config().unwrap();
    assert!(config.contains("hostname: cp-3"), "{config}");
    assert_eq!(applied(&api, "cp-3"), Some(sha(&config)));
    // It rebooted into it, and answers the cluster's mTLS client from then on.
    wait_for("cp-3 back on mTLS", WAIT, || {
        !talos.node(2).is_down()
            && get(&api, "TalosMachine", "cp-3")
                .is_some_and(|m| condition(&m, "Maintenance").is_none())
    })
    .await;
    assert_eq!(talos.node(2).reboots(), 1);
    talos.client(2).version().await.unwrap();
    assert!(maintenance(2).version().await.is_err());
    // Its configuration is not applied again.
    let applies = talos.calls_to("ApplyConfiguration", "cp-3");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(talos.calls_to("ApplyConfiguration", "cp-3"), applies);
}

/// The apply procedure's step log (`verify --check-trace`, procedure `apply`): the
/// controller's own log replays as written, shows no secret of the base, and the same log
/// with Talos' dry-run answer changed (a reboot needed where Talos said none) is not a
/// behaviour: the executor would have staged it, and the checker says where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apply_step_log_replays_and_a_changed_dry_run_answer_is_refuted() {
    let (api, talos, ctl) = start(3).await;
    wait_for("every control plane configured", WAIT, || {
        (0..3).all(|i| {
            let name = format!("cp-{}", i + 1);
            talos
                .node(i)
                .config()
                .is_some_and(|c| applied(&api, &name) == Some(sha(&c)))
        })
    })
    .await;
    let text = ctl.text();
    ctl.kill().await;
    for op in [
        "\"procedure\":\"apply\"",
        "\"op\":\"base\"",
        "\"op\":\"patches\"",
        "\"op\":\"render\"",
        "\"op\":\"apply_configuration\"",
        "\"procedure\":\"bootstrap\"",
        "\"op\":\"record_bootstrap\"",
    ] {
        assert!(text.contains(op), "the log records {op}");
    }
    assert!(!text.contains("SECRET-BASE"), "the step log shows the base");
    let (code, said) = check_step_log_text("apply-as-written", &text);
    assert_eq!(code, Some(0), "{said}");
    // The first apply's (`dry`: its dry run's) answer, changed.
    let tamper_apply = |dry: bool, change: &dyn Fn(&mut Value)| -> String {
        let mut done = false;
        let which = format!("\"dry_run\":{dry}");
        text.lines()
            .map(|l| {
                if done || !l.contains(&which) {
                    return l.to_string();
                }
                done = true;
                let mut v: Value = serde_json::from_str(l).expect("a JSON line");
                change(&mut v);
                v.to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let tamper = |change: &dyn Fn(&mut Value)| tamper_apply(true, change);
    let reboot = tamper(&|v| v["answer"]["Ok"]["Ok"]["mode"] = json!("Reboot"));
    assert_ne!(reboot, text);
    let (code, said) = check_step_log_text("apply-reboot", &reboot);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("apply mode"), "{said}");
    // Talos refused the dry run: the executor applies nothing, the run applied.
    let refused = tamper(&|v| v["answer"] = json!({"Ok": {"Err": {"Talos": "refused"}}}));
    let (code, said) = check_step_log_text("apply-refused", &refused);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("line "), "{said}");
    // Talos said otherwise when it applied: the status the executor leaves (its condition
    // quotes Talos) is not the one the run left.
    let other = tamper_apply(false, &|v| {
        v["answer"]["Ok"]["Ok"]["details"] = json!("Applied, said otherwise")
    });
    let (code, said) = check_step_log_text("apply-details", &other);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("left the status"), "{said}");
}

/// ADR 0106 §1 from the webhook to the nodes: the controller publishes the redacted base
/// and configures the control planes; the webhook (real AdmissionReviews over HTTPS,
/// reading the same API server live) refuses the seed's patch with Talos' words, and lets
/// an unrelated one in, which the controller then applies to exactly the machine it
/// selects, without a reboot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_goes_from_the_webhook_to_the_nodes_it_selects() {
    use crate::config_admission::{
        API_SERVER_PATCH, SEED_ERROR, UNRELATED, harness_on, message, patch as review_patch, review,
    };
    let (api, talos, _running) = start(3).await;
    wait_for(
        "the base published and every control plane configured",
        WAIT,
        || {
            get(&api, "TalosCluster", "prod")
                .is_some_and(|c| !c["status"]["redactedBase"].is_null())
                && (1..=3).all(|i| applied(&api, &format!("cp-{i}")).is_some())
        },
    )
    .await;
    let before: Vec<String> = (0..3).map(|i| talos.node(i).config().unwrap()).collect();
    let h = harness_on(api, "to-the-nodes").await;
    // The seed's case: refused at the door, so never written and never rendered.
    let bad = review_patch("api", json!({"role": "controlplane"}), API_SERVER_PATCH);
    let r = review(&h, "CREATE", None, Some(&bad)).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(message(&r).contains(SEED_ERROR), "{}", message(&r));
    // The unrelated one, for cp-2: allowed, written, applied there alone.
    let ok = review_patch("sysctl", json!({"machines": ["cp-2"]}), UNRELATED);
    let r = review(&h, "CREATE", None, Some(&ok)).await;
    assert_eq!(r["allowed"], true, "{r}");
    h.api.insert(ok);
    let api = &h.api;
    wait_for("cp-2 gets the patch", WAIT, || {
        talos.node(1).config().is_some_and(|c| {
            c.contains("vm.max_map_count") && applied(api, "cp-2") == Some(sha(&c))
        })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(talos.node(0).config().unwrap(), before[0]);
    assert_eq!(talos.node(2).config().unwrap(), before[2]);
    assert_eq!(
        talos.node(0).reboots() + talos.node(1).reboots() + talos.node(2).reboots(),
        0
    );
}
