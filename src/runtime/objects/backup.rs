//! `TalosEtcdBackup` (issue 36): where a cluster's etcd snapshots go (an S3-compatible store
//! outside the cluster), how often, how many are kept and with which key they are
//! encrypted; and the two things every part reads of it: whether its spec is sound
//! ([`validate_backup_spec`], every problem said with where it is and how to fix it) and
//! whether its store is inside the cluster it backs up ([`store_in_cluster`], ADR 0106 §2).

use super::{ClusterRef, Condition, TalosCluster, find, name_of, namespace_of};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// The annotation that asks for a snapshot now (any new value takes one).
pub const SNAPSHOT_NOW_ANNOTATION: &str = "ichor.maesh.dev/snapshot-now";

/// The Secret keys read for the store's access keys when the reference names none.
pub const DEFAULT_ACCESS_KEY_ID_KEY: &str = "AWS_ACCESS_KEY_ID";
pub const DEFAULT_SECRET_ACCESS_KEY_KEY: &str = "AWS_SECRET_ACCESS_KEY";

/// Talos' default pod and service ranges, for a cluster that declares none.
pub const DEFAULT_POD_SUBNETS: &[&str] = &["10.244.0.0/16"];
pub const DEFAULT_SERVICE_SUBNETS: &[&str] = &["10.96.0.0/12"];

/// etcd snapshots of a TalosCluster, taken on a schedule, verified, and kept in an
/// S3-compatible store outside the cluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosEtcdBackup",
    doc = "etcd snapshots of a TalosCluster, kept in an S3-compatible store outside the cluster.",
    namespaced,
    selectable = ".spec.clusterRef.name",
    status = "BackupStatus",
    shortname = "teb",
    category = "ichor",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"InCluster","type":"string","jsonPath":".status.conditions[?(@.type==\"StoreInCluster\")].status"}"#,
    printcolumn = r#"{"name":"Last","type":"date","jsonPath":".status.lastSnapshot.time"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","priority":1,"jsonPath":".spec.store.endpoint"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    #[serde(default)]
    pub cluster_ref: ClusterRef,
    /// Where the snapshots go.
    #[serde(default)]
    pub store: StoreSpec,
    /// When snapshots are taken.
    #[serde(default)]
    pub schedule: ScheduleSpec,
    /// Which snapshots are kept; every snapshot is kept without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,
    /// Encrypts each snapshot with a key from a Secret; the key never leaves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionSpec>,
}

/// An S3-compatible store.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreSpec {
    /// The store's URL, `https://host[:port]` (or `http://` for a store on a trusted
    /// network), e.g. `https://s3.eu-west-1.amazonaws.com` or `https://minio.backup.example:9000`.
    /// It must be outside the cluster being backed up (ADR 0106 §2).
    #[serde(default)]
    #[schemars(length(min = 1, max = 2048))]
    pub endpoint: String,
    /// The bucket (it must exist; the controller does not create it).
    #[serde(default)]
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,
    /// The key prefix of this backup's snapshots (e.g. `prod/`); the bucket's root without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub prefix: Option<String>,
    /// The region to sign requests for; `us-east-1` without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub region: Option<String>,
    /// The Secret (in this backup's namespace) holding the access keys, read live by the
    /// controller at each use and never logged.
    #[serde(default)]
    pub credentials_secret_ref: CredentialsSecretRef,
}

/// The Secret holding a store's access keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsSecretRef {
    /// Name of the Secret.
    #[serde(default)]
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key holding the access key ID; `AWS_ACCESS_KEY_ID` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub access_key_id_key: Option<String>,
    /// The key holding the secret access key; `AWS_SECRET_ACCESS_KEY` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_access_key_key: Option<String>,
}

impl CredentialsSecretRef {
    pub fn access_key_id_key(&self) -> &str {
        self.access_key_id_key
            .as_deref()
            .filter(|k| !k.is_empty())
            .unwrap_or(DEFAULT_ACCESS_KEY_ID_KEY)
    }

    pub fn secret_access_key_key(&self) -> &str {
        self.secret_access_key_key
            .as_deref()
            .filter(|k| !k.is_empty())
            .unwrap_or(DEFAULT_SECRET_ACCESS_KEY_KEY)
    }
}

/// When snapshots are taken.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleSpec {
    /// The time between snapshots, as `<n><unit>` parts with units `s`, `m`, `h`, `d`
    /// (e.g. `6h`, `1h30m`, `1d`); at least `1m`. Give this or `cron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 32))]
    pub interval: Option<String>,
    /// When to take snapshots, as a cron expression in UTC (five fields, minute first, e.g.
    /// `0 */6 * * *`; `@daily` and the like too). Give this or `interval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub cron: Option<String>,
}

/// Which snapshots are kept. With both, a snapshot goes once it is neither among the last
/// `keepLast` nor newer than `maxAge`. Only snapshots this backup wrote are ever deleted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    /// Keep the newest N verified snapshots (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub keep_last: Option<u32>,
    /// Keep snapshots newer than this (`7d`, `36h`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 32))]
    pub max_age: Option<String>,
}

/// The key each snapshot is encrypted with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionSpec {
    /// A key of a Secret in this backup's namespace holding the encryption key.
    pub key_secret_ref: super::SecretKeyRef,
}

/// One snapshot in the store, as the controller verified it. Every field is written, an
/// absent one as null: the status is written as a merge patch, and a field left out would
/// keep the value of the snapshot before (a revision, a request) in `lastSnapshot`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    /// When it was taken.
    pub time: Time,
    /// Its object key in the bucket.
    pub key: String,
    /// Its size in the store, bytes.
    pub size: u64,
    /// The etcd revision it holds, read from the snapshot's database as it streamed (the
    /// last revision of etcd's `key` bucket, or its compaction revision when later): what
    /// etcd restored from it reports. Absent when the database could not be read for it
    /// (`revisionUnread` says why): never a guessed number.
    #[serde(default)]
    pub revision: Option<i64>,
    /// Why no revision is recorded, when none is.
    #[serde(default)]
    pub revision_unread: Option<String>,
    /// The sha256 of the snapshot, hex.
    #[serde(default)]
    pub sha256: String,
    /// The node it was streamed from.
    #[serde(default)]
    pub node: String,
    /// The etcd member's applied raft index when the snapshot began (the snapshot holds at
    /// least everything applied up to it).
    #[serde(default)]
    pub raft_index: Option<u64>,
    /// Encrypted in the store (AES-256-GCM, with the key of spec.encryption).
    #[serde(default)]
    pub encrypted: bool,
    /// The on-demand request it answered (the annotation's value, or `TalosOperation
    /// <name> (<uid>)`); none when the schedule took it.
    #[serde(default)]
    pub request: Option<String>,
}

/// A snapshot being streamed into the store: written before the first byte goes, so a
/// controller that stops mid-snapshot finds it, deletes whatever is under its key and
/// never counts it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInProgress {
    /// Its object key.
    pub key: String,
    /// The node it streams from.
    pub node: String,
    /// When it began.
    pub started: Time,
}

/// What the controller observed of a backup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// Ready (InvalidSpec, ...), StoreInCluster (a warning: True when the store is inside
    /// the cluster it backs up, ADR 0106 §2).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The newest verified snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<SnapshotRecord>,
    /// Every verified snapshot this backup wrote that is still kept, oldest first: the
    /// only objects retention ever deletes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotRecord>,
    /// The keys retention is deleting: taken out of `snapshots` (so no longer counted) and
    /// recorded here before any deletion is made, and dropped from here once the store has
    /// deleted them. A crash in between leaves them here, and the next reconcile deletes
    /// them first: no kept record names a deleted object, and no object is forgotten.
    /// (Always written, `[]` when none, so a reader sees the list emptied; the status
    /// write names removed fields with `null` too: `controller::status::merge_patch`.)
    #[serde(default)]
    pub pruning: Vec<String>,
    /// The snapshot being taken (null when none): see [`SnapshotInProgress`].
    #[serde(default)]
    pub in_progress: Option<SnapshotInProgress>,
    /// When the last snapshot was begun, whatever came of it (the schedule counts from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<Time>,
    /// The last on-demand request served: the value of the annotation
    /// `ichor.maesh.dev/snapshot-now`, or `TalosOperation <name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request: Option<String>,
}

impl TalosEtcdBackup {
    pub fn name(&self) -> &str {
        name_of(&self.metadata)
    }

    pub fn namespace(&self) -> &str {
        namespace_of(&self.metadata)
    }

    pub fn cluster(&self) -> &str {
        &self.spec.cluster_ref.name
    }

    pub fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or(&[])
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        find(self.conditions(), type_)
    }

    /// Whether `other`'s status holds the same as this one's in everything but its
    /// conditions: the snapshots (the fresh-backup rules read the last one; retention
    /// deletes what `snapshots` and `pruning` name), the one in progress, the last attempt
    /// and the last request served (the schedule and the on-demand requests count from
    /// them). A status that is absent holds nothing.
    pub fn same_status_reads(&self, other: &TalosEtcdBackup) -> bool {
        let reads = |b: &TalosEtcdBackup| {
            let mut s = b.status.clone().unwrap_or_default();
            s.conditions.clear();
            s
        };
        reads(self) == reads(other)
    }

    /// Why its store is inside `cluster` (ADR 0106 §2), or `None`.
    pub fn store_in_cluster(&self, cluster: Option<&TalosCluster>) -> Option<String> {
        let network = cluster.and_then(|c| c.spec.network.as_ref());
        store_in_cluster(&self.spec.store.endpoint, network)
    }
}

/// The pod and service ranges of a cluster (`cluster.network` of its Talos config).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    /// The pod ranges (CIDR); Talos' default `10.244.0.0/16` when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_subnets: Vec<String>,
    /// The service ranges (CIDR); Talos' default `10.96.0.0/12` when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_subnets: Vec<String>,
}

/// The parts of a store endpoint the controller uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub https: bool,
    /// The host: a DNS name (lowercase, no trailing dot) or an IP address (without brackets).
    pub host: String,
    pub port: Option<u16>,
}

/// Parses a store endpoint, `http(s)://host[:port][/]`, saying what is wrong and how to fix
/// it when it is not one.
pub fn parse_endpoint(endpoint: &str) -> Result<Endpoint, String> {
    let shown = clip(endpoint);
    let (https, rest) = if let Some(r) = endpoint.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = endpoint.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!(
            "spec.store.endpoint `{shown}` is not a URL the controller can use: it must start with \
             `https://` (or `http://`), e.g. `https://s3.example.com:9000`"
        ));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Err(format!(
            "spec.store.endpoint `{shown}` has a path, query or fragment; give the store's base \
             URL only (`https://host[:port]`) and put the key prefix in spec.store.prefix"
        ));
    }
    if rest.contains('@') {
        return Err(format!(
            "spec.store.endpoint `{}` carries user information (`user@`); access keys belong \
             in the Secret spec.store.credentialsSecretRef names, never in the URL",
            clip(endpoint.split('@').next_back().unwrap_or(""))
        ));
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err(format!(
                "spec.store.endpoint `{shown}`: an IPv6 address must be closed with `]`"
            ));
        };
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                format!("spec.store.endpoint `{shown}`: expected `:port` after the IPv6 address")
            })?),
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!(
                "spec.store.endpoint `{shown}`: `[{}]` is not an IPv6 address",
                clip(addr)
            ));
        }
        (addr.to_string(), port)
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (rest.to_string(), None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return Err(format!(
                    "spec.store.endpoint `{shown}`: the port `{}` is not a number from 1 to 65535",
                    clip(p)
                ));
            }
        },
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() {
        return Err(format!(
            "spec.store.endpoint `{shown}` names no host; e.g. `https://s3.example.com`"
        ));
    }
    if host.parse::<IpAddr>().is_err() && !valid_dns_name(&host) {
        return Err(format!(
            "spec.store.endpoint `{shown}`: `{}` is neither an IP address nor a DNS name (letters, \
             digits and `-` in dot-separated labels of at most 63 characters)",
            clip(&host)
        ));
    }
    Ok(Endpoint { https, host, port })
}

fn valid_dns_name(host: &str) -> bool {
    host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// At most 100 characters of input, escaped, for a message.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(100).flat_map(char::escape_debug).collect();
    if s.chars().count() > 100 {
        out.push('…');
    }
    out
}

/// A CIDR range, `address/prefix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, p) = s.trim().split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        let prefix: u8 = p.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            // An IPv4 address written as IPv6 (`::ffff:10.96.0.1`) is that IPv4 address.
            (IpAddr::V4(_), IpAddr::V6(v6)) => v6
                .to_ipv4_mapped()
                .is_some_and(|v4| self.contains(IpAddr::V4(v4))),
            (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }
}

/// Why a store at `endpoint` is inside the cluster whose network is `network` (ADR 0106
/// §2), or `None`: its host ends in `.svc` or `.svc.cluster.local` (a Kubernetes Service
/// name), or is an IP address inside the cluster's pod or service ranges (Talos' defaults,
/// `10.244.0.0/16` and `10.96.0.0/12`, for ranges the cluster does not declare).
///
/// Not recognised (the seed's limits): a short Service name such as `minio.minio`, and a
/// name that resolves to a cluster address; names are not resolved. An endpoint that is
/// not a URL at all is not judged here ([`validate_backup_spec`] reports it).
pub fn store_in_cluster(endpoint: &str, network: Option<&ClusterNetwork>) -> Option<String> {
    let ep = parse_endpoint(endpoint).ok()?;
    if ep.host.ends_with(".svc") || ep.host.ends_with(".svc.cluster.local") {
        return Some(format!(
            "its endpoint host `{}` is a Kubernetes Service name of the cluster",
            ep.host
        ));
    }
    let ip: IpAddr = ep.host.parse().ok()?;
    let declared = |v: Option<&Vec<String>>, default: &'static [&'static str]| -> Vec<String> {
        match v {
            Some(v) if !v.is_empty() => v.clone(),
            _ => default.iter().map(|s| s.to_string()).collect(),
        }
    };
    let pods = declared(network.map(|n| &n.pod_subnets), DEFAULT_POD_SUBNETS);
    let services = declared(network.map(|n| &n.service_subnets), DEFAULT_SERVICE_SUBNETS);
    for (what, ranges) in [("pod", &pods), ("service", &services)] {
        if let Some(range) = ranges
            .iter()
            .find(|r| Cidr::parse(r).is_some_and(|c| c.contains(ip)))
        {
            return Some(format!(
                "its endpoint address {ip} is inside the cluster's {what} range {range}"
            ));
        }
    }
    None
}

/// A duration as `<n><unit>` parts (`s`, `m`, `h`, `d`), e.g. `6h`, `1h30m`, `7d`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let not_one = || {
        format!(
            "`{}` is not a duration: write `<number><unit>` parts with units s, m, h, d (e.g. `6h`, `1h30m`)",
            clip(s)
        )
    };
    let mut total: u64 = 0;
    let mut digits = String::new();
    let mut parts = 0;
    for c in s.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(not_one()),
        };
        if digits.is_empty() {
            return Err(not_one());
        }
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("`{}` is too long", clip(s)))?;
        total = n
            .checked_mul(unit)
            .and_then(|x| total.checked_add(x))
            .ok_or_else(|| format!("`{}` is too long", clip(s)))?;
        digits.clear();
        parts += 1;
    }
    if !digits.is_empty() || parts == 0 {
        return Err(not_one());
    }
    Ok(std::time::Duration::from_secs(total))
}

/// When a backup's snapshots are due: every interval, or at the times of a cron
/// expression (UTC).
#[derive(Clone, Debug)]
pub enum Every {
    Interval(std::time::Duration),
    Cron(Box<cron::Schedule>),
}

impl Every {
    /// The schedule `spec` says, or what is wrong with it and how to fix it.
    pub fn of(spec: &ScheduleSpec) -> Result<Every, String> {
        match (spec.interval.as_deref(), spec.cron.as_deref()) {
            (None, None) => Err(
                "spec.schedule names neither an interval nor a cron expression; say how often to \
                 take a snapshot, e.g. `interval: 6h` or `cron: \"0 */6 * * *\"`"
                    .into(),
            ),
            (Some(_), Some(_)) => {
                Err("spec.schedule has both an interval and a cron expression; keep one".into())
            }
            (Some(i), None) => match parse_duration(i) {
                Err(e) => Err(format!("spec.schedule.interval {e}")),
                Ok(d) if d < MIN_INTERVAL => Err(format!(
                    "spec.schedule.interval `{}` is shorter than 1m; snapshots load etcd, take them \
                     at most once a minute",
                    clip(i)
                )),
                Ok(d) => Ok(Every::Interval(d)),
            },
            (None, Some(c)) => parse_cron(c).map(|s| Every::Cron(Box::new(s))),
        }
    }

    /// The first time after `t` a snapshot is due (`None`: a cron expression that never
    /// comes again).
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        match self {
            Every::Interval(d) => t.checked_add(*d).ok(),
            Every::Cron(s) => {
                let at = chrono::DateTime::<chrono::Utc>::from_timestamp(t.as_second(), 0)?;
                let next = s.after(&at).next()?;
                Timestamp::from_second(next.timestamp()).ok()
            }
        }
    }
}

/// A five-field cron expression (minute, hour, day of month, month, day of week; UTC), or
/// one of `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`: through the `cron` crate,
/// with the seconds field fixed at 0 (so never more than once a minute).
fn parse_cron(c: &str) -> Result<cron::Schedule, String> {
    use std::str::FromStr;
    let c = c.trim();
    let fields = c.split_whitespace().count();
    let full = if c.starts_with('@') {
        c.to_string()
    } else if fields == 5 {
        format!("0 {c}")
    } else {
        return Err(format!(
            "spec.schedule.cron `{}` has {fields} fields; write five (minute hour day-of-month \
             month day-of-week, in UTC), e.g. `0 */6 * * *`, or `@daily`",
            clip(c)
        ));
    };
    cron::Schedule::from_str(&full).map_err(|e| {
        format!(
            "spec.schedule.cron `{}` is not a cron expression ({e}); write five fields (minute \
             hour day-of-month month day-of-week, in UTC), e.g. `0 */6 * * *`, or `@daily`",
            clip(c)
        )
    })
}

/// The shortest interval between scheduled snapshots.
pub const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Every problem of a backup's spec, each saying where it is and how to fix it (empty when
/// the spec is sound). The controller reports them as `Ready=False InvalidSpec` and takes
/// no snapshot until they are fixed.
pub fn validate_backup_spec(spec: &BackupSpec) -> Vec<String> {
    let mut errors = Vec::new();
    if spec.cluster_ref.name.is_empty() {
        errors.push("spec.clusterRef.name is empty; name the TalosCluster to back up".into());
    }
    let store = &spec.store;
    if let Err(e) = parse_endpoint(&store.endpoint) {
        errors.push(e);
    }
    if !valid_bucket(&store.bucket) {
        errors.push(format!(
            "spec.store.bucket `{}` is not an S3 bucket name: 3 to 63 lowercase letters, digits, \
             `.` and `-`, starting and ending with a letter or digit",
            clip(&store.bucket)
        ));
    }
    if let Some(p) = &store.prefix
        && (p.starts_with('/')
            || p.split('/').any(|s| s == "." || s == "..")
            || p.len() > 512
            || p.chars().any(char::is_control))
    {
        errors.push(format!(
            "spec.store.prefix `{}` must be a relative key prefix (no leading `/`, no `.` or `..` \
             segments, no control characters, at most 512 bytes), e.g. `prod/etcd/`",
            clip(p)
        ));
    }
    if let Some(r) = &store.region
        && (r.is_empty()
            || r.len() > 64
            || !r
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    {
        errors.push(format!(
            "spec.store.region `{}` is not a region name (lowercase letters, digits and `-`, \
             e.g. `us-east-1`)",
            clip(r)
        ));
    }
    let creds = &store.credentials_secret_ref;
    if creds.name.is_empty() {
        errors.push(
            "spec.store.credentialsSecretRef.name is empty; name the Secret holding the store's \
             access keys (keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
                .into(),
        );
    }
    if let Err(e) = Every::of(&spec.schedule) {
        errors.push(e);
    }
    if let Some(r) = &spec.retention {
        if r.keep_last == Some(0) {
            errors.push(
                "spec.retention.keepLast is 0, which would delete every snapshot; keep at least 1"
                    .into(),
            );
        }
        if let Some(a) = &r.max_age
            && let Err(e) = parse_duration(a)
        {
            errors.push(format!("spec.retention.maxAge {e}"));
        }
    }
    if let Some(e) = &spec.encryption
        && e.key_secret_ref.name.is_empty()
    {
        errors.push(
            "spec.encryption.keySecretRef.name is empty; name the Secret holding the key, or \
             remove spec.encryption"
                .into(),
        );
    }
    errors
}

fn valid_bucket(b: &str) -> bool {
    (3..=63).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
        && b.bytes().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.bytes().last().is_some_and(|c| c.is_ascii_alphanumeric())
        && !b.contains("..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(pods: &[&str], services: &[&str]) -> ClusterNetwork {
        ClusterNetwork {
            pod_subnets: pods.iter().map(|s| s.to_string()).collect(),
            service_subnets: services.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn service_names_are_inside_the_cluster() {
        for e in [
            "http://minio.minio.svc:9000",
            "https://minio.minio.svc.cluster.local",
            "https://MINIO.backup.SVC.cluster.local.:443/",
        ] {
            assert!(store_in_cluster(e, None).is_some(), "{e}");
        }
        // The seed's limits: a short name, and a name that only resolves inside.
        for e in [
            "http://minio.minio:9000",
            "https://s3.example.com",
            "https://svc.example.com",
        ] {
            assert_eq!(store_in_cluster(e, None), None, "{e}");
        }
    }

    #[test]
    fn addresses_in_the_default_or_declared_ranges_are_inside() {
        let why = store_in_cluster("http://10.96.0.10:9000", None).unwrap();
        assert_eq!(
            why,
            "its endpoint address 10.96.0.10 is inside the cluster's service range 10.96.0.0/12"
        );
        assert!(
            store_in_cluster("http://10.244.3.4", None)
                .unwrap()
                .contains("pod range 10.244.0.0/16")
        );
        assert_eq!(store_in_cluster("http://10.112.0.1", None), None); // past /12
        assert_eq!(store_in_cluster("http://192.168.1.10:9000", None), None);
        // Declared ranges replace the defaults.
        let n = net(&["172.16.0.0/16"], &["fd00:10::/108"]);
        assert!(store_in_cluster("http://172.16.9.9", Some(&n)).is_some());
        assert!(store_in_cluster("http://[fd00:10::5]:9000", Some(&n)).is_some());
        assert_eq!(store_in_cluster("http://10.96.0.10", Some(&n)), None);
        // Only the declared kind is replaced.
        let pods_only = net(&["172.16.0.0/16"], &[]);
        assert!(store_in_cluster("http://10.96.0.10", Some(&pods_only)).is_some());
    }

    #[test]
    fn malformed_endpoints_say_what_and_how() {
        let cases = [
            ("s3.example.com", "must start with `https://`"),
            ("https://", "names no host"),
            (
                "https://key:secret@s3.example.com",
                "access keys belong in the Secret",
            ),
            (
                "https://s3.example.com/bucket",
                "put the key prefix in spec.store.prefix",
            ),
            ("https://s3.example.com:99999", "the port `99999`"),
            (
                "https://s3 example.com",
                "neither an IP address nor a DNS name",
            ),
            ("https://[::1", "closed with `]`"),
        ];
        for (e, want) in cases {
            let err = parse_endpoint(e).unwrap_err();
            assert!(err.contains(want), "{e}: {err}");
        }
        // The secret in a URL is never echoed.
        let err = parse_endpoint("https://key:hunter2@s3.example.com").unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
        assert_eq!(
            parse_endpoint("https://S3.Example.com:9000/").unwrap(),
            Endpoint {
                https: true,
                host: "s3.example.com".into(),
                port: Some(9000)
            }
        );
    }

    #[test]
    fn schedules_by_interval_or_cron() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let every = |interval: Option<&str>, cron: Option<&str>| {
            Every::of(&ScheduleSpec {
                interval: interval.map(str::to_string),
                cron: cron.map(str::to_string),
            })
        };
        let six = every(Some("6h"), None).unwrap();
        assert_eq!(
            six.next_after(at("2026-12-05T01:02:03Z")),
            Some(at("2026-12-05T07:02:03Z"))
        );
        let cron = every(None, Some("0 */6 * * *")).unwrap();
        assert_eq!(
            cron.next_after(at("2026-12-05T01:02:03Z")),
            Some(at("2026-12-05T06:00:00Z"))
        );
        let daily = every(None, Some("@daily")).unwrap();
        assert_eq!(
            daily.next_after(at("2026-12-05T01:02:03Z")),
            Some(at("2026-12-06T00:00:00Z"))
        );
        for (i, c, want) in [
            (
                None,
                None,
                "names neither an interval nor a cron expression",
            ),
            (Some("6h"), Some("@daily"), "keep one"),
            (None, Some("*/5 * * * * *"), "has 6 fields; write five"),
            (None, Some("61 * * * *"), "is not a cron expression"),
            (Some("30s"), None, "shorter than 1m"),
        ] {
            let err = every(i, c).unwrap_err();
            assert!(err.contains(want), "{i:?} {c:?}: {err}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("6h").unwrap().as_secs(), 21_600);
        assert_eq!(parse_duration("1h30m").unwrap().as_secs(), 5_400);
        assert_eq!(parse_duration("7d").unwrap().as_secs(), 604_800);
        for bad in ["", "6", "h", "6x", "99999999999999999999d", "-1h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_sound_spec_has_no_errors_and_a_bad_one_lists_them_all() {
        let mut spec = BackupSpec {
            cluster_ref: ClusterRef {
                name: "prod".into(),
            },
            store: StoreSpec {
                endpoint: "https://s3.example.com".into(),
                bucket: "etcd-backups".into(),
                prefix: Some("prod/".into()),
                region: Some("eu-west-1".into()),
                credentials_secret_ref: CredentialsSecretRef {
                    name: "s3".into(),
                    ..Default::default()
                },
            },
            schedule: ScheduleSpec {
                interval: Some("6h".into()),
                cron: None,
            },
            retention: Some(RetentionSpec {
                keep_last: Some(7),
                max_age: Some("7d".into()),
            }),
            encryption: None,
        };
        assert_eq!(validate_backup_spec(&spec), Vec::<String>::new());
        spec.store.endpoint = "ftp://x".into();
        spec.store.bucket = "Bad_Bucket".into();
        spec.store.prefix = Some("/abs/../x".into());
        spec.schedule.interval = Some("10s".into());
        spec.retention = Some(RetentionSpec {
            keep_last: Some(0),
            max_age: Some("forever".into()),
        });
        let errors = validate_backup_spec(&spec);
        assert_eq!(errors.len(), 6, "{errors:#?}");
        for (e, want) in errors.iter().zip([
            "spec.store.endpoint",
            "spec.store.bucket",
            "spec.store.prefix",
            "spec.schedule.interval `10s` is shorter than 1m",
            "spec.retention.keepLast is 0",
            "spec.retention.maxAge `forever`",
        ]) {
            assert!(e.starts_with(want) || e.contains(want), "{e} / {want}");
        }
    }

    #[test]
    fn cidr_edges() {
        let c = Cidr::parse("10.96.0.0/12").unwrap();
        assert!(c.contains("10.111.255.255".parse().unwrap()));
        assert!(!c.contains("10.112.0.0".parse().unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        assert!(Cidr::parse("10.0.0.0").is_none());
        assert!(c.contains("::ffff:10.96.0.1".parse().unwrap()));
    }
}
