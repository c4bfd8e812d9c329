//! A Talos API stand-in per node: a tonic server generated from the same `.proto` as the
//! client (`ichor_rules::runtime::talos::proto`), on 127.0.0.1 with mutual TLS, serving the
//! seven machine API calls against that node's member of a REAL etcd cluster
//! (`support/etcd.rs`).
//!
//! What each call does, as Talos does it:
//! - `EtcdMemberList`, `EtcdStatus`: this node's etcd member answers; when its etcd does not
//!   answer, the call fails with `Unknown` (the node answered, its etcd did not).
//! - `EtcdForfeitLeadership`: when this member leads, leadership moves to another running
//!   voting member; the answer names this member (empty when it did not lead).
//! - `EtcdLeaveCluster`: this member removes itself through the cluster API, then its etcd
//!   stops and its data is wiped. Not a member any more (or etcd not running): an error.
//! - `EtcdRemoveMemberByID`: through this node's etcd, "failed to remove member ..." on error.
//! - `Reset`: graceful leaves etcd first (forfeiting leadership) when still a member; then
//!   the node wipes (its etcd stops, its data goes), counts the reset, and from then on
//!   answers `Unavailable` like a rebooting node (until [`TalosNode::start_again`]).
//! - `Version`: the node's tag, [`VERSION_TAG`] until an upgrade or a rollback changes it.
//! - `SystemStat`: the node's `boot_time`, which every reboot advances.
//! - `ApplyConfiguration` (issue 37): the configuration is checked as Talos does, by code of
//!   the stand-in's own (never the product's validator or conflict table, so that the two
//!   cannot agree on the same mistake): the YAML parses, a `v1alpha1` document with a
//!   `machine.type`, and every document's `V1Alpha1ConflictValidate` ([`v1alpha1_conflict`],
//!   written from Talos' source with its words, over its own reading of the YAML), every
//!   error in one `InvalidArgument` as Talos' multierror; every call refused
//!   with given words while [`TalosNode::refuse_configs`] says so. A change of
//!   `machine.install` needs a reboot. `dry_run` answers the
//!   mode it would take and changes nothing; `AUTO` keeps it and reboots when needed,
//!   `NO_REBOOT` refuses a change that needs one, `STAGED` keeps it for the next boot.
//! - Maintenance mode ([`TalosNode::maintenance`], issue 37): a node before its first
//!   configuration answers only clients presenting no certificate (`talosctl --insecure`)
//!   and only `Version` and `ApplyConfiguration` (others: `Unimplemented`); a client
//!   presenting the cluster's certificate gets `Unavailable`, as its handshake with the
//!   node's self-signed certificate would fail. The first configuration applied makes the
//!   node reboot into it and serve the mTLS API. A configured node refuses a client without
//!   a certificate (`Unauthenticated`).
//! - `Bootstrap`: on a control plane whose etcd never ran (a new cluster's node, from
//!   `EtcdCluster::unstarted`), starts its etcd member as a cluster of its own; refused
//!   `FailedPrecondition` when its etcd runs or its data directory is not empty, as Talos
//!   refuses it. [`TalosNode::lose_bootstrap_answers`]: it acts, then answers `Unavailable`.
//! - `Reboot`: answers, then the node goes down (its etcd member is killed, its data kept;
//!   every call answers `Unavailable`) for [`TalosNode::set_downtime`] and comes back with
//!   a new boot time, its etcd member restarted from its data; a node set
//!   [`TalosNode::never_back`] stays down. `Shutdown`: down for good.
//! - `Upgrade` (legacy): answers, then reboots as above into the image's tag (the text
//!   after its last `:`). `Rollback`: reboots into the tag it ran before.
//! - `ImageService/Pull`: a stream naming the pulled image (its reference).
//!   `LifecycleService/Upgrade`: a stream of progress and an `exit_code`
//!   ([`TalosNode::set_install_exit_code`], 0 by default); 0 stages the image's tag for the
//!   next reboot, anything else changes nothing.
//!
//! Downtimes are recorded ([`TalosApi::downtimes`]): which node was down from when to when,
//! so scenarios assert "never two down at once" from the stand-in's own side.
//!
//! Node targeting: a request carrying the metadata `node: X` (X a node name, its
//! `127.0.0.1:port`, or the host of its etcd member's peer URL, `etcd::peer_host`, as a
//! Talos node's address is) is answered as node X, as apid proxies it. The target's failure comes
//! back as a per-node error in `messages[0].metadata` with an OK call, as apid reports
//! failed nodes; a stopped or unknown target is reported `Unavailable` the same way. Several
//! `node` values are refused with `InvalidArgument`. A direct call's failure is the call's
//! gRPC status.
//!
//! Every call is kept in a record ([`TalosApi::calls`]): the RPC, the node dialled and the
//! node it was answered as, so scenarios assert what the controller did from the stand-in's
//! own side.
//!
//! The tests reach it as `crate::support::talos` (it uses `support/etcd.rs` as its sibling
//! `super::etcd`).

use super::etcd::{EtcdCluster, EtcdError};
use ichor_rules::runtime::talos::proto::common::Metadata;
use ichor_rules::runtime::talos::proto::google::rpc;
use ichor_rules::runtime::talos::proto::machine as pb;
use ichor_rules::runtime::talos::proto::machine::image_service_server::{
    ImageService, ImageServiceServer,
};
use ichor_rules::runtime::talos::proto::machine::lifecycle_service_server::{
    LifecycleService, LifecycleServiceServer,
};
use ichor_rules::runtime::talos::proto::machine::machine_service_server::{
    MachineService, MachineServiceServer,
};
use ichor_rules::runtime::talos::{TalosClient, TalosTls};
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Code, Request, Response, Status};

/// The tag every stand-in's `Version` answers.
pub const VERSION_TAG: &str = "v1.9.5";

/// The per-call timeout of [`TalosApi::client`].
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A cluster PKI as Talos makes one: a CA, a serving certificate for 127.0.0.1 (IP SAN),
/// and an Ed25519 admin client certificate.
pub struct Pki {
    pub ca_pem: String,
    pub server_crt: String,
    pub server_key: String,
    pub client_crt: String,
    pub client_key: String,
}

fn ca_params(cn: &str) -> rcgen::CertificateParams {
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    p
}

fn leaf(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    sans: Vec<String>,
    cn: &str,
    usage: rcgen::ExtendedKeyUsagePurpose,
    key: rcgen::KeyPair,
) -> (String, String) {
    let mut p = rcgen::CertificateParams::new(sans).expect("leaf params");
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    p.distinguished_name
        .push(rcgen::DnType::OrganizationName, "os:admin");
    p.extended_key_usages = vec![usage];
    let cert = p.signed_by(&key, issuer).expect("sign leaf");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    pub fn new() -> Pki {
        Pki::with_server_sans(&["127.0.0.1", "localhost"])
    }

    /// A PKI whose serving certificate names only `sans` (IP addresses or DNS names).
    pub fn with_server_sans(sans: &[&str]) -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let params = ca_params("talos");
        let ca = params.self_signed(&ca_key).expect("CA");
        let issuer = rcgen::Issuer::new(params, ca_key);
        let (server_crt, server_key) = leaf(
            &issuer,
            sans.iter().map(|s| s.to_string()).collect(),
            "talos-apid",
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::KeyPair::generate().expect("server key"),
        );
        let (client_crt, client_key) = leaf(
            &issuer,
            vec![],
            "admin",
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("client key"),
        );
        Pki {
            ca_pem: ca.pem(),
            server_crt,
            server_key,
            client_crt,
            client_key,
        }
    }

    /// The client's TLS material (trusting this CA, presenting the admin certificate).
    pub fn client_tls(&self) -> TalosTls {
        TalosTls::from_pem(
            self.ca_pem.as_bytes(),
            self.client_crt.as_bytes(),
            self.client_key.as_bytes(),
        )
        .expect("client TLS")
    }

    /// TLS material that trusts this CA but presents a client certificate from another CA.
    pub fn foreign_client_tls(&self) -> TalosTls {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let params = ca_params("not-talos");
        let issuer = rcgen::Issuer::new(params, key);
        let (crt, key) = leaf(
            &issuer,
            vec![],
            "admin",
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            rcgen::KeyPair::generate().expect("client key"),
        );
        TalosTls::from_pem(self.ca_pem.as_bytes(), crt.as_bytes(), key.as_bytes())
            .expect("foreign TLS")
    }

    /// A talosconfig with one context `name`: the endpoints and nodes given, and this
    /// PKI's CA and admin certificate as base64 PEM. The key carries Talos' own PEM label,
    /// `ED25519 PRIVATE KEY`.
    pub fn talosconfig(&self, name: &str, endpoints: &[String], nodes: &[String]) -> String {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        let key = self
            .client_key
            .replace("BEGIN PRIVATE KEY", "BEGIN ED25519 PRIVATE KEY")
            .replace("END PRIVATE KEY", "END ED25519 PRIVATE KEY");
        let list = |v: &[String]| {
            v.iter()
                .map(|e| format!("\n      - {e}"))
                .collect::<String>()
        };
        format!(
            "context: {name}\ncontexts:\n  {name}:\n    endpoints:{}\n    nodes:{}\n    ca: {}\n    crt: {}\n    key: {}\n",
            list(endpoints),
            list(nodes),
            b64(&self.ca_pem),
            b64(&self.client_crt),
            b64(&key)
        )
    }
}

type Registry = Arc<Mutex<HashMap<String, Arc<Node>>>>;

/// One call a stand-in received, as its record keeps it: the RPC, the node dialled, and
/// the node it was answered as (the `node` metadata's target, or the dialled node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub rpc: &'static str,
    /// The stand-in the client dialled (its node name).
    pub via: String,
    /// The node the call was for (a node name when it is one of the stand-ins, else the
    /// `node` value as sent).
    pub node: String,
}

type Log = Arc<Mutex<Vec<Call>>>;

/// A time a node was down (rebooting, shut down, or never back): from when its reboot
/// began to when it answered again (`None`: still down).
#[derive(Clone, Debug)]
pub struct Downtime {
    pub node: String,
    pub from: Instant,
    pub to: Option<Instant>,
}

type Downtimes = Arc<Mutex<Vec<Downtime>>>;

/// The boot time every stand-in starts with (node `i` boots at this plus `i`).
pub const FIRST_BOOT: u64 = 1_780_000_000;

/// One node's state, shared by its server and the registry.
struct Node {
    name: String,
    index: usize,
    /// A worker: no etcd member on it (its etcd calls fail as a worker's do).
    worker: bool,
    addr: SocketAddr,
    etcd: Arc<EtcdCluster>,
    serving: AtomicBool,
    wiped: AtomicBool,
    resets: AtomicUsize,
    /// Rebooting, shut down or never back: every call answers `Unavailable`.
    down: AtomicBool,
    boot_time: AtomicU64,
    /// The running tag, and the one before the last change (for `Rollback`).
    version: Mutex<(String, String)>,
    /// The tag an install staged for the next boot.
    staged: Mutex<Option<String>>,
    downtime_ms: AtomicU64,
    never_back: AtomicBool,
    install_exit_code: AtomicI32,
    /// Flip one byte of the next snapshots it streams (a corruption on the way).
    corrupt_snapshot: AtomicBool,
    /// Stream snapshots whose database is no bbolt (its meta pages zeroed) but whose
    /// trailing sha256 checks out: sound on the way, its revision unreadable.
    unreadable_snapshot: AtomicBool,
    reboots: AtomicUsize,
    downtimes: Downtimes,
    /// The machine configuration applied, and the one staged for the next boot.
    config: Mutex<Option<String>>,
    staged_config: Mutex<Option<String>>,
    bootstraps: AtomicUsize,
    /// The next `Bootstrap`s act and then answer `Unavailable` (an answer lost).
    lose_bootstrap_answer: AtomicBool,
    /// Every `ApplyConfiguration` refused with these words.
    refuse_configs: std::sync::Mutex<Option<String>>,
    /// `Bootstrap` calls still to be refused without acting.
    refuse_bootstraps: AtomicUsize,
    /// In Talos' maintenance mode: not configured yet (see the module's doc).
    maintenance: AtomicBool,
}

fn etcd_failure(name: &str, e: &EtcdError) -> Status {
    Status::unknown(format!("etcd member {name} does not answer: {e}"))
}

fn etcd_code(e: &EtcdError) -> Code {
    match Code::from_i32(e.code) {
        // The stand-in's own etcd being down is the node's failure, not the node's absence.
        Code::Unavailable | Code::DeadlineExceeded | Code::Ok => Code::Unknown,
        code => code,
    }
}

impl Node {
    fn metadata(&self) -> Option<Metadata> {
        Some(Metadata {
            hostname: self.name.clone(),
            ..Default::default()
        })
    }

    fn check_up(&self) -> Result<(), Status> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Status::unavailable(format!(
                "node {} is down (rebooting or shut down)",
                self.name
            )));
        }
        if self.wiped.load(Ordering::SeqCst) {
            return Err(Status::unavailable(format!(
                "node {} is rebooting after a reset",
                self.name
            )));
        }
        Ok(())
    }

    async fn version(self: Arc<Self>) -> Result<pb::Version, Status> {
        self.check_up()?;
        Ok(pb::Version {
            metadata: self.metadata(),
            version: Some(pb::VersionInfo {
                tag: self.version.lock().expect("version").0.clone(),
                sha: "stand-in".into(),
                os: "Talos".into(),
                arch: "amd64".into(),
                ..Default::default()
            }),
            platform: Some(pb::PlatformInfo {
                name: "metal".into(),
                mode: "metal".into(),
            }),
            features: None,
        })
    }

    /// A worker runs no etcd: Talos answers its etcd calls with an error.
    fn etcd_here(&self) -> Result<(), Status> {
        if self.worker {
            return Err(Status::failed_precondition(format!(
                "etcd is not running on {}: it is a worker",
                self.name
            )));
        }
        Ok(())
    }

    async fn member_list(self: Arc<Self>) -> Result<pb::EtcdMembers, Status> {
        self.check_up()?;
        self.etcd_here()?;
        let list = self
            .etcd
            .member_list_at(self.index)
            .await
            .map_err(|e| etcd_failure(&self.name, &e))?;
        Ok(pb::EtcdMembers {
            metadata: self.metadata(),
            legacy_members: list.iter().map(|m| m.name.clone()).collect(),
            members: list
                .into_iter()
                .map(|m| pb::EtcdMember {
                    id: m.id,
                    hostname: m.name,
                    peer_urls: m.peer_urls,
                    client_urls: m.client_urls,
                    is_learner: m.is_learner,
                })
                .collect(),
        })
    }

    async fn status(self: Arc<Self>) -> Result<pb::EtcdStatus, Status> {
        self.check_up()?;
        self.etcd_here()?;
        let st = self
            .etcd
            .status_at(self.index)
            .await
            .map_err(|e| etcd_failure(&self.name, &e))?;
        Ok(pb::EtcdStatus {
            metadata: self.metadata(),
            member_status: Some(pb::EtcdMemberStatus {
                protocol_version: st.version,
                db_size: st.db_size,
                db_size_in_use: st.db_size_in_use,
                leader: st.leader,
                raft_index: st.raft_index,
                raft_term: st.raft_term,
                raft_applied_index: st.raft_applied_index,
                errors: st.errors,
                is_learner: st.is_learner,
                member_id: st.member_id,
            }),
        })
    }

    /// Moves leadership away when this member leads; the name of this member, or empty.
    async fn forfeit(&self) -> Result<String, Status> {
        self.etcd_here()?;
        let st = self
            .etcd
            .status_at(self.index)
            .await
            .map_err(|e| etcd_failure(&self.name, &e))?;
        if st.leader == 0 || st.leader != st.member_id {
            return Ok(String::new());
        }
        let list = self
            .etcd
            .member_list_at(self.index)
            .await
            .map_err(|e| etcd_failure(&self.name, &e))?;
        let mut last = String::from("no other started voting member");
        for m in list
            .iter()
            .filter(|m| m.id != st.member_id && !m.is_learner && !m.name.is_empty())
        {
            let Some(i) = self.etcd.index_of(&m.name) else {
                continue;
            };
            if !self.etcd.is_running(i) || self.etcd.status_at(i).await.is_err() {
                continue;
            }
            match self.etcd.move_leader_at(self.index, m.id).await {
                Ok(()) => return Ok(self.name.clone()),
                Err(e) => last = e.to_string(),
            }
        }
        Err(Status::failed_precondition(format!(
            "failed to move etcd leadership from {}: {last}",
            self.name
        )))
    }

    async fn forfeit_leadership(self: Arc<Self>) -> Result<pb::EtcdForfeitLeadership, Status> {
        self.check_up()?;
        let member = self.forfeit().await?;
        Ok(pb::EtcdForfeitLeadership {
            metadata: self.metadata(),
            member,
        })
    }

    /// Removes this member from the cluster, then stops and wipes its etcd.
    async fn leave(&self) -> Result<(), Status> {
        self.etcd_here()?;
        if !self.etcd.is_running(self.index) {
            return Err(Status::failed_precondition(format!(
                "failed to leave cluster: etcd is not running on {}",
                self.name
            )));
        }
        let st = self
            .etcd
            .status_at(self.index)
            .await
            .map_err(|e| etcd_failure(&self.name, &e))?;
        let list = self
            .etcd
            .member_list_at(self.index)
            .await
            .map_err(|e| etcd_failure(&self.name, &e))?;
        if !list.iter().any(|m| m.id == st.member_id) {
            return Err(Status::not_found(format!(
                "failed to leave cluster: etcd member {:x} ({}) not found",
                st.member_id, self.name
            )));
        }
        // Through a running sibling when there is one (as Talos' client, which knows every
        // control plane's endpoint): a member removing itself through its own etcd may
        // stop before it answers ("etcdserver: server stopped").
        let via = self
            .etcd
            .running()
            .into_iter()
            .find(|&i| i != self.index)
            .unwrap_or(self.index);
        if let Err(e) = self.etcd.remove_member_at(via, st.member_id).await {
            let gone = match self.etcd.member_list_at(via).await {
                Ok(list) => !list.iter().any(|m| m.id == st.member_id),
                Err(_) => false,
            };
            if !gone {
                return Err(Status::new(
                    etcd_code(&e),
                    format!(
                        "failed to leave cluster: failed to remove member {}: {e}",
                        st.member_id
                    ),
                ));
            }
        }
        self.etcd.kill_and_wipe(self.index);
        Ok(())
    }

    async fn leave_cluster(self: Arc<Self>) -> Result<pb::EtcdLeaveCluster, Status> {
        self.check_up()?;
        self.leave().await?;
        Ok(pb::EtcdLeaveCluster {
            metadata: self.metadata(),
        })
    }

    async fn remove_member_by_id(
        self: Arc<Self>,
        id: u64,
    ) -> Result<pb::EtcdRemoveMemberById, Status> {
        self.check_up()?;
        self.etcd_here()?;
        self.etcd
            .remove_member_at(self.index, id)
            .await
            .map_err(|e| {
                Status::new(etcd_code(&e), format!("failed to remove member {id}: {e}"))
            })?;
        Ok(pb::EtcdRemoveMemberById {
            metadata: self.metadata(),
        })
    }

    async fn system_stat(self: Arc<Self>) -> Result<pb::SystemStat, Status> {
        self.check_up()?;
        Ok(pb::SystemStat {
            metadata: self.metadata(),
            boot_time: self.boot_time.load(Ordering::SeqCst),
        })
    }

    /// Goes down now (after the call that asked it has been answered: the caller spawns
    /// this) and, unless it never comes back or `forever`, comes back after the downtime
    /// with a new boot time, running `into` (else the staged tag, else its own).
    async fn go_down(self: Arc<Self>, into: Option<String>, forever: bool) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let from = Instant::now();
        self.down.store(true, Ordering::SeqCst);
        self.reboots.fetch_add(1, Ordering::SeqCst);
        let k = {
            let mut d = self.downtimes.lock().expect("downtimes");
            d.push(Downtime {
                node: self.name.clone(),
                from,
                to: None,
            });
            d.len() - 1
        };
        if !self.worker {
            self.etcd.kill(self.index);
        }
        if forever || self.never_back.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(
            self.downtime_ms.load(Ordering::SeqCst),
        ))
        .await;
        if !self.worker
            && let Err(e) = self.etcd.restart(self.index).await
        {
            eprintln!("stand-in {}: {e}", self.name);
            return;
        }
        if let Some(c) = self.staged_config.lock().expect("staged config").take() {
            *self.config.lock().expect("config") = Some(c);
        }
        let next = into.or_else(|| self.staged.lock().expect("staged").take());
        if let Some(tag) = next {
            let mut v = self.version.lock().expect("version");
            let old = std::mem::replace(&mut v.0, tag);
            v.1 = old;
        }
        self.boot_time.fetch_add(100, Ordering::SeqCst);
        self.down.store(false, Ordering::SeqCst);
        self.downtimes.lock().expect("downtimes")[k].to = Some(Instant::now());
    }

    async fn apply_configuration(
        self: Arc<Self>,
        data: Vec<u8>,
        mode: i32,
        dry_run: bool,
    ) -> Result<pb::ApplyConfiguration, Status> {
        use pb::apply_configuration_request::Mode as M;
        self.check_up()?;
        let text = String::from_utf8(data)
            .map_err(|_| Status::invalid_argument("failed to parse config: not UTF-8"))?;
        if let Some(words) = self.refuse_configs.lock().expect("refusal").clone() {
            return Err(Status::invalid_argument(words));
        }
        if let Err(errors) = talos_checks(&text) {
            return Err(Status::invalid_argument(multierror(&errors)));
        }
        let install = |t: &str| -> Option<serde_json::Value> {
            use serde::Deserialize;
            serde_yaml::Deserializer::from_str(t)
                .filter_map(|d| serde_json::Value::deserialize(d).ok())
                .find(|d| d.get("version").is_some())
                .and_then(|d| d.get("machine").and_then(|m| m.get("install")).cloned())
        };
        let current = self.config.lock().expect("config").clone();
        let reboot = current
            .as_deref()
            .is_some_and(|c| install(c) != install(&text));
        let requested = M::try_from(mode).unwrap_or(M::Auto);
        let (chosen, details) = match requested {
            M::Staged => (
                M::Staged,
                "Staged configuration to be applied after the next reboot",
            ),
            M::NoReboot | M::Try if reboot => {
                return Err(Status::failed_precondition(
                    "apply configuration in no-reboot mode failed: the configuration change requires a reboot",
                ));
            }
            M::Auto | M::Reboot if reboot => (M::Reboot, "Applied configuration with a reboot"),
            M::Reboot => (M::Reboot, "Applied configuration with a reboot"),
            _ => (M::NoReboot, "Applied configuration without a reboot"),
        };
        // The first configuration, over the maintenance API: the node installs and boots
        // into it (a reboot), and serves the cluster's mTLS API from then on.
        if !dry_run && self.maintenance.load(Ordering::SeqCst) {
            *self.config.lock().expect("config") = Some(text);
            self.maintenance.store(false, Ordering::SeqCst);
            tokio::spawn(self.clone().go_down(None, false));
            return Ok(pb::ApplyConfiguration {
                metadata: self.metadata(),
                warnings: Vec::new(),
                mode: M::Reboot as i32,
                mode_details: "Applied configuration with a reboot".into(),
            });
        }
        // As Talos answers a dry run: its summary, then a diff of the configuration
        // (`configdiff.DiffConfigs`), secrets and all: the whole of it against a node that
        // has none yet.
        let diff = dry_run.then(|| {
            let old = self
                .config
                .lock()
                .expect("config")
                .clone()
                .unwrap_or_default();
            let mut diff = String::new();
            for l in old.lines().filter(|l| !text.lines().any(|n| n == *l)) {
                diff.push_str(&format!("-{l}\n"));
            }
            for l in text.lines().filter(|l| !old.lines().any(|o| o == *l)) {
                diff.push_str(&format!("+{l}\n"));
            }
            diff
        });
        if !dry_run {
            match chosen {
                M::Staged => *self.staged_config.lock().expect("staged config") = Some(text),
                M::Reboot => {
                    *self.config.lock().expect("config") = Some(text);
                    tokio::spawn(self.clone().go_down(None, false));
                }
                _ => *self.config.lock().expect("config") = Some(text),
            }
        }
        Ok(pb::ApplyConfiguration {
            metadata: self.metadata(),
            warnings: Vec::new(),
            mode: chosen as i32,
            mode_details: if let Some(diff) = diff {
                format!(
                    "Dry run summary:\n{details} (skipped in dry-run).\n\nConfig diff:\n\n{diff}"
                )
            } else {
                details.to_string()
            },
        })
    }

    async fn bootstrap(self: Arc<Self>) -> Result<pb::Bootstrap, Status> {
        self.check_up()?;
        self.etcd_here()?;
        self.bootstraps.fetch_add(1, Ordering::SeqCst);
        if self
            .refuse_bootstraps
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::failed_precondition(
                "the machine is not ready to be bootstrapped",
            ));
        }
        // A node whose etcd runs has data; one that never ran starts a cluster of its own.
        if self.etcd.is_running(self.index) || self.etcd.has_data(self.index) {
            return Err(Status::failed_precondition(
                "bootstrap is not available yet: etcd data directory is not empty",
            ));
        }
        // Talos starts etcd whether or not the caller waits for the answer: the start runs
        // on its own, so a caller that gave up (its deadline passed) does not stop it.
        let (etcd, index) = (self.etcd.clone(), self.index);
        tokio::spawn(async move { etcd.bootstrap(index).await })
            .await
            .map_err(|e| Status::internal(format!("the etcd start failed: {e}")))?
            .map_err(Status::failed_precondition)?;
        if self.lose_bootstrap_answer.load(Ordering::SeqCst) {
            return Err(Status::unavailable("connection reset by peer"));
        }
        Ok(pb::Bootstrap {
            metadata: self.metadata(),
        })
    }

    async fn reboot(self: Arc<Self>) -> Result<pb::Reboot, Status> {
        self.check_up()?;
        tokio::spawn(self.clone().go_down(None, false));
        Ok(pb::Reboot {
            metadata: self.metadata(),
            actor_id: format!("{}-reboot", self.name),
        })
    }

    async fn shutdown(self: Arc<Self>) -> Result<pb::Shutdown, Status> {
        self.check_up()?;
        tokio::spawn(self.clone().go_down(None, true));
        Ok(pb::Shutdown {
            metadata: self.metadata(),
            actor_id: format!("{}-shutdown", self.name),
        })
    }

    async fn upgrade(self: Arc<Self>, image: String) -> Result<pb::Upgrade, Status> {
        self.check_up()?;
        let Some(tag) = tag_of(&image) else {
            return Err(Status::invalid_argument(format!(
                "image {image:?} names no tag"
            )));
        };
        tokio::spawn(self.clone().go_down(Some(tag), false));
        Ok(pb::Upgrade {
            metadata: self.metadata(),
            ack: "Upgrade request received".into(),
            actor_id: format!("{}-upgrade", self.name),
        })
    }

    async fn rollback(self: Arc<Self>) -> Result<pb::Rollback, Status> {
        self.check_up()?;
        let previous = self.version.lock().expect("version").1.clone();
        tokio::spawn(self.clone().go_down(Some(previous), false));
        Ok(pb::Rollback {
            metadata: self.metadata(),
        })
    }

    async fn reset(self: Arc<Self>, graceful: bool) -> Result<pb::Reset, Status> {
        self.check_up()?;
        if !self.worker {
            if graceful && self.etcd.is_running(self.index) {
                self.forfeit().await?;
                self.leave().await?;
            }
            self.etcd.kill_and_wipe(self.index);
        }
        let n = self.resets.fetch_add(1, Ordering::SeqCst) + 1;
        self.wiped.store(true, Ordering::SeqCst);
        Ok(pb::Reset {
            metadata: self.metadata(),
            actor_id: format!("{}-reset-{n}", self.name),
        })
    }
}

/// Who the machine API answers: a configured node, only clients presenting a certificate
/// the cluster CA signed (a client without one: `Unauthenticated`); a node in maintenance
/// mode, only clients presenting none (`talosctl --insecure`). A maintenance node's
/// self-signed certificate fails a cluster client's handshake; the stand-in, which serves
/// one certificate, answers such a client `Unavailable` as that failed handshake reads.
fn mtls_or_maintenance(
    node: Arc<Node>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        let authenticated = req.peer_certs().is_some_and(|c| !c.is_empty());
        match (node.maintenance.load(Ordering::SeqCst), authenticated) {
            (false, false) => Err(Status::unauthenticated(
                "tls: client didn't provide a certificate",
            )),
            (true, true) => Err(Status::unavailable(
                "connection error: tls: the node serves its maintenance certificate, which the cluster CA did not sign",
            )),
            _ => Ok(req),
        }
    }
}

/// The tag of an image reference (`ghcr.io/siderolabs/installer:v1.12.1` -> `v1.12.1`).
fn tag_of(image: &str) -> Option<String> {
    let (_, tag) = image.rsplit_once(':')?;
    (!tag.is_empty() && !tag.contains('/')).then(|| tag.to_string())
}

/// The gRPC service of one stand-in.
#[derive(Clone)]
struct Service {
    node: Arc<Node>,
    registry: Registry,
    log: Log,
}

enum Target {
    Here,
    Node(String, Option<Arc<Node>>),
}

impl Service {
    fn target(&self, meta: &tonic::metadata::MetadataMap) -> Result<Target, Status> {
        let values: Vec<&str> = meta
            .get_all("node")
            .iter()
            .map(|v| v.to_str().unwrap_or(""))
            .collect();
        match values.as_slice() {
            [] => Ok(Target::Here),
            [one]
                if *one == self.node.name
                    || *one == self.node.addr.to_string()
                    || *one == super::etcd::peer_host(self.node.index) =>
            {
                Ok(Target::Here)
            }
            [one] => {
                let found = self.registry.lock().expect("registry").get(*one).cloned();
                Ok(Target::Node(one.to_string(), found))
            }
            _ => Err(Status::invalid_argument(
                "metadata key \"node\" must have exactly one value",
            )),
        }
    }

    /// Answers here, or as the targeted node with its failure in the entry's metadata.
    async fn answer<T, F, Fut>(
        &self,
        rpc: &'static str,
        meta: &tonic::metadata::MetadataMap,
        call: F,
        failed: fn(Option<Metadata>) -> T,
    ) -> Result<Vec<T>, Status>
    where
        F: FnOnce(Arc<Node>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.node.check_up()?;
        if self.node.maintenance.load(Ordering::SeqCst)
            && !matches!(rpc, "Version" | "ApplyConfiguration")
        {
            return Err(Status::unimplemented(format!(
                "{rpc} is not available in maintenance mode"
            )));
        }
        let target = self.target(meta)?;
        self.log.lock().expect("log").push(Call {
            rpc,
            via: self.node.name.clone(),
            node: match &target {
                Target::Here => self.node.name.clone(),
                Target::Node(_, Some(n)) => n.name.clone(),
                Target::Node(name, None) => name.clone(),
            },
        });
        let (name, result) = match target {
            Target::Here => return call(self.node.clone()).await.map(|t| vec![t]),
            Target::Node(name, None) => (
                name.clone(),
                Err(Status::unavailable(format!(
                    "connection error: desc = \"transport: Error while dialing: dial tcp: lookup {name}: no such host\""
                ))),
            ),
            Target::Node(name, Some(node)) if !node.serving.load(Ordering::SeqCst) => (
                name,
                Err(Status::unavailable(format!(
                    "connection error: desc = \"transport: Error while dialing: dial tcp {}: connect: connection refused\"",
                    node.addr
                ))),
            ),
            Target::Node(name, Some(node)) => (name, call(node).await),
        };
        Ok(vec![match result {
            Ok(t) => t,
            Err(status) => failed(Some(Metadata {
                hostname: name,
                error: format!(
                    "rpc error: code = {:?} desc = {}",
                    status.code(),
                    status.message()
                ),
                status: Some(rpc::Status {
                    code: status.code() as i32,
                    message: status.message().to_string(),
                    details: vec![],
                }),
            })),
        }])
    }
}

#[tonic::async_trait]
impl MachineService for Service {
    async fn etcd_member_list(
        &self,
        request: Request<pb::EtcdMemberListRequest>,
    ) -> Result<Response<pb::EtcdMemberListResponse>, Status> {
        let messages = self
            .answer(
                "EtcdMemberList",
                request.metadata(),
                Node::member_list,
                |metadata| pb::EtcdMembers {
                    metadata,
                    ..Default::default()
                },
            )
            .await?;
        Ok(Response::new(pb::EtcdMemberListResponse { messages }))
    }

    async fn etcd_remove_member_by_id(
        &self,
        request: Request<pb::EtcdRemoveMemberByIdRequest>,
    ) -> Result<Response<pb::EtcdRemoveMemberByIdResponse>, Status> {
        let id = request.get_ref().member_id;
        let messages = self
            .answer(
                "EtcdRemoveMemberByID",
                request.metadata(),
                move |node| node.remove_member_by_id(id),
                |metadata| pb::EtcdRemoveMemberById { metadata },
            )
            .await?;
        Ok(Response::new(pb::EtcdRemoveMemberByIdResponse { messages }))
    }

    async fn etcd_leave_cluster(
        &self,
        request: Request<pb::EtcdLeaveClusterRequest>,
    ) -> Result<Response<pb::EtcdLeaveClusterResponse>, Status> {
        let messages = self
            .answer(
                "EtcdLeaveCluster",
                request.metadata(),
                Node::leave_cluster,
                |metadata| pb::EtcdLeaveCluster { metadata },
            )
            .await?;
        Ok(Response::new(pb::EtcdLeaveClusterResponse { messages }))
    }

    async fn etcd_forfeit_leadership(
        &self,
        request: Request<pb::EtcdForfeitLeadershipRequest>,
    ) -> Result<Response<pb::EtcdForfeitLeadershipResponse>, Status> {
        let messages = self
            .answer(
                "EtcdForfeitLeadership",
                request.metadata(),
                Node::forfeit_leadership,
                |metadata| pb::EtcdForfeitLeadership {
                    metadata,
                    ..Default::default()
                },
            )
            .await?;
        Ok(Response::new(pb::EtcdForfeitLeadershipResponse {
            messages,
        }))
    }

    async fn etcd_status(
        &self,
        request: Request<()>,
    ) -> Result<Response<pb::EtcdStatusResponse>, Status> {
        let messages = self
            .answer("EtcdStatus", request.metadata(), Node::status, |metadata| {
                pb::EtcdStatus {
                    metadata,
                    ..Default::default()
                }
            })
            .await?;
        Ok(Response::new(pb::EtcdStatusResponse { messages }))
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        let graceful = request.get_ref().graceful;
        let messages = self
            .answer(
                "Reset",
                request.metadata(),
                move |node| node.reset(graceful),
                |metadata| pb::Reset {
                    metadata,
                    ..Default::default()
                },
            )
            .await?;
        Ok(Response::new(pb::ResetResponse { messages }))
    }

    async fn reboot(
        &self,
        request: Request<pb::RebootRequest>,
    ) -> Result<Response<pb::RebootResponse>, Status> {
        let messages = self
            .answer("Reboot", request.metadata(), Node::reboot, |metadata| {
                pb::Reboot {
                    metadata,
                    ..Default::default()
                }
            })
            .await?;
        Ok(Response::new(pb::RebootResponse { messages }))
    }

    async fn shutdown(
        &self,
        request: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        let messages = self
            .answer("Shutdown", request.metadata(), Node::shutdown, |metadata| {
                pb::Shutdown {
                    metadata,
                    ..Default::default()
                }
            })
            .await?;
        Ok(Response::new(pb::ShutdownResponse { messages }))
    }

    async fn upgrade(
        &self,
        request: Request<pb::UpgradeRequest>,
    ) -> Result<Response<pb::UpgradeResponse>, Status> {
        let image = request.get_ref().image.clone();
        let messages = self
            .answer(
                "Upgrade",
                request.metadata(),
                move |node| node.upgrade(image),
                |metadata| pb::Upgrade {
                    metadata,
                    ..Default::default()
                },
            )
            .await?;
        Ok(Response::new(pb::UpgradeResponse { messages }))
    }

    async fn rollback(
        &self,
        request: Request<pb::RollbackRequest>,
    ) -> Result<Response<pb::RollbackResponse>, Status> {
        let messages = self
            .answer("Rollback", request.metadata(), Node::rollback, |metadata| {
                pb::Rollback { metadata }
            })
            .await?;
        Ok(Response::new(pb::RollbackResponse { messages }))
    }

    async fn apply_configuration(
        &self,
        request: Request<pb::ApplyConfigurationRequest>,
    ) -> Result<Response<pb::ApplyConfigurationResponse>, Status> {
        let r = request.get_ref();
        let (data, mode, dry_run) = (r.data.clone(), r.mode, r.dry_run);
        let messages = self
            .answer(
                "ApplyConfiguration",
                request.metadata(),
                move |node| node.apply_configuration(data, mode, dry_run),
                |metadata| pb::ApplyConfiguration {
                    metadata,
                    ..Default::default()
                },
            )
            .await?;
        Ok(Response::new(pb::ApplyConfigurationResponse { messages }))
    }

    async fn bootstrap(
        &self,
        request: Request<pb::BootstrapRequest>,
    ) -> Result<Response<pb::BootstrapResponse>, Status> {
        let messages = self
            .answer(
                "Bootstrap",
                request.metadata(),
                Node::bootstrap,
                |metadata| pb::Bootstrap { metadata },
            )
            .await?;
        Ok(Response::new(pb::BootstrapResponse { messages }))
    }

    async fn system_stat(
        &self,
        request: Request<()>,
    ) -> Result<Response<pb::SystemStatResponse>, Status> {
        let messages = self
            .answer(
                "SystemStat",
                request.metadata(),
                Node::system_stat,
                |metadata| pb::SystemStat {
                    metadata,
                    ..Default::default()
                },
            )
            .await?;
        Ok(Response::new(pb::SystemStatResponse { messages }))
    }

    type EtcdSnapshotStream = Stream<ichor_rules::runtime::talos::proto::common::Data>;

    async fn etcd_snapshot(
        &self,
        request: Request<pb::EtcdSnapshotRequest>,
    ) -> Result<Response<Self::EtcdSnapshotStream>, Status> {
        self.direct("EtcdSnapshot", request.metadata())?;
        Ok(Response::new(SnapshotStream::snapshot(self).await?))
    }

    type ListStream = Stream<pb::FileInfo>;

    /// `List`, of `/var/lib/etcd` only (as Talos streams it: the directory itself, then its
    /// entries): one entry, `member`, while the node's etcd has data.
    async fn list(
        &self,
        request: Request<pb::ListRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        self.direct("List", request.metadata())?;
        let root = request.get_ref().root.trim_end_matches('/').to_string();
        if root != "/var/lib/etcd" {
            return Err(Status::unimplemented(format!(
                "the stand-in lists /var/lib/etcd only, not {root}"
            )));
        }
        let node = &self.node;
        let mut entries = vec![Ok(pb::FileInfo {
            name: root.clone(),
            relative_name: ".".into(),
            is_dir: true,
            ..Default::default()
        })];
        if !node.worker && node.etcd.has_data(node.index) {
            entries.push(Ok(pb::FileInfo {
                name: format!("{root}/member"),
                relative_name: "member".into(),
                is_dir: true,
                ..Default::default()
            }));
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(entries))))
    }

    async fn version(&self, request: Request<()>) -> Result<Response<pb::VersionResponse>, Status> {
        let messages = self
            .answer("Version", request.metadata(), Node::version, |metadata| {
                pb::Version {
                    metadata,
                    ..Default::default()
                }
            })
            .await?;
        Ok(Response::new(pb::VersionResponse { messages }))
    }
}

type Stream<T> = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
trait SnapshotStream {
    async fn snapshot(
        &self,
    ) -> Result<Stream<ichor_rules::runtime::talos::proto::common::Data>, Status>;
}

#[tonic::async_trait]
impl SnapshotStream for Service {
    /// `MachineService/EtcdSnapshot`: a real snapshot of this node's etcd member (etcd's
    /// `Maintenance/Snapshot` through its gateway: the database, then its sha256), in
    /// etcd's chunks cut to at most 64 KiB each, as Talos relays it.
    async fn snapshot(
        &self,
    ) -> Result<Stream<ichor_rules::runtime::talos::proto::common::Data>, Status> {
        let node = &self.node;
        let mut chunks = node
            .etcd
            .snapshot_at(node.index)
            .await
            .map_err(|e| etcd_failure(&node.name, &e))?;
        if node.corrupt_snapshot.load(Ordering::SeqCst)
            && let Some(first) = chunks.first_mut()
            && let half = first.len() / 2
            && let Some(b) = first.get_mut(half)
        {
            *b ^= 0x55;
        }
        if node.unreadable_snapshot.load(Ordering::SeqCst) {
            let mut whole = chunks.concat();
            let db_len = whole.len().saturating_sub(32);
            let zeroed = db_len.min(8192);
            whole[..zeroed].fill(0);
            let sha = ring::digest::digest(&ring::digest::SHA256, &whole[..db_len]);
            whole[db_len..].copy_from_slice(sha.as_ref());
            chunks = vec![whole];
        }
        let data: Vec<Result<ichor_rules::runtime::talos::proto::common::Data, Status>> = chunks
            .iter()
            .flat_map(|c| c.chunks(64 * 1024))
            .map(|c| {
                Ok(ichor_rules::runtime::talos::proto::common::Data {
                    metadata: None,
                    bytes: c.to_vec(),
                })
            })
            .collect();
        Ok(Box::pin(tokio_stream::iter(data)))
    }
}

impl Service {
    /// A streaming call, answered by this node only (no `node` proxying), recorded.
    fn direct(&self, rpc: &'static str, meta: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        self.node.check_up()?;
        if !matches!(self.target(meta)?, Target::Here) {
            return Err(Status::unimplemented(format!(
                "the stand-in answers {rpc} for the node dialled only"
            )));
        }
        self.log.lock().expect("log").push(Call {
            rpc,
            via: self.node.name.clone(),
            node: self.node.name.clone(),
        });
        Ok(())
    }
}

#[tonic::async_trait]
impl ImageService for Service {
    type PullStream = Stream<pb::ImageServicePullResponse>;

    async fn pull(
        &self,
        request: Request<pb::ImageServicePullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        self.direct("ImageService/Pull", request.metadata())?;
        let name = request.get_ref().image_ref.clone();
        if tag_of(&name).is_none() {
            return Err(Status::not_found(format!("image {name:?}: not found")));
        }
        let done = pb::ImageServicePullResponse {
            response: Some(pb::image_service_pull_response::Response::Name(name)),
        };
        Ok(Response::new(Box::pin(tokio_stream::iter(vec![Ok(done)]))))
    }
}

#[tonic::async_trait]
impl LifecycleService for Service {
    type UpgradeStream = Stream<pb::LifecycleServiceUpgradeResponse>;

    async fn upgrade(
        &self,
        request: Request<pb::LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        use pb::lifecycle_service_install_progress::Response as P;
        self.direct("LifecycleService/Upgrade", request.metadata())?;
        let image = request
            .get_ref()
            .source
            .as_ref()
            .map(|s| s.image_name.clone())
            .unwrap_or_default();
        let code = self.node.install_exit_code.load(Ordering::SeqCst);
        if code == 0
            && let Some(tag) = tag_of(&image)
        {
            *self.node.staged.lock().expect("staged") = Some(tag);
        }
        let progress = |r: P| {
            Ok(pb::LifecycleServiceUpgradeResponse {
                progress: Some(pb::LifecycleServiceInstallProgress { response: Some(r) }),
            })
        };
        let items = vec![
            progress(P::Message(format!("installing {image}"))),
            progress(P::Message(if code == 0 {
                "installed".into()
            } else {
                "the installer failed".into()
            })),
            progress(P::ExitCode(code)),
        ];
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

struct Running {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// One node's Talos API stand-in.
pub struct TalosNode {
    node: Arc<Node>,
    registry: Registry,
    log: Log,
    tls: ServerTlsConfig,
    running: Mutex<Option<Running>>,
}

impl TalosNode {
    /// The node's name (its etcd member name).
    pub fn name(&self) -> &str {
        &self.node.name
    }

    /// The index of its etcd member in the etcd harness.
    pub fn index(&self) -> usize {
        self.node.index
    }

    /// `127.0.0.1:port`, to dial.
    pub fn endpoint(&self) -> String {
        self.node.addr.to_string()
    }

    /// How many resets the node has carried out.
    pub fn resets(&self) -> usize {
        self.node.resets.load(Ordering::SeqCst)
    }

    /// Whether the node was reset (and answers `Unavailable` since).
    pub fn is_wiped(&self) -> bool {
        self.node.wiped.load(Ordering::SeqCst)
    }

    /// Whether the Talos API is served.
    pub fn is_serving(&self) -> bool {
        self.node.serving.load(Ordering::SeqCst)
    }

    /// How long a reboot keeps the node down (default 1 s).
    pub fn set_downtime(&self, d: Duration) {
        self.node.downtime_ms.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// From now on, a reboot takes the node down for good.
    pub fn never_back(&self) {
        self.node.never_back.store(true, Ordering::SeqCst);
    }

    /// Brings a node that never came back up again (someone fixed it): its etcd member
    /// restarted from its data, a new boot time, its downtime closed.
    pub async fn bring_back(&self) {
        self.node.never_back.store(false, Ordering::SeqCst);
        if !self.node.worker {
            self.node
                .etcd
                .restart(self.node.index)
                .await
                .expect("etcd member back");
        }
        self.node.boot_time.fetch_add(100, Ordering::SeqCst);
        self.node.down.store(false, Ordering::SeqCst);
        let now = Instant::now();
        for d in self.node.downtimes.lock().expect("downtimes").iter_mut() {
            if d.node == self.node.name && d.to.is_none() {
                d.to = Some(now);
            }
        }
    }

    /// Makes the snapshots it streams from now on corrupt (one byte of the database
    /// flipped), or sound again.
    pub fn corrupt_snapshots(&self, yes: bool) {
        self.node.corrupt_snapshot.store(yes, Ordering::SeqCst);
    }

    /// Makes the snapshots it streams from now on hold a database whose revision cannot
    /// be read (its meta pages zeroed, the trailing sha256 made to match), or sound again.
    pub fn unreadable_snapshots(&self, yes: bool) {
        self.node.unreadable_snapshot.store(yes, Ordering::SeqCst);
    }

    /// The `exit_code` its `LifecycleService/Upgrade` stream ends with.
    pub fn set_install_exit_code(&self, code: i32) {
        self.node.install_exit_code.store(code, Ordering::SeqCst);
    }

    /// Sets the running tag (an older Talos, for the legacy upgrade path).
    pub fn set_version(&self, tag: &str) {
        let mut v = self.node.version.lock().expect("version");
        v.0 = tag.to_string();
        v.1 = tag.to_string();
    }

    /// The running tag.
    pub fn version(&self) -> String {
        self.node.version.lock().expect("version").0.clone()
    }

    /// The current boot time.
    pub fn boot_time(&self) -> u64 {
        self.node.boot_time.load(Ordering::SeqCst)
    }

    /// How many times it went down (reboots, upgrades, rollbacks, shutdowns).
    /// The machine configuration applied (`ApplyConfiguration`), if any.
    pub fn config(&self) -> Option<String> {
        self.node.config.lock().expect("config").clone()
    }

    /// The configuration staged for the next boot, if any.
    pub fn staged_config(&self) -> Option<String> {
        self.node
            .staged_config
            .lock()
            .expect("staged config")
            .clone()
    }

    /// Puts the node in Talos' maintenance mode (before its first configuration): it
    /// answers only clients without a certificate, only `Version` and
    /// `ApplyConfiguration`; the first configuration applied makes it reboot into it.
    pub fn maintenance(&self) {
        self.node.maintenance.store(true, Ordering::SeqCst);
    }

    /// Whether the node is still in maintenance mode.
    pub fn in_maintenance(&self) -> bool {
        self.node.maintenance.load(Ordering::SeqCst)
    }

    /// From now on, a `Bootstrap` acts and then answers `Unavailable` (its answer lost).
    pub fn lose_bootstrap_answers(&self) {
        self.node
            .lose_bootstrap_answer
            .store(true, Ordering::SeqCst);
    }

    /// While `Some(words)`, every `ApplyConfiguration` (dry run or not) is refused
    /// (`InvalidArgument`) with these words, and changes nothing.
    pub fn refuse_configs(&self, words: Option<&str>) {
        *self.node.refuse_configs.lock().expect("refusal") = words.map(str::to_string);
    }

    /// The next `n` `Bootstrap` calls are refused (`FailedPrecondition`) without acting.
    pub fn refuse_bootstraps(&self, n: usize) {
        self.node.refuse_bootstraps.store(n, Ordering::SeqCst);
    }

    /// How many `Bootstrap` calls reached this node.
    pub fn bootstraps(&self) -> usize {
        self.node.bootstraps.load(Ordering::SeqCst)
    }

    pub fn reboots(&self) -> usize {
        self.node.reboots.load(Ordering::SeqCst)
    }

    /// Whether it is down now.
    pub fn is_down(&self) -> bool {
        self.node.down.load(Ordering::SeqCst)
    }

    /// Shuts the Talos API down: dials are refused from now on. Its etcd keeps running.
    pub async fn stop(&self) {
        self.node.serving.store(false, Ordering::SeqCst);
        let running = self.running.lock().expect("running").take();
        if let Some(Running { shutdown, mut task }) = running {
            let _ = shutdown.send(());
            if tokio::time::timeout(Duration::from_secs(2), &mut task)
                .await
                .is_err()
            {
                task.abort();
                let _ = task.await;
            }
        }
    }

    /// Serves the Talos API again on the same address (after [`TalosNode::stop`], or a
    /// reset: the node is back from its reboot, with no etcd member).
    pub async fn start_again(&self) {
        self.stop().await;
        let listener = tokio::net::TcpListener::bind(self.node.addr)
            .await
            .expect("rebind the stand-in's address");
        self.node.wiped.store(false, Ordering::SeqCst);
        self.serve(listener);
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let service = Service {
            node: self.node.clone(),
            registry: self.registry.clone(),
            log: self.log.clone(),
        };
        let (shutdown, rx) = oneshot::channel::<()>();
        let server = Server::builder()
            .tls_config(self.tls.clone())
            .expect("server TLS")
            .add_service(MachineServiceServer::with_interceptor(
                service.clone(),
                mtls_or_maintenance(self.node.clone()),
            ))
            .add_service(LifecycleServiceServer::new(service.clone()))
            .add_service(ImageServiceServer::new(service))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = rx.await;
                },
            );
        let task = tokio::spawn(async move {
            let _ = server.await;
        });
        self.node.serving.store(true, Ordering::SeqCst);
        *self.running.lock().expect("running") = Some(Running { shutdown, task });
    }
}

impl Drop for TalosNode {
    fn drop(&mut self) {
        self.node.serving.store(false, Ordering::SeqCst);
        if let Ok(mut running) = self.running.lock()
            && let Some(Running { shutdown, task }) = running.take()
        {
            let _ = shutdown.send(());
            task.abort();
        }
    }
}

/// The Talos API stand-ins of a cluster, one per etcd member, sharing one PKI and one
/// registry (so any of them proxies to the others by `node` metadata).
pub struct TalosApi {
    pub etcd: Arc<EtcdCluster>,
    pki: Pki,
    registry: Registry,
    log: Log,
    downtimes: Downtimes,
    nodes: Vec<TalosNode>,
}

impl TalosApi {
    /// Starts one stand-in per member of `etcd`.
    pub async fn start(etcd: Arc<EtcdCluster>) -> TalosApi {
        TalosApi::start_with_pki(etcd, Pki::new()).await
    }

    /// Starts one stand-in per member of `etcd`, serving `pki`'s certificate.
    pub async fn start_with_pki(etcd: Arc<EtcdCluster>, pki: Pki) -> TalosApi {
        let mut api = TalosApi {
            etcd: etcd.clone(),
            pki,
            registry: Arc::default(),
            log: Arc::default(),
            downtimes: Arc::default(),
            nodes: Vec::new(),
        };
        for i in 0..etcd.len() {
            api.add_node(i).await;
        }
        api
    }

    /// Starts the stand-in of etcd member `index` (e.g. after `EtcdCluster::add_member`).
    pub async fn add_node(&mut self, index: usize) -> &TalosNode {
        let name = self.etcd.name(index);
        self.add(name, index, false).await
    }

    /// Starts the stand-in of a worker named `name`: no etcd member, a node that reboots,
    /// upgrades and resets like the others. Its index (for its peer host) is past every
    /// etcd member's.
    pub async fn add_worker(&mut self, name: &str) -> &TalosNode {
        let index = 200 + self.nodes.iter().filter(|n| n.node.worker).count();
        self.add(name.to_string(), index, true).await
    }

    async fn add(&mut self, name: String, index: usize, worker: bool) -> &TalosNode {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a stand-in");
        let addr = listener.local_addr().expect("stand-in address");
        let node = Arc::new(Node {
            name,
            index,
            worker,
            addr,
            etcd: self.etcd.clone(),
            serving: AtomicBool::new(false),
            wiped: AtomicBool::new(false),
            resets: AtomicUsize::new(0),
            down: AtomicBool::new(false),
            boot_time: AtomicU64::new(FIRST_BOOT + index as u64),
            version: Mutex::new((VERSION_TAG.to_string(), VERSION_TAG.to_string())),
            staged: Mutex::new(None),
            downtime_ms: AtomicU64::new(1000),
            never_back: AtomicBool::new(false),
            install_exit_code: AtomicI32::new(0),
            corrupt_snapshot: AtomicBool::new(false),
            unreadable_snapshot: AtomicBool::new(false),
            reboots: AtomicUsize::new(0),
            downtimes: self.downtimes.clone(),
            config: Mutex::new(None),
            staged_config: Mutex::new(None),
            bootstraps: AtomicUsize::new(0),
            lose_bootstrap_answer: AtomicBool::new(false),
            refuse_bootstraps: AtomicUsize::new(0),
            refuse_configs: std::sync::Mutex::new(None),
            maintenance: AtomicBool::new(false),
        });
        {
            let mut registry = self.registry.lock().expect("registry");
            registry.insert(node.name.clone(), node.clone());
            registry.insert(addr.to_string(), node.clone());
            registry.insert(super::etcd::peer_host(index), node.clone());
        }
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(
                &self.pki.server_crt,
                &self.pki.server_key,
            ))
            .client_ca_root(Certificate::from_pem(&self.pki.ca_pem))
            .client_auth_optional(true);
        let talos = TalosNode {
            node,
            registry: self.registry.clone(),
            log: self.log.clone(),
            tls,
            running: Mutex::new(None),
        };
        talos.serve(listener);
        self.nodes.push(talos);
        self.nodes.last().expect("just pushed")
    }

    /// Stand-in `i` (the same index as its etcd member).
    pub fn node(&self, i: usize) -> &TalosNode {
        &self.nodes[i]
    }

    /// The stand-in named `name`.
    pub fn by_name(&self, name: &str) -> &TalosNode {
        self.nodes
            .iter()
            .find(|n| n.name() == name)
            .unwrap_or_else(|| panic!("no stand-in named {name}"))
    }

    /// Every call the stand-ins received so far, in order (their own record).
    pub fn calls(&self) -> Vec<Call> {
        self.log.lock().expect("log").clone()
    }

    /// Every time a node was down so far (its own record).
    pub fn downtimes(&self) -> Vec<Downtime> {
        self.downtimes.lock().expect("downtimes").clone()
    }

    /// The calls of `rpc` answered as node `node`.
    pub fn calls_to(&self, rpc: &str, node: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.rpc == rpc && c.node == node)
            .count()
    }

    /// The number of stand-ins.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// TLS material of the cluster's admin.
    pub fn tls(&self) -> TalosTls {
        self.pki.client_tls()
    }

    /// A client dialling stand-in `i` directly, with [`CLIENT_TIMEOUT`].
    pub fn client(&self, i: usize) -> TalosClient {
        TalosClient::new(&self.nodes[i].endpoint(), &self.tls(), CLIENT_TIMEOUT)
            .expect("Talos client")
    }

    /// A talosconfig (context `ichor-test`) listing every stand-in's endpoint and every
    /// node's name, with the cluster's CA and admin certificate.
    pub fn talosconfig_yaml(&self) -> String {
        let endpoints: Vec<String> = self.nodes.iter().map(TalosNode::endpoint).collect();
        let nodes: Vec<String> = self.nodes.iter().map(|n| n.name().to_string()).collect();
        self.pki.talosconfig("ichor-test", &endpoints, &nodes)
    }
}

/// The document kinds that have a `V1Alpha1ConflictValidate` in Talos (`main` of 2026-08-21,
/// `pkg/machinery/config/types/*/`): the ones [`v1alpha1_conflict`] knows.
pub const CONFLICTING_KINDS: &[&str] = &[
    "CRIBaseRuntimeSpecConfig",
    "DiscoveryIdentityConfig",
    "DiscoveryServiceConfig",
    "HostnameConfig",
    "ImageCacheConfig",
    "KubeAPIServerCAConfig",
    "KubeAPIServerConfig",
    "KubeAdmissionControlConfig",
    "KubeAggregatorCAConfig",
    "KubeAuditPolicyConfig",
    "KubeAuthorizerConfig",
    "KubeClusterConfig",
    "KubeControllerManagerConfig",
    "KubeCoreDNSConfig",
    "KubeCredentialProviderConfig",
    "KubeEtcdEncryptionConfig",
    "KubeFlannelCNIConfig",
    "KubeNetworkConfig",
    "KubeNodeConfig",
    "KubePrismConfig",
    "KubeProxyConfig",
    "KubeSchedulerConfig",
    "KubeServiceAccountConfig",
    "KubeSpanConfig",
    "KubeTalosAPIAccessConfig",
    "KubeletConfig",
    "ResolverConfig",
    "TimeSyncConfig",
    "UnattendedInstallConfig",
    "VolumeConfig",
];

/// What Talos' typed config makes of a value of the YAML (`go.yaml.in/yaml/v4` decoding
/// into Talos' structs), for the fields its conflict checks read.
mod typed {
    use serde_json::Value;

    /// The value at `path` (a JSON pointer), if there and not null: a Go pointer, map or
    /// slice that is not nil (`{}` and `[]` are not).
    pub fn non_nil<'v>(doc: &'v Value, path: &str) -> Option<&'v Value> {
        doc.pointer(path).filter(|v| !v.is_null())
    }

    /// A Go string that is not `""`.
    pub fn text(doc: &Value, path: &str) -> bool {
        non_nil(doc, path).is_some_and(|v| v.as_str() != Some(""))
    }

    /// A Go number that is not 0.
    pub fn number(doc: &Value, path: &str) -> bool {
        non_nil(doc, path).is_some_and(|v| v.as_f64().is_none_or(|n| n != 0.0))
    }

    /// A `*bool` read through `pointer.SafeDeref`: `true`.
    pub fn yes(doc: &Value, path: &str) -> bool {
        non_nil(doc, path).and_then(Value::as_bool) == Some(true)
    }

    /// `len(...) > 0` of a slice or a map.
    pub fn some(doc: &Value, path: &str) -> bool {
        match non_nil(doc, path) {
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(m)) => !m.is_empty(),
            _ => false,
        }
    }

    /// A `time.Duration` (Go's text: `1h2m3.5s`) that is not 0.
    pub fn duration(doc: &Value, path: &str) -> bool {
        match non_nil(doc, path) {
            Some(Value::String(t)) => t
                .split(|c: char| c.is_ascii_alphabetic() || c == 'µ')
                .filter(|n| !n.is_empty())
                .any(|n| n.parse::<f64>().is_ok_and(|n| n != 0.0)),
            Some(Value::Number(n)) => n.as_f64() != Some(0.0),
            _ => false,
        }
    }

    /// `Resolvers()`: the nameservers Go's `netip.ParseAddr` reads (others are dropped).
    pub fn addresses(doc: &Value, path: &str) -> bool {
        non_nil(doc, path)
            .and_then(Value::as_array)
            .is_some_and(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .any(|s| match s.rsplit_once('%') {
                        Some((ip, zone)) => {
                            !zone.is_empty() && ip.parse::<std::net::Ipv6Addr>().is_ok()
                        }
                        None => s.parse::<std::net::IpAddr>().is_ok(),
                    })
            })
    }

    /// A struct of pointers that is not its zero value (`value.IsZero`): a field not null.
    pub fn not_zero(doc: &Value, path: &str) -> bool {
        non_nil(doc, path)
            .and_then(Value::as_object)
            .is_some_and(|m| m.values().any(|v| !v.is_null()))
    }
}

/// Talos' `V1Alpha1ConflictValidate` of a document `doc` of `kind` against the machine
/// config `v1`: the error it returns (the first check that fails, in Talos' order, in
/// Talos' words), or none. Written from Talos' source for the stand-in, one arm per
/// document's validator (the file is named in each).
pub fn v1alpha1_conflict(kind: &str, doc: &Value, v1: &Value) -> Option<&'static str> {
    use typed::{addresses, duration, non_nil, not_zero, number, some, text, yes};
    let set = |p: &str| non_nil(v1, p).is_some();
    let first = |checks: &[(bool, &'static str)]| {
        checks.iter().find(|(hit, _)| *hit).map(|(_, words)| *words)
    };
    match kind {
        // k8s/apiserver.go
        "KubeAPIServerConfig" => first(&[
            (
                set("/cluster/apiServer"),
                "kube-apiserver config is already set in v1alpha1 config (.cluster.apiServer)",
            ),
            (
                number(v1, "/cluster/controlPlane/localAPIServerPort"),
                "kube-apiserver API port is already set in v1alpha1 config (.cluster.controlPlane.localAPIServerPort)",
            ),
        ]),
        // k8s/apiserver_ca.go
        "KubeAPIServerCAConfig" => first(&[(
            set("/cluster/ca"),
            "kube-apiserver CA is already set in v1alpha1 config (.cluster.ca)",
        )]),
        // k8s/aggregator_ca.go
        "KubeAggregatorCAConfig" => first(&[(
            set("/cluster/aggregatorCA"),
            "kube-apiserver aggregator CA is already set in v1alpha1 config (.cluster.aggregatorCA), please remove it and use the new KubeAggregatorCAConfig document instead",
        )]),
        // k8s/controller_manager.go (the field `MachineControlPlane` is `controlPlane`)
        "KubeControllerManagerConfig" => first(&[
            (
                set("/cluster/controllerManager"),
                "kube-controller-manager config is already set in v1alpha1 config (.cluster.controllerManager)",
            ),
            (
                set("/machine/controlPlane/controllerManager"),
                "kube-controller-manager config is already set in v1alpha1 config (.machine.controlplane.controllerManager)",
            ),
        ]),
        // k8s/scheduler.go
        "KubeSchedulerConfig" => first(&[
            (
                set("/cluster/scheduler"),
                "kube-scheduler config is already set in v1alpha1 config (.cluster.scheduler)",
            ),
            (
                set("/machine/controlPlane/scheduler"),
                "kube-scheduler config is already set in v1alpha1 config (.machine.controlplane.scheduler)",
            ),
        ]),
        // k8s/coredns.go
        "KubeCoreDNSConfig" => first(&[(
            set("/cluster/coreDNS"),
            "CoreDNS config is already set in v1alpha1 config (.cluster.coreDNS)",
        )]),
        // k8s/kubelet.go
        "KubeletConfig" => first(&[(
            set("/machine/kubelet"),
            "kubelet config is already set in v1alpha1 config (.machine.kubelet)",
        )]),
        // k8s/service_account.go
        "KubeServiceAccountConfig" => first(&[(
            set("/cluster/serviceAccount"),
            "service account is already set in v1alpha1 config (.cluster.serviceAccount)",
        )]),
        // k8s/node.go
        "KubeNodeConfig" => first(&[
            (
                set("/cluster/allowSchedulingOnControlPlanes"),
                ".cluster.allowSchedulingOnControlPlanes is already set in v1alpha1 config",
            ),
            (
                set("/cluster/allowSchedulingOnMasters"),
                ".cluster.allowSchedulingOnMasters is already set in v1alpha1 config",
            ),
            (
                set("/machine/kubelet/skipNodeRegistration"),
                ".machine.kubelet.skipNodeRegistration is already set in v1alpha1 config",
            ),
            (
                set("/machine/kubelet/registerWithFQDN"),
                ".machine.kubelet.registerWithFQDN is already set in v1alpha1 config",
            ),
            (
                set("/machine/kubelet/nodeIP"),
                ".machine.kubelet.nodeIP is already set in v1alpha1 config",
            ),
            (
                set("/machine/nodeLabels"),
                ".machine.nodeLabels is already set in v1alpha1 config",
            ),
            (
                set("/machine/nodeAnnotations"),
                ".machine.nodeAnnotations is already set in v1alpha1 config",
            ),
            (
                set("/machine/nodeTaints"),
                ".machine.nodeTaints is already set in v1alpha1 config",
            ),
        ]),
        // network/hostname.go
        "HostnameConfig" => first(&[
            (
                text(v1, "/machine/network/hostname"),
                "static hostname is already set in v1alpha1 config",
            ),
            (
                yes(v1, "/machine/features/stableHostname"),
                "stable hostname is already set in v1alpha1 config",
            ),
        ]),
        // network/resolver.go
        "ResolverConfig" => first(&[
            (
                set("/machine/network/searchDomains"),
                ".machine.network.searchDomains is already set in v1alpha1 config",
            ),
            (
                addresses(v1, "/machine/network/nameservers"),
                ".machine.network.nameservers is already set in v1alpha1 config",
            ),
            (
                yes(v1, "/machine/network/disableSearchDomain"),
                ".machine.network.disableSearchDomain is already set in v1alpha1 config",
            ),
            (
                not_zero(doc, "/hostDNS") && set("/machine/features/hostDNS"),
                ".machine.features.hostDNS is already set in v1alpha1 config",
            ),
        ]),
        // cluster/discovery_identity.go
        "DiscoveryIdentityConfig" => first(&[(
            text(v1, "/cluster/id") || text(v1, "/cluster/secret"),
            "cluster identity is already configured in .cluster.id/.cluster.secret of the v1alpha1 config",
        )]),
        // cluster/discovery_service.go
        "DiscoveryServiceConfig" => first(&[(
            set("/cluster/discovery"),
            "discovery service is already configured in .cluster.discovery of the v1alpha1 config",
        )]),
        // cri/base_runtime_spec.go: `.Object != nil` of an inline map, nil until a key.
        "CRIBaseRuntimeSpecConfig" => first(&[(
            some(v1, "/machine/baseRuntimeSpecOverrides"),
            "base runtime spec overrides are already set in v1alpha1 config",
        )]),
        // cri/image_cache.go
        "ImageCacheConfig" => first(&[(
            set("/machine/features/imageCache"),
            "image cache config is already set in v1alpha1 config",
        )]),
        // k8s/admission_control.go, k8s/authorization.go (the same check, the same words)
        "KubeAdmissionControlConfig" | "KubeAuthorizerConfig" => first(&[(
            some(v1, "/cluster/apiServer/admissionControl"),
            "admission control plugin config is already set in v1alpha1 config",
        )]),
        // k8s/audit_policy.go
        "KubeAuditPolicyConfig" => first(&[(
            some(v1, "/cluster/apiServer/auditPolicy"),
            "audit policy config is already set in v1alpha1 config",
        )]),
        // k8s/cluster.go (`Endpoint` is a `*Endpoint` that `""` parses into)
        "KubeClusterConfig" => first(&[
            (
                text(v1, "/cluster/clusterName"),
                "cluster name is already set in the v1alpha1 config (.cluster.clusterName). Please remove it and use only the new KubeClusterConfig document to avoid conflicts",
            ),
            (
                set("/cluster/controlPlane/endpoint"),
                "cluster endpoint is already set in the v1alpha1 config (.cluster.controlPlane.endpoint). Please remove it and use only the new KubeClusterConfig document to avoid conflicts",
            ),
        ]),
        // k8s/credential_provider.go
        "KubeCredentialProviderConfig" => first(&[(
            set("/machine/kubelet"),
            "cannot use KubeCredentialProviderConfig with legacy kubelet configuration (.machine.kubelet)",
        )]),
        // k8s/etcd_encryption.go
        "KubeEtcdEncryptionConfig" => first(&[(
            text(v1, "/cluster/secretboxEncryptionSecret")
                || text(v1, "/cluster/aescbcEncryptionSecret"),
            "etcd encryption config is already set in v1alpha1 config",
        )]),
        // k8s/flannel.go
        "KubeFlannelCNIConfig" => first(&[(
            set("/cluster/network"),
            "cluster network config in v1alpha1 config (.machine.cluster.network) can't be used with KubeFlannelCNIConfig document, please remove it to avoid conflicts",
        )]),
        // k8s/kubeprism.go
        "KubePrismConfig" => first(&[(
            set("/machine/features/kubePrism"),
            "KubePrism config in v1alpha1 config (.machine.features.kubePrism) can't be used with KubePrismConfig document, please remove it to avoid conflicts",
        )]),
        // k8s/network.go
        "KubeNetworkConfig" => first(&[(
            set("/cluster/network"),
            "cluster network config is already set in the v1alpha1 config (.machine.cluster.network). Please remove it and use only the new KubeNetworkConfig document to avoid conflicts",
        )]),
        // k8s/proxy.go
        "KubeProxyConfig" => first(&[(
            set("/cluster/proxy"),
            "cluster proxy config in v1alpha1 config (.machine.cluster.proxy) can't be used with KubeProxyConfig document, please remove it to avoid conflicts",
        )]),
        // k8s/talos_api_access.go
        "KubeTalosAPIAccessConfig" => first(&[(
            set("/machine/features/kubernetesTalosAPIAccess"),
            ".machine.features.kubernetesTalosAPIAccess is already set in v1alpha1 config",
        )]),
        // network/kubespan.go
        "KubeSpanConfig" => first(&[(
            set("/machine/network/kubespan"),
            "kubespan is already configured in v1alpha1 machine.network.kubespan",
        )]),
        // network/time_sync.go: nothing when `machine.time` is not there.
        "TimeSyncConfig" if set("/machine/time") => first(&[
            (
                yes(v1, "/machine/time/disabled"),
                "time sync cannot be disabled in both v1alpha1 and new-style configuration",
            ),
            (
                some(v1, "/machine/time/servers"),
                "time servers cannot be specified in both v1alpha1 and new-style configuration",
            ),
            (
                duration(v1, "/machine/time/bootTimeout"),
                "boot timeout cannot be specified in both v1alpha1 and new-style configuration",
            ),
        ]),
        // runtime/unattended_install.go
        "UnattendedInstallConfig" => first(&[(
            set("/machine/install"),
            "UnattendedInstallConfig config is incompatible with v1alpha1 config (.machine.install)",
        )]),
        // block/volume_config.go: STATE and EPHEMERAL only, encrypted (provider not
        // `none`), next to the legacy encryption of that partition.
        "VolumeConfig" => {
            let encrypted = doc
                .pointer("/encryption/provider")
                .and_then(Value::as_str)
                .is_some_and(|p| p != "none");
            match doc.get("name").and_then(Value::as_str) {
                Some("STATE") if encrypted && set("/machine/systemDiskEncryption/state") => Some(
                    "system disk encryption for \"STATE\" is configured in both v1alpha1.Config and VolumeConfig",
                ),
                Some("EPHEMERAL")
                    if encrypted && set("/machine/systemDiskEncryption/ephemeral") =>
                {
                    Some(
                        "system disk encryption for \"EPHEMERAL\" is configured in both v1alpha1.Config and VolumeConfig",
                    )
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// What the stand-in checks of a configuration, as Talos does (its container's `validate`):
/// it parses, it has a `v1alpha1` document with a `machine.type`, and no document conflicts
/// with it ([`v1alpha1_conflict`]). Every error, as Talos reports them all.
pub fn talos_checks(text: &str) -> Result<(), Vec<String>> {
    use serde::Deserialize;
    let mut docs = Vec::new();
    for d in serde_yaml::Deserializer::from_str(text) {
        let v = serde_json::Value::deserialize(d)
            .map_err(|e| vec![format!("failed to parse config: {e}")])?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    let v1 = docs
        .iter()
        .find(|d| d.get("version").and_then(|v| v.as_str()) == Some("v1alpha1"))
        .ok_or_else(|| vec!["no v1alpha1 document: machine config is required".to_string()])?;
    let mut errors = Vec::new();
    if v1
        .pointer("/machine/type")
        .and_then(|t| t.as_str())
        .is_none()
    {
        errors.push("machine type is required".to_string());
    }
    for d in &docs {
        if let Some(kind) = d.get("kind").and_then(|k| k.as_str())
            && let Some(words) = v1alpha1_conflict(kind, d, v1)
        {
            errors.push(words.to_string());
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Errors as Talos' `hashicorp/go-multierror` writes them.
fn multierror(errors: &[String]) -> String {
    let mut text = match errors.len() {
        1 => "1 error occurred:".to_string(),
        n => format!("{n} errors occurred:"),
    };
    for e in errors {
        text.push_str(&format!("\n\t* {e}"));
    }
    text.push_str("\n\n");
    text
}
