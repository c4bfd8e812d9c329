//! Running the controller in-process against the in-process API server, with short
//! intervals, and waiting for what it writes.
//!
//! The tests reach it as `crate::support::controller` (usually `as harness`).

use super::apiserver::ApiServer;
use super::objects;
use ichor_rules::runtime::controller::{self, Context, Settings};
use ichor_rules::runtime::metrics::Metrics;
use ichor_rules::runtime::reload::{Reload, Rules};
use ichor_rules::runtime::talos::TalosTls;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const NS: &str = "infra";

/// The operator's own namespace (`Settings::lease_namespace`): its Leases live there.
pub const OPERATOR_NS: &str = "ichor-system";

/// The cluster lock Leases (`disruptive::lock_name`: `ichor-lock.<namespace>.<cluster>`,
/// in the operator's namespace, next to the leader Lease).
pub fn lock_leases(api: &ApiServer) -> Vec<Value> {
    api.objects("Lease", Some(OPERATOR_NS))
        .into_iter()
        .filter(|l| {
            l["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("ichor-lock"))
        })
        .collect()
}

/// Intervals short enough for tests, in the same proportions as the defaults.
pub fn fast_settings(identity: &str) -> Settings {
    Settings {
        identity: identity.into(),
        lease_namespace: OPERATOR_NS.into(),
        over_cap_requeue: Duration::from_millis(300),
        drain_retry: Duration::from_millis(300),
        refused_requeue: Duration::from_millis(300),
        lock_retry: Duration::from_millis(100),
        parked_requeue: Duration::from_millis(300),
        probe_interval: Duration::from_millis(500),
        unreachable_grace: Duration::from_millis(1500),
        lock_duration: Duration::from_secs(6),
        leader_duration: Duration::from_secs(2),
        error_requeue: Duration::from_millis(200),
        reset_settle: Duration::from_secs(1),
        read_timeout: Duration::from_secs(3),
        talos_timeout: Duration::from_secs(3),
        install_deadline: Duration::from_secs(10),
        backup_retry: Duration::from_secs(1),
        snapshot_deadline: Duration::from_secs(60),
        roll_settle: Duration::from_secs(1),
        base_recheck: Duration::from_secs(1),
    }
}

pub fn rules() -> Arc<Rules> {
    let rules = Arc::new(Rules::new(vec![
        concat!(env!("CARGO_MANIFEST_DIR"), "/rules").into(),
    ]));
    assert!(matches!(rules.reload(), Reload::Replaced { .. }));
    rules
}

/// A new step-log file for a controller of this test (`serve --step-log`), empty.
pub fn step_log_path(identity: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "steps-{identity}-{}-{}.ndjson",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    let _ = std::fs::remove_file(&path);
    path
}

/// `ichor-rules verify rules/ --check-trace <log>`: the controller's own step log is a
/// behaviour of the model (a failure quotes the checker's words and the log's path).
pub fn assert_step_log_checks(log: &std::path::Path) {
    assert_step_log_checks_with(log, std::path::Path::new("rules"));
}

/// [`assert_step_log_checks`] with the rules the controller ran with (`rules`).
pub fn assert_step_log_checks_with(log: &std::path::Path, rules: &std::path::Path) {
    // A controller that never reconciled a removal wrote nothing.
    if std::fs::metadata(log).map_or(true, |m| m.len() == 0) {
        return;
    }
    let (code, said) = check_step_log(log, rules);
    assert_eq!(
        code,
        Some(0),
        "the step log {} is not a behaviour of the model:\n{said}",
        log.display(),
    );
}

/// `ichor-rules verify <rules> --check-trace <log>`: its exit code and what it said.
pub fn check_step_log(log: &std::path::Path, rules: &std::path::Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
        .arg("verify")
        .arg(rules)
        .arg("--check-trace")
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

/// [`check_step_log`] of `text`, written as a fresh step log named after `name`, against
/// the shipped rules.
pub fn check_step_log_text(name: &str, text: &str) -> (Option<i32>, String) {
    let path = step_log_path(name);
    std::fs::write(&path, text).expect("write the step log");
    check_step_log(&path, std::path::Path::new("rules"))
}

/// [`context`], logging every removal step to `log` (`serve --step-log`).
pub fn context_logged(
    api: &ApiServer,
    identity: &str,
    talos: Option<Arc<TalosTls>>,
    log: &std::path::Path,
) -> Arc<Context> {
    let steps = ichor_rules::runtime::exec::trace::StepLog::open(log).expect("a step log");
    Arc::new(
        Context::new(
            api.client(),
            rules(),
            talos,
            fast_settings(identity),
            Arc::new(Metrics::default()),
        )
        .with_step_log(Arc::new(steps)),
    )
}

pub fn context(api: &ApiServer, identity: &str, talos: Option<Arc<TalosTls>>) -> Arc<Context> {
    Arc::new(Context::new(
        api.client(),
        rules(),
        talos,
        fast_settings(identity),
        Arc::new(Metrics::default()),
    ))
}

/// A running controller; dropping it stops it (as if its process were killed).
pub struct Running {
    pub ctx: Arc<Context>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    pub fn start(ctx: Arc<Context>) -> Running {
        let task = tokio::spawn(controller::run(ctx.clone()));
        Running {
            ctx,
            task: Some(task),
        }
    }

    /// Stops it at whatever point it is (an abort at the next await, like a kill).
    pub async fn kill(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// A schedulable cluster in [`NS`] (see `support::objects` for the defaults).
pub fn cluster(name: &str, count: i64) -> Value {
    objects::cluster(name, count)
        .namespace(NS)
        .schedulable("true")
        .build()
}

/// An approved control plane of cluster `prod`, approved at minute `minute`.
pub fn control_plane(name: &str, minute: u32) -> Value {
    machine(name, "controlplane", true, minute)
}

/// A machine of cluster `prod` in [`NS`] that may be deleted, its hostname its name,
/// decided at minute `minute`.
pub fn machine(name: &str, role: &str, approved: bool, minute: u32) -> Value {
    objects::machine(name)
        .namespace(NS)
        .cluster("prod")
        .role(role)
        .approved(approved)
        .hostname(name)
        .allow_delete()
        .approved_at(&format!("2026-11-01T10:{minute:02}:00Z"))
        .build()
}

pub fn operation(name: &str, kind: &str) -> Value {
    objects::operation(name, kind)
        .namespace(NS)
        .cluster("prod")
        .build()
}

pub fn get(api: &ApiServer, kind: &str, name: &str) -> Option<Value> {
    api.objects(kind, None)
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
}

pub fn condition(obj: &Value, type_: &str) -> Option<Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// (status, reason) of a condition of a stored object.
pub fn cond(api: &ApiServer, kind: &str, name: &str, type_: &str) -> Option<(String, String)> {
    let o = get(api, kind, name)?;
    let c = condition(&o, type_)?;
    Some((
        c["status"].as_str().unwrap_or("").to_string(),
        c["reason"].as_str().unwrap_or("").to_string(),
    ))
}

/// The message of a condition of a stored object ("" when none).
pub fn message(api: &ApiServer, kind: &str, name: &str, type_: &str) -> String {
    get(api, kind, name)
        .and_then(|o| condition(&o, type_))
        .and_then(|c| c["message"].as_str().map(str::to_string))
        .unwrap_or_default()
}

pub fn has_finalizer(api: &ApiServer, name: &str) -> bool {
    get(api, "TalosMachine", name).is_some_and(|m| {
        m["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "ichor.maesh.dev/machine-removal"))
    })
}

/// Polls until `f` holds; panics with `what` and the last state after `timeout`.
pub async fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Events (events.k8s.io/v1) with this reason about this object.
pub fn events(api: &ApiServer, name: &str, reason: &str) -> Vec<Value> {
    api.objects("Event", None)
        .into_iter()
        .filter(|e| e["reason"] == reason && e["regarding"]["name"] == name)
        .collect()
}

/// Deletes an object through the API (a person's `kubectl delete`): with finalizers it
/// stays, being deleted.
pub async fn delete(api: &ApiServer, kind: &str, name: &str) {
    use ichor_rules::runtime::objects::{TalosCluster, TalosMachine, TalosOperation};
    use kube::api::{Api, DeleteParams};
    let c = api.test_client();
    let dp = DeleteParams::default();
    let r = match kind {
        "TalosMachine" => Api::<TalosMachine>::namespaced(c, NS)
            .delete(name, &dp)
            .await
            .map(|_| ()),
        "TalosCluster" => Api::<TalosCluster>::namespaced(c, NS)
            .delete(name, &dp)
            .await
            .map(|_| ()),
        _ => Api::<TalosOperation>::namespaced(c, NS)
            .delete(name, &dp)
            .await
            .map(|_| ()),
    };
    r.expect("delete");
}

/// Merge-patches an object's spec through the API.
pub async fn patch_spec(api: &ApiServer, kind: &str, name: &str, spec: Value) {
    use ichor_rules::runtime::objects::{TalosCluster, TalosMachine};
    use kube::api::{Api, Patch, PatchParams};
    let c = api.test_client();
    let body = json!({ "spec": spec });
    let pp = PatchParams::default();
    match kind {
        "TalosMachine" => {
            Api::<TalosMachine>::namespaced(c, NS)
                .patch(name, &pp, &Patch::Merge(&body))
                .await
                .expect("patch");
        }
        _ => {
            Api::<TalosCluster>::namespaced(c, NS)
                .patch(name, &pp, &Patch::Merge(&body))
                .await
                .expect("patch");
        }
    }
}

/// Which grant covers a request: a Role in the operator's own namespace (where
/// `fast_settings` keeps the Leases) for a call into it, the ClusterRole for any other.
pub fn scope_of(r: &super::apiserver::Request) -> ichor_rules::runtime::access::Scope {
    use ichor_rules::runtime::access::Scope;
    if r.path.contains(&format!("/namespaces/{OPERATOR_NS}/")) {
        Scope::LeaseNamespace
    } else {
        Scope::Cluster
    }
}

/// A request as RBAC sees it: (API group, resource[/subresource], verb).
pub fn rbac_of(r: &super::apiserver::Request) -> Option<(String, String, String)> {
    let parts: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _v, rest @ ..] => (String::new(), rest),
        ["apis", g, _v, rest @ ..] => (g.to_string(), rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    let (resource, named) = match rest {
        [res] => (res.to_string(), false),
        [res, _name] => (res.to_string(), true),
        [res, _name, sub] => (format!("{res}/{sub}"), true),
        _ => return None,
    };
    let verb = match (r.method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if r.watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some((group, resource, verb.to_string()))
}

/// Every API call the server received since the last call, as RBAC sees it; asserts the
/// chart's grants (`access::REQUIRED`) cover each one.
pub fn assert_calls_granted(
    api: &ApiServer,
) -> std::collections::BTreeSet<(String, String, String)> {
    use ichor_rules::runtime::access::allows;
    assert_calls_within(api, allows, "the chart")
}

/// Like [`assert_calls_granted`], against the grants `granted` says (`access::allows`, or
/// `access::webhook_allows` for a webhook-only process); `whose` names them in failures.
pub fn assert_calls_within(
    api: &ApiServer,
    granted: fn(&str, &str, &str, ichor_rules::runtime::access::Scope) -> bool,
    whose: &str,
) -> std::collections::BTreeSet<(String, String, String)> {
    let mut seen = std::collections::BTreeSet::new();
    for r in api.store.faults.take_log() {
        if r.by_test {
            continue;
        }
        let Some(call) = rbac_of(&r) else { continue };
        let scope = scope_of(&r);
        assert!(
            granted(&call.0, &call.1, &call.2, scope),
            "the code made a call {whose} does not grant: {} {} ({call:?})",
            r.method,
            r.path
        );
        seen.insert(call);
    }
    seen
}
