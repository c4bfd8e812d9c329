//! A REAL etcd cluster (the Debian `etcd-server` package, etcd 3.4) of N members on
//! 127.0.0.1, for tests whose membership changes and quorum must be real.
//!
//! Ports are picked free at start, data lives in a temporary folder, and each cluster has
//! its own `--initial-cluster-token`. Members run with `--strict-reconfig-check=false` so
//! membership changes right after start or a leader change are not refused as "unhealthy
//! cluster". The harness talks to etcd through its v3 JSON gateway over plain HTTP
//! (`POST /v3/cluster/member/{list,add,remove}`, `/v3/maintenance/status`,
//! `/v3/maintenance/transfer-leadership`; IDs are JSON strings of uint64), so the tests
//! need neither `etcdctl` nor `protoc`. Dropping the cluster SIGKILLs every member, waits
//! for the ports to free and removes the data.
//!
//! The tests reach it as `crate::support::etcd`.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one gateway request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a cluster (or an added member) may take to become healthy.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(15);

/// A member as etcd lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    /// Empty for a member added but not started yet.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// One member's `maintenance/status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusInfo {
    pub member_id: u64,
    /// 0 when the member sees no leader.
    pub leader: u64,
    pub version: String,
    pub db_size: i64,
    pub db_size_in_use: i64,
    pub raft_index: u64,
    pub raft_term: u64,
    pub raft_applied_index: u64,
    /// The store's revision (the response header's).
    pub revision: i64,
    pub errors: Vec<String>,
    pub is_learner: bool,
}

/// An error answered by etcd's gateway (`code` is a gRPC code) or a failed request
/// (`code` 14, Unavailable: no process, refused connection, timeout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdError {
    pub code: i32,
    pub message: String,
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl EtcdError {
    fn unavailable(message: String) -> EtcdError {
        EtcdError { code: 14, message }
    }
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// The member's index, which gives its peer host ([`peer_host`]).
    index: usize,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A running etcd cluster. Share it with `Arc`; every method takes `&self`.
pub struct EtcdCluster {
    token: String,
    root: PathBuf,
    members: Mutex<Vec<Member>>,
}

static CLUSTERS: AtomicU64 = AtomicU64::new(0);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// The loopback address member `index` serves its peers on (127.0.0.2, 127.0.0.3, ...):
/// as on real nodes, each member's peer URL names a host of its own, which is where the
/// Talos API stand-ins proxy `node: <host>` (the controller asks a member through a
/// sibling at the address etcd lists for it). Loopback only, like everything else here.
pub fn peer_host(index: usize) -> String {
    format!("127.0.0.{}", 2 + (index % 250))
}

fn peer_url(index: usize, port: u16) -> String {
    format!("http://{}:{port}", peer_host(index))
}

fn u64_field(v: &Value, key: &str) -> u64 {
    match &v[key] {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn member_info(v: &Value) -> MemberInfo {
    MemberInfo {
        id: u64_field(v, "ID"),
        name: v["name"].as_str().unwrap_or_default().to_string(),
        peer_urls: strings(&v["peerURLs"]),
        client_urls: strings(&v["clientURLs"]),
        is_learner: v["isLearner"].as_bool().unwrap_or(false),
    }
}

/// One POST to an etcd gateway: the JSON answer, or etcd's error.
pub async fn post(port: u16, path: &str, body: Value) -> Result<Value, EtcdError> {
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| {
                EtcdError::unavailable(format!("connect to etcd at 127.0.0.1:{port}: {e}"))
            })?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| EtcdError::unavailable(format!("etcd at 127.0.0.1:{port}: {e}")))?;
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", format!("127.0.0.1:{port}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("request");
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| EtcdError::unavailable(format!("etcd at 127.0.0.1:{port}{path}: {e}")))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| EtcdError::unavailable(format!("etcd at 127.0.0.1:{port}{path}: {e}")))?
            .to_bytes();
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| EtcdError {
            code: 13,
            message: format!("etcd at 127.0.0.1:{port}{path} answered {status} with no JSON: {e}"),
        })?;
        if let Some(msg) = v.get("error").and_then(Value::as_str) {
            let code = v.get("code").and_then(Value::as_i64).unwrap_or(2) as i32;
            return Err(EtcdError {
                code,
                message: msg.to_string(),
            });
        }
        if !status.is_success() {
            return Err(EtcdError {
                code: 2,
                message: format!("etcd at 127.0.0.1:{port}{path} answered {status}: {v}"),
            });
        }
        Ok(v)
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, attempt).await {
        Ok(r) => r,
        Err(_) => Err(EtcdError::unavailable(format!(
            "etcd at 127.0.0.1:{port}{path}: no answer within {REQUEST_TIMEOUT:?}"
        ))),
    }
}

/// Member `port`'s snapshot through its gateway (`POST /v3/maintenance/snapshot`, a stream
/// of JSON objects with base64 `blob`s): the database followed by its sha256, as etcd sends
/// it, in etcd's own chunks.
pub async fn snapshot_chunks(port: u16) -> Result<Vec<Vec<u8>>, EtcdError> {
    use base64::Engine;
    let path = "/v3/maintenance/snapshot";
    let fail = |m: String| EtcdError::unavailable(format!("etcd at 127.0.0.1:{port}{path}: {m}"));
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| fail(e.to_string()))?;
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method("POST")
            .uri(path)
            .header("host", format!("127.0.0.1:{port}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from("{}")))
            .expect("request");
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?
            .to_bytes();
        let mut chunks = Vec::new();
        for v in serde_json::Deserializer::from_slice(&bytes).into_iter::<Value>() {
            let v = v.map_err(|e| fail(format!("not a stream of JSON objects: {e}")))?;
            if let Some(msg) = v.get("error").and_then(|e| e.get("message").or(Some(e))) {
                return Err(fail(msg.to_string()));
            }
            let blob = v["result"]["blob"].as_str().unwrap_or("");
            let chunk = base64::engine::general_purpose::STANDARD
                .decode(blob)
                .map_err(|e| fail(format!("a blob is not base64: {e}")))?;
            if !chunk.is_empty() {
                chunks.push(chunk);
            }
        }
        Ok(chunks)
    };
    match tokio::time::timeout(Duration::from_secs(60), attempt).await {
        Ok(r) => r,
        Err(_) => Err(fail("no snapshot within 60 s".into())),
    }
}

impl EtcdCluster {
    /// Starts `n` members named `cp-1` .. `cp-n` and waits until they are healthy.
    pub async fn start(n: usize) -> Arc<EtcdCluster> {
        let names: Vec<String> = (1..=n).map(|i| format!("cp-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        EtcdCluster::start_named(&names).await
    }

    /// Starts one member per name and waits until all see a leader and list each other.
    /// A start that fails (a port taken between picking and binding) is retried with
    /// fresh ports.
    pub async fn start_named(names: &[&str]) -> Arc<EtcdCluster> {
        let mut last = String::new();
        for _ in 0..3 {
            let cluster = Arc::new(EtcdCluster::spawn(names));
            match cluster.wait_healthy(names.len()).await {
                Ok(()) => return cluster,
                Err(e) => last = e,
            }
        }
        panic!("etcd cluster did not start: {last}");
    }

    /// The members of a new cluster, none started and none with data: nodes before their
    /// bootstrap. [`EtcdCluster::bootstrap`] starts one as a cluster of its own.
    pub fn unstarted(names: &[&str]) -> Arc<EtcdCluster> {
        Arc::new(EtcdCluster::spawn_with(names, false))
    }

    /// Whether member `i`'s data directory holds anything (Talos refuses a bootstrap then).
    pub fn has_data(&self, i: usize) -> bool {
        let dir = self.members.lock().expect("members")[i].data_dir.clone();
        std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
    }

    /// Starts member `i` as a new one-member cluster (Talos' `Bootstrap`) and waits until it
    /// leads. Refused when its data directory is not empty, as Talos refuses it. The ports
    /// are picked at the start, not when the cluster was made: an unstarted member's ports
    /// sit unbound for seconds, and another test's connection may take one meanwhile (CI
    /// saw an etcd that never started, its bootstrap never confirmed). A start that fails
    /// that way (the process exits by itself) is retried with fresh ports on an emptied
    /// data directory, as a node whose etcd failed to bind would be restarted by Talos.
    pub async fn bootstrap(&self, i: usize) -> Result<(), String> {
        if self.has_data(i) {
            return Err("etcd data directory is not empty".into());
        }
        let mut last = String::new();
        for _ in 0..3 {
            {
                let mut members = self.members.lock().expect("members");
                let m = &mut members[i];
                if let Some(mut dead) = m.child.take() {
                    let _ = dead.kill();
                    let _ = dead.wait();
                }
                let _ = std::fs::remove_dir_all(&m.data_dir);
                m.client_port = free_port();
                m.peer_port = free_port();
                let initial = format!("{}={}", m.name, peer_url(m.index, m.peer_port));
                m.child = Some(spawn_member(m, &initial, &self.token, "new"));
            }
            let deadline = Instant::now() + HEALTHY_TIMEOUT;
            last = loop {
                if let Ok(st) = self.status_at(i).await
                    && st.leader != 0
                {
                    return Ok(());
                }
                if let Some(dead) = self.exited_early() {
                    break dead;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "{} not healthy within {HEALTHY_TIMEOUT:?} after its bootstrap: {}",
                        self.name(i),
                        self.logs()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
        }
        Err(format!(
            "{} did not start after its bootstrap: {last}",
            self.name(i)
        ))
    }

    fn spawn(names: &[&str]) -> EtcdCluster {
        EtcdCluster::spawn_with(names, true)
    }

    fn spawn_with(names: &[&str], start: bool) -> EtcdCluster {
        let seq = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let token = format!("ichor-{}-{seq}-{nanos}", std::process::id());
        let root = std::env::temp_dir().join(&token);
        std::fs::create_dir_all(&root).expect("etcd temp dir");
        let mut members: Vec<Member> = names
            .iter()
            .enumerate()
            .map(|(index, name)| Member {
                name: name.to_string(),
                client_port: free_port(),
                peer_port: free_port(),
                index,
                data_dir: root.join(format!("{name}.etcd")),
                log: root.join(format!("{name}.log")),
                child: None,
            })
            .collect();
        let initial: Vec<String> = members
            .iter()
            .map(|m| format!("{}={}", m.name, peer_url(m.index, m.peer_port)))
            .collect();
        let initial = initial.join(",");
        for m in members.iter_mut().filter(|_| start) {
            m.child = Some(spawn_member(m, &initial, &token, "new"));
        }
        EtcdCluster {
            token,
            root,
            members: Mutex::new(members),
        }
    }

    /// Waits until every running member sees a leader and lists `expected` named members.
    pub async fn wait_healthy(&self, expected: usize) -> Result<(), String> {
        let deadline = Instant::now() + HEALTHY_TIMEOUT;
        loop {
            let last = match self.check_healthy(expected).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if let Some(dead) = self.exited_early() {
                return Err(format!("{dead}; last check: {last}"));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not healthy within {HEALTHY_TIMEOUT:?}: {last}; {}",
                    self.logs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn check_healthy(&self, expected: usize) -> Result<(), String> {
        for i in self.running() {
            let st = self
                .status_at(i)
                .await
                .map_err(|e| format!("{}: {e}", self.name(i)))?;
            if st.leader == 0 {
                return Err(format!("{} sees no leader", self.name(i)));
            }
            let list = self
                .member_list_at(i)
                .await
                .map_err(|e| format!("{}: {e}", self.name(i)))?;
            let named = list.iter().filter(|m| !m.name.is_empty()).count();
            if named != expected {
                return Err(format!(
                    "{} lists {named} started members, not {expected}",
                    self.name(i)
                ));
            }
        }
        Ok(())
    }

    /// A member process that exited by itself, with its log.
    fn exited_early(&self) -> Option<String> {
        let mut members = self.members.lock().expect("members");
        for m in members.iter_mut() {
            if let Some(child) = &mut m.child
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(&m.log).unwrap_or_default();
                return Some(format!("etcd {} exited ({status}): {}", m.name, tail(&log)));
            }
        }
        None
    }

    fn logs(&self) -> String {
        let members = self.members.lock().expect("members");
        members
            .iter()
            .map(|m| {
                format!(
                    "{}: {}",
                    m.name,
                    tail(&std::fs::read_to_string(&m.log).unwrap_or_default())
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The number of members the harness started (killed and removed ones included).
    pub fn len(&self) -> usize {
        self.members.lock().expect("members").len()
    }

    /// The cluster's `--initial-cluster-token`.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Member `i`'s name.
    pub fn name(&self, i: usize) -> String {
        self.members.lock().expect("members")[i].name.clone()
    }

    /// The index of the member named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.members
            .lock()
            .expect("members")
            .iter()
            .position(|m| m.name == name)
    }

    /// Member `i`'s client URL.
    pub fn client_url(&self, i: usize) -> String {
        url(self.client_port(i))
    }

    /// Member `i`'s snapshot, in etcd's chunks (see [`snapshot_chunks`]).
    pub async fn snapshot_at(&self, i: usize) -> Result<Vec<Vec<u8>>, EtcdError> {
        snapshot_chunks(self.client_port(i)).await
    }

    /// One POST to member `i`'s gateway (`/v3/...`): its JSON answer.
    pub async fn post_at(&self, i: usize, path: &str, body: Value) -> Result<Value, EtcdError> {
        post(self.client_port(i), path, body).await
    }

    /// Writes `key` = `value` through member `i`.
    pub async fn put_at(&self, i: usize, key: &str, value: &[u8]) -> Result<(), EtcdError> {
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        post(
            self.client_port(i),
            "/v3/kv/put",
            json!({"key": b64(key.as_bytes()), "value": b64(value)}),
        )
        .await
        .map(|_| ())
    }

    fn client_port(&self, i: usize) -> u16 {
        self.members.lock().expect("members")[i].client_port
    }

    /// Member `i`'s peer URL.
    pub fn peer_url(&self, i: usize) -> String {
        let members = self.members.lock().expect("members");
        peer_url(members[i].index, members[i].peer_port)
    }

    /// Whether member `i`'s process is running.
    pub fn is_running(&self, i: usize) -> bool {
        let mut members = self.members.lock().expect("members");
        match &mut members[i].child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The indexes of the running members.
    pub fn running(&self) -> Vec<usize> {
        (0..self.len()).filter(|&i| self.is_running(i)).collect()
    }

    /// SIGKILLs member `i`. It stays listed by the others (a dead member).
    pub fn kill(&self, i: usize) {
        let mut members = self.members.lock().expect("members");
        if let Some(mut child) = members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again from its data (a node back from a reboot), with the same
    /// name and peer port, and waits until it sees a leader. Its data dir still there, etcd
    /// rejoins as the member it was (the initial-cluster flags are ignored then).
    pub async fn restart(&self, i: usize) -> Result<(), String> {
        {
            let mut members = self.members.lock().expect("members");
            let m = &mut members[i];
            if m.child.is_some() {
                return Ok(());
            }
            // Its client port may have been taken while it was down (the peer port is its
            // registered peer URL and stays; it is on a loopback host of its own).
            if !port_free(m.client_port) {
                m.client_port = free_port();
            }
            let initial = format!("{}={}", m.name, peer_url(m.index, m.peer_port));
            m.child = Some(spawn_member(m, &initial, &self.token, "existing"));
        }
        let deadline = Instant::now() + HEALTHY_TIMEOUT;
        loop {
            if let Ok(st) = self.status_at(i).await
                && st.leader != 0
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} not healthy within {HEALTHY_TIMEOUT:?} after its restart: {}",
                    self.name(i),
                    self.logs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILLs member `i` and deletes its data (a wiped node).
    pub fn kill_and_wipe(&self, i: usize) {
        self.kill(i);
        let dir = self.members.lock().expect("members")[i].data_dir.clone();
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Adds a member through the cluster API (via a running member), starts its process
    /// with `--initial-cluster-state existing`, waits until it sees a leader; returns its
    /// index.
    pub async fn add_member(&self, name: &str) -> usize {
        let peer_port = free_port();
        let client_port = free_port();
        let index = self.members.lock().expect("members").len();
        let via = *self
            .running()
            .first()
            .expect("a running member to add through");
        let resp = post(
            self.client_port(via),
            "/v3/cluster/member/add",
            json!({ "peerURLs": [peer_url(index, peer_port)] }),
        )
        .await
        .unwrap_or_else(|e| panic!("member add {name}: {e}"));
        let new_id = u64_field(&resp["member"], "ID");
        let initial: Vec<String> = resp["members"]
            .as_array()
            .map(|a| a.iter().map(member_info).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| {
                let peer = m.peer_urls.first()?.clone();
                let n = if m.id == new_id {
                    name.to_string()
                } else if m.name.is_empty() {
                    format!("unstarted-{:x}", m.id)
                } else {
                    m.name
                };
                Some(format!("{n}={peer}"))
            })
            .collect();
        let mut member = Member {
            name: name.to_string(),
            client_port,
            peer_port,
            index,
            data_dir: self.root.join(format!("{name}.etcd")),
            log: self.root.join(format!("{name}.log")),
            child: None,
        };
        member.child = Some(spawn_member(
            &member,
            &initial.join(","),
            &self.token,
            "existing",
        ));
        let index = {
            let mut members = self.members.lock().expect("members");
            members.push(member);
            members.len() - 1
        };
        let deadline = Instant::now() + HEALTHY_TIMEOUT;
        loop {
            if let Ok(st) = self.status_at(index).await
                && st.leader != 0
            {
                return index;
            }
            assert!(
                Instant::now() < deadline,
                "added member {name} not healthy within {HEALTHY_TIMEOUT:?}: {}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The member list as member `i` sees it.
    pub async fn member_list_at(&self, i: usize) -> Result<Vec<MemberInfo>, EtcdError> {
        let v = post(self.client_port(i), "/v3/cluster/member/list", json!({})).await?;
        Ok(v["members"]
            .as_array()
            .map(|a| a.iter().map(member_info).collect())
            .unwrap_or_default())
    }

    /// The member list as the first running member that answers sees it.
    pub async fn members(&self) -> Vec<MemberInfo> {
        let mut last = String::from("no running member");
        for i in self.running() {
            match self.member_list_at(i).await {
                Ok(list) => return list,
                Err(e) => last = e.to_string(),
            }
        }
        panic!("no etcd member answers a member list: {last}");
    }

    /// The sorted names of the listed members.
    pub async fn member_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.members().await.into_iter().map(|m| m.name).collect();
        names.sort();
        names
    }

    /// Member `i`'s status.
    pub async fn status_at(&self, i: usize) -> Result<StatusInfo, EtcdError> {
        let v = post(self.client_port(i), "/v3/maintenance/status", json!({})).await?;
        Ok(StatusInfo {
            member_id: u64_field(&v["header"], "member_id"),
            leader: u64_field(&v, "leader"),
            version: v["version"].as_str().unwrap_or_default().to_string(),
            db_size: u64_field(&v, "dbSize") as i64,
            db_size_in_use: u64_field(&v, "dbSizeInUse") as i64,
            raft_index: u64_field(&v, "raftIndex"),
            raft_term: u64_field(&v, "raftTerm"),
            raft_applied_index: u64_field(&v, "raftAppliedIndex"),
            revision: u64_field(&v["header"], "revision") as i64,
            errors: strings(&v["errors"]),
            is_learner: v["isLearner"].as_bool().unwrap_or(false),
        })
    }

    /// Member `i`'s ID, from its own status or else from the list of a running member.
    pub async fn member_id(&self, i: usize) -> Option<u64> {
        if let Ok(st) = self.status_at(i).await {
            return Some(st.member_id);
        }
        let name = self.name(i);
        for j in self.running() {
            if let Ok(list) = self.member_list_at(j).await {
                return list.into_iter().find(|m| m.name == name).map(|m| m.id);
            }
        }
        None
    }

    /// The leader's ID as the running members agree on it, waiting up to `timeout` for
    /// them to agree on a running leader.
    pub async fn leader(&self, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut seen = Vec::new();
            let mut alive = Vec::new();
            for i in self.running() {
                if let Ok(st) = self.status_at(i).await {
                    seen.push(st.leader);
                    alive.push(st.member_id);
                }
            }
            // Right after the leader dies, the others still name it for an election timeout.
            if let Some(&first) = seen.first()
                && alive.contains(&first)
                && seen.iter().all(|&l| l == first)
            {
                return Some(first);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The index of the member with ID `id`, if it is running.
    pub async fn index_of_id(&self, id: u64) -> Option<usize> {
        for i in self.running() {
            if let Ok(st) = self.status_at(i).await
                && st.member_id == id
            {
                return Some(i);
            }
        }
        None
    }

    /// Removes member `id` through member `via`.
    pub async fn remove_member_at(&self, via: usize, id: u64) -> Result<(), EtcdError> {
        post(
            self.client_port(via),
            "/v3/cluster/member/remove",
            json!({ "ID": id.to_string() }),
        )
        .await
        .map(|_| ())
    }

    /// Moves leadership to member `target`; `via` must be the leader.
    pub async fn move_leader_at(&self, via: usize, target: u64) -> Result<(), EtcdError> {
        post(
            self.client_port(via),
            "/v3/maintenance/transfer-leadership",
            json!({ "targetID": target.to_string() }),
        )
        .await
        .map(|_| ())
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

fn spawn_member(m: &Member, initial_cluster: &str, token: &str, state: &str) -> Child {
    let log = std::fs::File::create(&m.log).expect("etcd log file");
    Command::new("etcd")
        .arg("--name")
        .arg(&m.name)
        .arg("--data-dir")
        .arg(&m.data_dir)
        .args(["--listen-client-urls", &url(m.client_port)])
        .args(["--advertise-client-urls", &url(m.client_port)])
        .args(["--listen-peer-urls", &peer_url(m.index, m.peer_port)])
        .args([
            "--initial-advertise-peer-urls",
            &peer_url(m.index, m.peer_port),
        ])
        .args(["--initial-cluster", initial_cluster])
        .args(["--initial-cluster-token", token])
        .args(["--initial-cluster-state", state])
        .arg("--strict-reconfig-check=false")
        // Twice etcd's defaults (100 ms, 1 s): on 2 shared cores running several clusters
        // at once, a starved leader misses heartbeats and elections flap.
        .args(["--heartbeat-interval", "250", "--election-timeout", "2500"])
        .args(["--logger", "zap", "--log-level", "error"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn etcd (Debian package etcd-server)")
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        let mut ports = Vec::new();
        if let Ok(mut members) = self.members.lock() {
            for m in members.iter_mut() {
                if let Some(mut child) = m.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                ports.push(m.client_port);
                ports.push(m.peer_port);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && !ports.iter().all(|&p| port_free(p)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
