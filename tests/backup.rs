//! Issue 36: TalosEtcdBackups against the in-process API server and the real kube client:
//! the controller's conditions on a backup (a spec that is not sound, a store inside the
//! cluster, ADR 0106 §2) and an etcd restore at the controller (refused for a store inside
//! the cluster, else left Pending with the rules' words on doing it by hand).

use crate::support::apiserver;
use crate::support::controller as harness;

use apiserver::ApiServer;
use harness::*;
use ichor_rules::runtime::objects::TalosEtcdBackup;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// A TalosEtcdBackup of cluster `prod` whose store is at `endpoint`.
pub fn backup(name: &str, endpoint: &str) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosEtcdBackup",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterRef": {"name": "prod"},
                 "store": {"endpoint": endpoint, "bucket": "etcd-backups", "prefix": "prod/",
                           "credentialsSecretRef": {"name": "s3-keys"}},
                 "schedule": {"interval": "6h"},
                 "retention": {"keepLast": 3}}
    })
}

async fn patch_backup(api: &ApiServer, name: &str, spec: Value) {
    Api::<TalosEtcdBackup>::namespaced(api.test_client(), NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .expect("patch the backup");
}

/// ADR 0106 §2: a backup whose store is a Service of the cluster, or an address in its
/// declared pod range, gets the warning condition StoreInCluster=True (and a Warning
/// Event), while Ready stays True; moving the endpoint out removes it.
#[tokio::test]
async fn a_store_inside_the_cluster_is_warned_and_the_warning_goes_when_it_moves_out() {
    let api = ApiServer::start().await;
    let mut c = cluster("prod", 3);
    c["spec"]["network"] = json!({"podSubnets": ["172.20.0.0/16"]});
    api.insert(c);
    api.insert(backup(
        "by-name",
        "http://minio.minio.svc.cluster.local:9000",
    ));
    api.insert(backup("by-ip", "http://172.20.3.9:9000"));
    // In Talos' default service range, but this cluster declares only its pod range: the
    // service range is still the default one.
    api.insert(backup("default-svc", "http://10.96.0.50:9000"));
    api.insert(backup("outside", "https://s3.eu-west-1.amazonaws.com"));
    let _c = Running::start(context(&api, "test", None));
    for name in ["by-name", "by-ip", "default-svc"] {
        wait_for(name, WAIT, || {
            cond(&api, "TalosEtcdBackup", name, "StoreInCluster")
                == Some(("True".into(), "StoreInCluster".into()))
        })
        .await;
        assert_eq!(
            cond(&api, "TalosEtcdBackup", name, "Ready"),
            Some(("True".into(), "SpecValid".into())),
            "{name}"
        );
        let m = message(&api, "TalosEtcdBackup", name, "StoreInCluster");
        assert!(
            m.contains("the backup store must live outside the cluster being restored"),
            "{m}"
        );
        wait_for("the Warning Event", WAIT, || {
            !events(&api, name, "StoreInCluster").is_empty()
        })
        .await;
        assert_eq!(events(&api, name, "StoreInCluster").len(), 1, "{name}");
    }
    assert!(
        message(&api, "TalosEtcdBackup", "by-ip", "StoreInCluster")
            .contains("172.20.3.9 is inside the cluster's pod range 172.20.0.0/16")
    );
    wait_for("outside judged", WAIT, || {
        cond(&api, "TalosEtcdBackup", "outside", "Ready").is_some()
    })
    .await;
    assert_eq!(
        cond(&api, "TalosEtcdBackup", "outside", "StoreInCluster"),
        None
    );

    patch_backup(
        &api,
        "by-name",
        json!({"store": {"endpoint": "https://backup.example.org"}}),
    )
    .await;
    wait_for("the warning removed", WAIT, || {
        cond(&api, "TalosEtcdBackup", "by-name", "StoreInCluster").is_none()
    })
    .await;
}

/// Bad input gets a condition saying exactly what is wrong and how to fix it, every
/// problem at once; the controller does not stop on it.
#[tokio::test]
async fn a_malformed_backup_says_every_problem() {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    let mut bad = backup("bad", "s3.example.com:9000");
    bad["spec"]["store"]["bucket"] = json!("Etcd_Backups");
    bad["spec"]["schedule"]["interval"] = json!("sometimes");
    bad["spec"]["retention"]["keepLast"] = json!(0);
    api.insert(bad);
    api.insert(backup("orphan", "https://s3.example.com"));
    patch_orphan_cluster(&api).await;
    let _c = Running::start(context(&api, "test", None));
    wait_for("invalid spec", WAIT, || {
        cond(&api, "TalosEtcdBackup", "bad", "Ready")
            == Some(("False".into(), "InvalidSpec".into()))
    })
    .await;
    let m = message(&api, "TalosEtcdBackup", "bad", "Ready");
    for want in [
        "the spec has 4 problems",
        "spec.store.endpoint `s3.example.com:9000` is not a URL the controller can use: it must start with `https://`",
        "spec.store.bucket `Etcd_Backups` is not an S3 bucket name",
        "spec.schedule.interval `sometimes` is not a duration",
        "spec.retention.keepLast is 0",
        "no snapshot is taken until it is fixed",
    ] {
        assert!(m.contains(want), "{want}: {m}");
    }
    wait_for("the Warning Event", WAIT, || {
        !events(&api, "bad", "InvalidSpec").is_empty()
    })
    .await;
    assert_eq!(events(&api, "bad", "InvalidSpec").len(), 1);
    wait_for("a missing cluster said", WAIT, || {
        cond(&api, "TalosEtcdBackup", "orphan", "Ready")
            == Some(("False".into(), "ClusterNotFound".into()))
    })
    .await;
}

async fn patch_orphan_cluster(api: &ApiServer) {
    patch_backup(api, "orphan", json!({"clusterRef": {"name": "staging"}})).await;
}

/// ADR 0106 §2 at the controller: a restore created past the webhook (or before the
/// backup's endpoint moved into the cluster) is refused again before anything runs
/// (Accepted=False StartRefused, the seed's words); one from a store outside stays Pending
/// with Accepted=True ManualProcedure, the rules' words pointing at the procedure.
#[tokio::test]
async fn an_etcd_restore_is_refused_at_the_controller_for_a_store_inside_else_left_to_be_done_by_hand()
 {
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 3));
    for (i, n) in ["cp-1", "cp-2", "cp-3"].iter().enumerate() {
        api.insert(control_plane(n, i as u32));
    }
    api.insert(backup("offsite", "https://s3.backup.example.org"));
    let mut op = operation("restore-1", "etcd-restore");
    op["spec"]["backupRef"] = json!({"name": "offsite"});
    api.insert(op);
    let _c = Running::start(context(&api, "test", None));
    wait_for("left to be done by hand", WAIT, || {
        cond(&api, "TalosOperation", "restore-1", "Accepted")
            == Some(("True".into(), "ManualProcedure".into()))
    })
    .await;
    let m = message(&api, "TalosOperation", "restore-1", "Accepted");
    assert!(
        m.contains("this operator does not run an etcd restore itself")
            && m.contains("docs/operators.md"),
        "{m}"
    );
    let phase = |api: &ApiServer| {
        get(api, "TalosOperation", "restore-1")
            .and_then(|o| o["status"]["phase"].as_str().map(str::to_string))
    };
    assert!(
        matches!(phase(&api).as_deref(), None | Some("Pending")),
        "{:?}",
        phase(&api)
    );
    wait_for("the Event", WAIT, || {
        !events(&api, "restore-1", "ManualProcedure").is_empty()
    })
    .await;
    assert_eq!(events(&api, "restore-1", "ManualProcedure").len(), 1);

    // The store moves into the cluster: the next decision refuses it.
    patch_backup(
        &api,
        "offsite",
        json!({"store": {"endpoint": "http://10.96.7.7:9000"}}),
    )
    .await;
    wait_for("refused at the controller", WAIT, || {
        cond(&api, "TalosOperation", "restore-1", "Accepted")
            == Some(("False".into(), "StartRefused".into()))
    })
    .await;
    let m = message(&api, "TalosOperation", "restore-1", "Accepted");
    assert!(
        m.contains("the backup store must live outside the cluster being restored"),
        "{m}"
    );
    assert!(
        matches!(phase(&api).as_deref(), None | Some("Pending")),
        "{:?}",
        phase(&api)
    );
}

/// `MachineService/EtcdSnapshot` from the Talos stand-in, backed by a real etcd: the
/// client streams it to a file chunk by chunk and checks its trailing sha256 as it passes
/// (as `talosctl etcd snapshot` does). The file is a real bbolt database holding what was
/// written, followed by its sha256; a snapshot altered on the way is caught.
#[tokio::test]
async fn an_etcd_snapshot_streams_to_a_file_and_its_trailing_sha256_is_checked() {
    use crate::support::etcd::EtcdCluster;
    use crate::support::talos::TalosApi;
    use ichor_rules::runtime::snapshot::{SnapshotError, StreamError};
    let api = TalosApi::start(EtcdCluster::start(1).await).await;
    let value = vec![b'v'; 4096];
    for i in 0..300 {
        api.etcd
            .put_at(0, &format!("backup-test-key-{i}"), &value)
            .await
            .expect("put");
    }
    let dir = std::env::temp_dir().join(format!("ichor-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("etcd.snapshot");
    let client = api.client(0);
    let mut file = tokio::fs::File::create(&path).await.expect("create");
    let checked = client
        .etcd_snapshot(&mut file, Duration::from_secs(60))
        .await
        .expect("a sound snapshot");
    drop(file);
    let bytes = std::fs::read(&path).expect("read");
    assert_eq!(checked.size, bytes.len() as u64);
    assert!(bytes.len() > 300 * 4096, "{} bytes", bytes.len());
    // bbolt's meta page: the magic 0xED0CDAED after the 16-byte page header.
    assert_eq!(bytes[16..20], [0xed, 0xda, 0x0c, 0xed]);
    let (db, trailer) = bytes.split_at(bytes.len() - 32);
    let sha = ring::digest::digest(&ring::digest::SHA256, db);
    assert_eq!(trailer, sha.as_ref());
    let hex: String = sha.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(checked.sha256, hex);
    assert!(
        db.windows(b"backup-test-key-299".len())
            .any(|w| w == b"backup-test-key-299")
    );

    api.node(0).corrupt_snapshots(true);
    let mut sink = Vec::new();
    let err = client
        .etcd_snapshot(&mut sink, Duration::from_secs(60))
        .await
        .expect_err("a corrupted snapshot");
    assert!(
        matches!(err, StreamError::Check(SnapshotError::Mismatch { .. })),
        "{err}"
    );
    assert!(
        err.to_string().contains("is not the sha256 of its"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The revision read from a snapshot as it streams (`runtime::bbolt`) is the one etcd
/// reports for the same data, in every shape etcd's `key` bucket takes: empty (inline), a
/// few keys (inline), hundreds (a tree of pages), a tombstone last, and a compaction past
/// the last key left. The snapshot comes from the real etcd, through the Talos stand-in's
/// `EtcdSnapshot` once and its gateway otherwise. Cut or altered copies of the real
/// snapshot never panic and never give a revision above etcd's.
#[tokio::test]
async fn the_revision_read_from_a_snapshot_is_the_one_etcd_reports() {
    use crate::support::etcd::EtcdCluster;
    use crate::support::talos::TalosApi;
    use base64::Engine;
    use ichor_rules::runtime::snapshot::SnapshotCheck;
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let api = TalosApi::start(EtcdCluster::start(1).await).await;
    let etcd = &api.etcd;
    let read = |chunks: &[Vec<u8>]| {
        let mut c = SnapshotCheck::new();
        for ch in chunks {
            c.update(ch);
        }
        c.finish()
            .map_err(|e| e.to_string())
            .and_then(|c| c.revision)
    };
    let mut seen = Vec::new();
    let mut last_db = Vec::new();
    let stages = [
        "empty",
        "one key",
        "three keys",
        "300 keys",
        "large values, rewritten",
        "a tombstone last",
        "compacted",
    ];
    for stage in stages {
        match stage {
            "empty" => {}
            "one key" => etcd.put_at(0, "a", b"1").await.expect("put"),
            "three keys" => {
                etcd.put_at(0, "b", b"2").await.expect("put");
                etcd.put_at(0, "a", b"3").await.expect("put");
            }
            "300 keys" => {
                let value = vec![b'v'; 3000];
                for i in 0..300 {
                    etcd.put_at(0, &format!("k-{i:03}"), &value)
                        .await
                        .expect("put");
                }
            }
            "large values, rewritten" => {
                // Leaves spanning several pages, then free runs of pages that kept the
                // old values' bytes (and stale headers) when they were rewritten.
                for round in 0..2u8 {
                    for i in 0..30 {
                        let value = vec![b'a' + round; 40 * 1024 + i * 100];
                        etcd.put_at(0, &format!("big-{i:02}"), &value)
                            .await
                            .expect("put");
                    }
                }
                etcd.put_at(0, "k-299", b"last").await.expect("put");
            }
            "a tombstone last" => {
                etcd.post_at(0, "/v3/kv/deleterange", json!({"key": b64(b"k-299")}))
                    .await
                    .expect("delete");
            }
            _ => {
                // Delete more, then compact at the current revision: the tombstones at the
                // end are compacted away, so the last key left is older than the revision.
                for k in ["k-298", "k-297"] {
                    etcd.post_at(0, "/v3/kv/deleterange", json!({"key": b64(k.as_bytes())}))
                        .await
                        .expect("delete");
                }
                let rev = etcd.status_at(0).await.expect("status").revision;
                etcd.post_at(
                    0,
                    "/v3/kv/compaction",
                    json!({"revision": rev, "physical": true}),
                )
                .await
                .expect("compact");
            }
        }
        let want = etcd.status_at(0).await.expect("status").revision;
        let chunks = etcd.snapshot_at(0).await.expect("snapshot");
        let got = read(&chunks);
        assert_eq!(got, Ok(want), "{stage}: etcd reports revision {want}");
        seen.push((stage, want));
        last_db = chunks.concat();
    }
    println!("revisions read from the snapshots, equal to etcd's: {seen:?}");
    // Through Talos' EtcdSnapshot (the path the controller takes), into a file.
    let want = etcd.status_at(0).await.expect("status").revision;
    let mut sink = Vec::new();
    let checked = api
        .client(0)
        .etcd_snapshot(&mut sink, Duration::from_secs(60))
        .await
        .expect("a sound snapshot");
    assert_eq!(checked.revision, Ok(want));
    // Hostile copies: cut anywhere, or a byte changed anywhere (the hash fixed up so the
    // database is read): an answer or none, never a panic.
    let db = &last_db[..last_db.len() - 32];
    let with_hash = |d: &[u8]| {
        let mut v = d.to_vec();
        v.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, d).as_ref());
        v
    };
    let mut unread = 0;
    for i in (0..db.len()).step_by(db.len() / 400 + 1) {
        let cut = read(&[with_hash(&db[..i])]);
        // A page cut off is never read; the answer is etcd's, or none.
        assert!(cut.is_err() || cut == Ok(want), "cut at {i}: {cut:?}");
        let mut m = db.to_vec();
        m[i] ^= 0xa5;
        if read(&[with_hash(&m)]).is_err() {
            unread += 1;
        }
    }
    println!("{unread} of the altered copies had no revision read");
}

/// A store of moto's S3 server, bucket `etcd`, prefix `prod/`.
fn store_spec(endpoint: &str, bucket: &str) -> ichor_rules::runtime::objects::StoreSpec {
    serde_json::from_value(json!({
        "endpoint": endpoint, "bucket": bucket, "prefix": "prod/",
        "credentialsSecretRef": {"name": "s3-keys"}
    }))
    .expect("a store spec")
}

const SECRET: &str = "wJalrXUtnFEMI-K7MDENG-never-in-a-message";

fn keys() -> ichor_rules::runtime::store::Keys {
    ichor_rules::runtime::store::Keys {
        access_key_id: "AKIAICHORTEST".into(),
        secret_access_key: SECRET.into(),
    }
}

/// A real etcd snapshot (over 12 MiB, so more than one part) streams from the Talos
/// stand-in into moto's S3 server as a multipart upload, checked on the way and by the
/// stored size; downloading it gives the same bytes (its sha256 matches). A snapshot
/// corrupted on the way is not kept (nothing under its key); an object altered in the
/// store is caught when it is downloaded. A missing bucket and an unreachable store are
/// said as such, and no error carries the secret key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_streams_into_the_store_multipart_and_is_checked_there() {
    use crate::support::etcd::EtcdCluster;
    use crate::support::s3::S3Server;
    use crate::support::talos::TalosApi;
    use ichor_rules::runtime::store::{PutError, Store, StoreError};
    let s3 = S3Server::start().await;
    s3.create_bucket("etcd").await;
    let api = TalosApi::start(EtcdCluster::start(1).await).await;
    let value = vec![b'x'; 128 * 1024];
    for i in 0..100 {
        api.etcd
            .put_at(0, &format!("big-{i}"), &value)
            .await
            .expect("put");
    }
    let store = Store::new(
        &store_spec(&s3.endpoint(), "etcd"),
        &keys(),
        Duration::from_secs(30),
    )
    .expect("store");
    let client = api.client(0);
    let key = store.key("2026-12-05T07-00-00Z.snapshot");
    let take = |key: String| {
        let client = client.clone();
        let store = &store;
        async move {
            let (mut w, r) = tokio::io::duplex(256 * 1024);
            let talos = async move {
                let got = client.etcd_snapshot(&mut w, Duration::from_secs(60)).await;
                drop(w);
                got
            };
            let (from_talos, stored) = tokio::join!(talos, store.put_snapshot(&key, r, None));
            (from_talos, stored)
        }
    };
    let (from_talos, stored) = take(key.clone()).await;
    let from_talos = from_talos.expect("streamed from Talos");
    let (stored, stored_size) = stored.expect("stored");
    assert_eq!(from_talos, stored);
    assert_eq!(stored_size, stored.size);
    assert!(stored.size > 12 * 1024 * 1024, "{} bytes", stored.size);
    let listed = store.list().await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key, "prod/2026-12-05T07-00-00Z.snapshot");
    assert_eq!(listed[0].size, stored.size);
    let mut file = Vec::new();
    let got = store
        .get_snapshot(&key, &mut file, None)
        .await
        .expect("download");
    assert_eq!(got, stored);
    let sha = ring::digest::digest(&ring::digest::SHA256, &file[..file.len() - 32]);
    let hex: String = sha.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, stored.sha256);

    // The offline command: the snapshot in hand, checked, its hash printed.
    let dir = std::env::temp_dir().join(format!("ichor-download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let download = |key: &str, out: &std::path::Path, with_keys: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"));
        cmd.args([
            "backup",
            "download",
            "--endpoint",
            &s3.endpoint(),
            "--bucket",
            "etcd",
        ])
        .args(["--key", key, "--out"])
        .arg(out)
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY");
        if with_keys {
            cmd.env("AWS_ACCESS_KEY_ID", "AKIAICHORTEST")
                .env("AWS_SECRET_ACCESS_KEY", SECRET);
        }
        cmd.output().expect("runs")
    };
    let out_file = dir.join("etcd.snapshot");
    let out = download(&key, &out_file, true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&stored.sha256) && stdout.contains("a whole etcd snapshot"),
        "{stdout}"
    );
    // The revision, read from the snapshot as it downloaded: etcd's (nothing wrote since).
    let rev = api.etcd.status_at(0).await.expect("status").revision;
    assert_eq!(stored.revision, Ok(rev));
    assert!(
        stdout.contains(&format!("(etcd revision {rev}; sha256")),
        "{stdout}"
    );
    assert_eq!(std::fs::read(&out_file).expect("the file"), file);
    let out = download(&key, &dir.join("no-keys.snapshot"), false);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("set AWS_ACCESS_KEY_ID"));
    let out = download(&key, &out_file, true);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an existing file is never overwritten"
    );

    // Corrupted on the way: not kept.
    api.node(0).corrupt_snapshots(true);
    let bad_key = store.key("corrupt.snapshot");
    let (_, stored) = take(bad_key.clone()).await;
    let err = stored.expect_err("a corrupt snapshot is refused");
    assert!(matches!(err, PutError::Check(_)), "{err}");
    assert!(err.to_string().contains("was not kept"), "{err}");
    let keys_now: Vec<String> = store
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys_now, ["prod/2026-12-05T07-00-00Z.snapshot"]);
    api.node(0).corrupt_snapshots(false);

    // Altered in the store: the download says so.
    let mut altered = file.clone();
    altered[4096] ^= 0xff;
    s3.put_raw("etcd", &key, altered).await;
    let err = store
        .get_snapshot(&key, &mut Vec::new(), None)
        .await
        .expect_err("altered");
    assert!(matches!(err, PutError::Check(_)), "{err}");
    let altered_file = dir.join("altered.snapshot");
    let out = download(&key, &altered_file, true);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not the sha256 of its") && !stderr.contains(SECRET),
        "{stderr}"
    );
    assert!(!altered_file.exists() && !dir.join("altered.snapshot.part").exists());
    let _ = std::fs::remove_dir_all(&dir);

    // A bucket that does not exist, and a store nobody answers at.
    let nobucket = Store::new(
        &store_spec(&s3.endpoint(), "missing-bucket"),
        &keys(),
        Duration::from_secs(10),
    )
    .expect("store");
    let err = nobucket
        .put_snapshot(&nobucket.key("x.snapshot"), &b"not a snapshot"[..], None)
        .await
        .expect_err("no bucket");
    assert!(
        matches!(err, PutError::Store(StoreError::NoBucket { .. })),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("bucket `missing-bucket` does not exist"),
        "{err}"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let dead = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let nobody =
        Store::new(&store_spec(&dead, "etcd"), &keys(), Duration::from_secs(3)).expect("store");
    let err = nobody.list().await.expect_err("unreachable");
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err}");
    for e in [
        err.to_string(),
        format!("{err:?}"),
        format!("{:?}", keys()),
        format!("{nobody:?}"),
    ] {
        assert!(!e.contains(SECRET), "{e}");
    }
}

/// The Secret holding the store's access keys (`s3-keys`, the default key names).
fn keys_secret() -> Value {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s3-keys", "namespace": NS},
        "data": {"AWS_ACCESS_KEY_ID": b64("AKIAICHORTEST"), "AWS_SECRET_ACCESS_KEY": b64(SECRET)}
    })
}

/// Whether a backup's status records no deletion in progress (`pruning` empty or absent).
fn no_pruning(status: &Value) -> bool {
    status["pruning"].as_array().is_none_or(|a| a.is_empty())
}

/// A cluster `prod` of `n` control planes over a real etcd behind the Talos stand-ins,
/// moto's S3 server with bucket `etcd`, the access keys' Secret, and a backup `nightly`
/// storing there under `prod/`.
struct Backed {
    api: ApiServer,
    talos: crate::support::talos::TalosApi,
    s3: crate::support::s3::S3Server,
}

impl Backed {
    async fn start(n: usize, backup_spec: Value) -> Backed {
        use crate::support::etcd::EtcdCluster;
        use crate::support::s3::S3Server;
        use crate::support::talos::TalosApi;
        let s3 = S3Server::start().await;
        s3.create_bucket("etcd").await;
        let talos = TalosApi::start(EtcdCluster::start(n).await).await;
        let api = ApiServer::start().await;
        api.insert(cluster("prod", i64::try_from(n).expect("small")));
        for i in 0..n {
            let name = format!("cp-{}", i + 1);
            let mut m = control_plane(&name, u32::try_from(i).expect("small") + 1);
            m["spec"]["endpoint"] = json!(talos.node(i).endpoint());
            api.insert(m);
        }
        api.insert(keys_secret());
        let mut b = backup("nightly", &s3.endpoint());
        b["spec"]["store"]["bucket"] = json!("etcd");
        for (k, v) in backup_spec.as_object().into_iter().flatten() {
            b["spec"][k] = v.clone();
        }
        api.insert(b);
        Backed { api, talos, s3 }
    }

    fn ctx(&self) -> std::sync::Arc<ichor_rules::runtime::controller::Context> {
        self.ctx_retrying(fast_settings("backup-controller").backup_retry)
    }

    /// [`Backed::ctx`], a failed snapshot tried again only after `retry`.
    fn ctx_retrying(
        &self,
        retry: Duration,
    ) -> std::sync::Arc<ichor_rules::runtime::controller::Context> {
        let mut settings = fast_settings("backup-controller");
        settings.backup_retry = retry;
        std::sync::Arc::new(ichor_rules::runtime::controller::Context::new(
            self.api.client(),
            rules(),
            Some(std::sync::Arc::new(self.talos.tls())),
            settings,
            std::sync::Arc::new(ichor_rules::runtime::metrics::Metrics::default()),
        ))
    }

    /// [`Backed::ctx`], logging every step to `log` (`serve --step-log`).
    fn ctx_logged(
        &self,
        log: &std::path::Path,
    ) -> std::sync::Arc<ichor_rules::runtime::controller::Context> {
        let steps = ichor_rules::runtime::exec::trace::StepLog::open(log).expect("a step log");
        let ctx = std::sync::Arc::try_unwrap(self.ctx()).unwrap_or_else(|_| unreachable!());
        std::sync::Arc::new(ctx.with_step_log(std::sync::Arc::new(steps)))
    }

    fn status(&self) -> Value {
        get(&self.api, "TalosEtcdBackup", "nightly").expect("the backup")["status"].clone()
    }

    fn kept(&self) -> Vec<String> {
        self.status()["snapshots"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["key"].as_str().map(str::to_string))
            .collect()
    }

    fn store(&self) -> ichor_rules::runtime::store::Store {
        ichor_rules::runtime::store::Store::new(
            &store_spec(&self.s3.endpoint(), "etcd"),
            &keys(),
            Duration::from_secs(10),
        )
        .expect("store")
    }

    async fn stored(&self) -> Vec<String> {
        self.store()
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|o| o.key)
            .collect()
    }

    /// The status as a person (or a test) writes it: a merge patch of the status.
    async fn patch_status(&self, status: Value) {
        Api::<TalosEtcdBackup>::namespaced(self.api.test_client(), NS)
            .patch_status(
                "nightly",
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .expect("patch the status");
    }

    async fn annotate(&self, value: &str) {
        Api::<TalosEtcdBackup>::namespaced(self.api.test_client(), NS)
            .patch(
                "nightly",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {
                    "ichor.maesh.dev/snapshot-now": value}}})),
            )
            .await
            .expect("annotate");
    }

    /// Nothing the controller wrote (the backup, events) carries the secret key.
    fn assert_no_secret_written(&self) {
        for kind in ["TalosEtcdBackup", "Event", "TalosOperation"] {
            for o in self.api.objects(kind, None) {
                let text = o.to_string();
                assert!(!text.contains(SECRET), "{kind}: {text}");
                assert!(!text.contains("AKIAICHORTEST"), "{kind}: {text}");
            }
        }
    }
}

const SLOW: Duration = Duration::from_secs(60);

/// Issue 36 end to end, real parts only (real etcd behind the Talos stand-ins, moto's S3
/// server, the controller in-process): the first snapshot is taken at once, from a healthy
/// follower, verified and recorded; the schedule takes the next ones; retention keeps the
/// last two, deleting only what this backup wrote (a foreign object under the same prefix
/// stays); an on-demand request (the annotation) takes one at once; a snapshot corrupted
/// on the way is deleted, reported and never counted; the access keys never appear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_taken_on_schedule_verified_pruned_and_never_counted_when_corrupt() {
    let b = Backed::start(
        3,
        json!({"schedule": {"interval": "1h"}, "retention": {"keepLast": 2}}),
    )
    .await;
    let foreign = "prod/nightly-19990101T000000Z.snapshot";
    b.s3.put_raw("etcd", foreign, b"not ours".to_vec()).await;
    // A failed snapshot is not tried again within the test (so exactly one fails below,
    // however slowly the test runs).
    let ctl = Running::start(b.ctx_retrying(Duration::from_secs(3600)));
    wait_for("the first snapshot", SLOW, || {
        cond(&b.api, "TalosEtcdBackup", "nightly", "Snapshot")
            == Some(("True".into(), "Verified".into()))
    })
    .await;
    let first = b.status()["lastSnapshot"].clone();
    let key = first["key"].as_str().expect("a key").to_string();
    assert!(
        key.starts_with("prod/nightly-") && key.ends_with(".snapshot"),
        "{key}"
    );
    assert!(first["size"].as_u64().expect("size") > 4096, "{first}");
    assert_eq!(first["sha256"].as_str().map(str::len), Some(64), "{first}");
    assert!(first["raftIndex"].as_u64().is_some(), "{first}");
    // The etcd revision, read from the snapshot as it streamed: etcd's own (nothing writes
    // to this etcd meanwhile).
    let etcd_rev = b.talos.etcd.status_at(0).await.expect("status").revision;
    assert_eq!(first["revision"].as_i64(), Some(etcd_rev), "{first}");
    assert!(first["revisionUnread"].is_null(), "{first}");
    assert!(b.status()["inProgress"].is_null(), "{}", b.status());
    // From a follower: the leader is not loaded.
    let node = first["node"].as_str().expect("node").to_string();
    let leader_id = b.talos.etcd.leader(SLOW).await.expect("a leader");
    let leader = b
        .talos
        .etcd
        .members()
        .await
        .into_iter()
        .find(|m| m.id == leader_id)
        .map(|m| m.name)
        .expect("the leader listed");
    assert_ne!(node, leader, "the snapshot was taken from the leader");
    // The stored object is the snapshot: its size, and its trailing sha256 checks out.
    let mut bytes = Vec::new();
    let checked = b
        .store()
        .get_snapshot(&key, &mut bytes, None)
        .await
        .expect("download");
    assert_eq!(checked.size, first["size"].as_u64().expect("size"));
    assert_eq!(checked.sha256, first["sha256"].as_str().expect("sha"));
    assert_eq!(checked.revision, Ok(etcd_rev));
    assert!(!events(&b.api, "nightly", "SnapshotTaken").is_empty());

    // The schedule: the last attempt an hour and a minute ago, the next one is due.
    let mut taken = vec![key.clone()];
    for _ in 0..2 {
        let ago = k8s_openapi::jiff::Timestamp::now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(3660))
            .expect("time");
        b.patch_status(json!({"lastAttempt": ago.to_string()}))
            .await;
        let before = b.status()["lastSnapshot"]["key"].clone();
        wait_for("the scheduled snapshot", SLOW, || {
            b.status()["lastSnapshot"]["key"] != before
        })
        .await;
        taken.push(
            b.status()["lastSnapshot"]["key"]
                .as_str()
                .expect("key")
                .to_string(),
        );
        // Keys are named by the second.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    // Retention kept the last two it wrote; the foreign object stays.
    // (Recorded in `pruning` first, then deleted: both done.)
    wait_for("retention", SLOW, || {
        b.kept().len() == 2 && no_pruning(&b.status())
    })
    .await;
    assert_eq!(b.kept(), taken[1..].to_vec());
    let mut want: Vec<String> = taken[1..].to_vec();
    want.push(foreign.to_string());
    want.sort();
    assert_eq!(b.stored().await, want);
    assert!(!events(&b.api, "nightly", "SnapshotsPruned").is_empty());

    // A deletion retention recorded and never made (the controller stopped in between):
    // the next reconcile makes it first, and the key leaves `pruning`; nothing else goes.
    let left = "prod/nightly-20261201T000000Z.snapshot";
    b.s3.put_raw("etcd", left, b"an old snapshot".to_vec())
        .await;
    b.patch_status(json!({"pruning": [left]})).await;
    wait_for("the recorded deletion", SLOW, || no_pruning(&b.status())).await;
    assert_eq!(b.stored().await, want);
    assert_eq!(b.kept(), taken[1..].to_vec());

    // On demand: the annotation takes one now.
    b.annotate("2026-12-05T10:00:00Z").await;
    wait_for("the requested snapshot", SLOW, || {
        b.status()["lastSnapshot"]["request"] == "2026-12-05T10:00:00Z"
    })
    .await;
    assert_eq!(b.status()["lastRequest"], "2026-12-05T10:00:00Z");
    // Its retention, which follows the record of the snapshot, before what is kept is read.
    wait_for("retention after the requested snapshot", SLOW, || {
        b.kept().len() == 2
    })
    .await;

    // Corrupted on the way from every node: deleted, reported, never counted.
    for i in 0..3 {
        b.talos.node(i).corrupt_snapshots(true);
    }
    let good = b.status()["lastSnapshot"].clone();
    let kept_before = b.kept();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    b.annotate("corrupt-please").await;
    wait_for("the corrupt snapshot reported", SLOW, || {
        cond(&b.api, "TalosEtcdBackup", "nightly", "Snapshot")
            == Some(("False".into(), "SnapshotCorrupt".into()))
    })
    .await;
    let m = message(&b.api, "TalosEtcdBackup", "nightly", "Snapshot");
    assert!(
        m.contains("is not the sha256 of its")
            && m.contains("it was deleted from the store, it is not counted")
            && m.contains(&format!(
                "the last good snapshot is still {}",
                good["key"].as_str().expect("key")
            )),
        "{m}"
    );
    assert_eq!(b.status()["lastSnapshot"], good);
    assert_eq!(b.kept(), kept_before);
    let mut want = kept_before.clone();
    want.push(foreign.to_string());
    want.sort();
    assert_eq!(b.stored().await, want, "nothing left of the corrupt one");
    assert!(!events(&b.api, "nightly", "SnapshotFailed").is_empty());
    for i in 0..3 {
        b.talos.node(i).corrupt_snapshots(false);
    }
    // A database whose revision cannot be read (sound on the way: its hash checks out):
    // recorded without a revision, and the status and the condition say why.
    for i in 0..3 {
        b.talos.node(i).unreadable_snapshots(true);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    b.annotate("no-revision-please").await;
    wait_for("the snapshot without a revision", SLOW, || {
        b.status()["lastSnapshot"]["request"] == "no-revision-please"
    })
    .await;
    let rec = b.status()["lastSnapshot"].clone();
    assert!(rec["revision"].is_null(), "{rec}");
    assert!(
        rec["revisionUnread"]
            .as_str()
            .is_some_and(|w| w.contains("not a valid bbolt meta page")),
        "{rec}"
    );
    let m = message(&b.api, "TalosEtcdBackup", "nightly", "Snapshot");
    assert!(m.contains("etcd revision not read ("), "{m}");
    for i in 0..3 {
        b.talos.node(i).unreadable_snapshots(false);
    }
    // Metrics: the last success, its size and duration.
    let metrics = ctl.ctx.metrics.render();
    for want in [
        "ichor_rules_backup_last_success_timestamp_seconds{backup=\"infra/nightly\"}",
        "ichor_rules_backup_last_size_bytes{backup=\"infra/nightly\"}",
        "ichor_rules_backup_last_duration_seconds{backup=\"infra/nightly\"}",
        "ichor_rules_backup_snapshots_failed_total{backup=\"infra/nightly\"} 1",
    ] {
        assert!(metrics.contains(want), "{want}\n{metrics}");
    }
    b.assert_no_secret_written();
    // Every call the controller made is one the chart grants.
    let calls = assert_calls_granted(&b.api);
    assert!(
        calls.contains(&("".into(), "secrets".into(), "get".into())),
        "{calls:?}"
    );
}

/// A backup's step log (`serve --step-log`) is checked against the executor (`verify
/// --check-trace`, procedure `backup`): a verified snapshot and a corrupt one (deleted,
/// never counted) replay as written; the same log with the stream's answer changed (another
/// sha256, or a failure where the run stored it) is not a behaviour, and the checker says
/// where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backups_step_log_is_checked_against_the_executor() {
    let b = Backed::start(1, json!({"schedule": {"interval": "1h"}})).await;
    let log = step_log_path("traced-backup");
    let ctl = Running::start(b.ctx_logged(&log));
    wait_for("the first snapshot", SLOW, || {
        cond(&b.api, "TalosEtcdBackup", "nightly", "Snapshot")
            == Some(("True".into(), "Verified".into()))
    })
    .await;
    b.talos.node(0).corrupt_snapshots(true);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    b.annotate("corrupt-please").await;
    wait_for("the corrupt snapshot reported", SLOW, || {
        cond(&b.api, "TalosEtcdBackup", "nightly", "Snapshot")
            == Some(("False".into(), "SnapshotCorrupt".into()))
    })
    .await;
    ctl.kill().await;
    let text = std::fs::read_to_string(&log).expect("the step log");
    for op in [
        "\"procedure\":\"backup\"",
        "\"op\":\"stream_snapshot\"",
        "\"op\":\"write_backup\"",
        "\"op\":\"backup_event\"",
        "\"op\":\"delete_object\"",
        "\"call\":\"EtcdStatus\"",
    ] {
        assert!(text.contains(op), "the log records {op}");
    }
    assert!(!text.contains(SECRET), "the step log shows the store's key");
    let (code, said) = check_step_log_text("backup-as-written", &text);
    assert_eq!(code, Some(0), "{said}");
    // Both snapshots' reconciles (the verified one and the corrupt one) replayed whole.
    let replayed: usize = said
        .split("a behaviour of the model: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(replayed >= 2, "{said}");
    // The first snapshot's stream line, changed by `change`.
    let tamper = |change: &dyn Fn(&mut Value)| -> String {
        let mut done = false;
        text.lines()
            .map(|l| {
                if done || !l.contains("\"op\":\"stream_snapshot\"") {
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
    // The store answered another sha256: the executor records that one.
    let other_sha = tamper(&|v| v["answer"]["Ok"]["Ok"]["sha256"] = json!("00"));
    assert_ne!(other_sha, text);
    let (code, said) = check_step_log_text("backup-sha", &other_sha);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("status written"), "{said}");
    // The stream failed where the run stored it: the executor deletes the key, never
    // counts the snapshot; the run recorded it counted.
    let failed = tamper(&|v| {
        v["answer"] = json!({"Ok": {"Err": {"reason": "StreamFailed", "message": "cut"}}})
    });
    let (code, said) = check_step_log_text("backup-failed", &failed);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("line "), "{said}");
}

/// A controller that stops in the middle of a snapshot (recorded `inProgress`, something
/// already under its key): the next one deletes that object, never counts it, says so,
/// and takes a new snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_interrupted_by_a_crash_is_deleted_and_never_counted() {
    let b = Backed::start(1, json!({"schedule": {"interval": "1h"}})).await;
    let partial = "prod/nightly-20261205T070000Z.snapshot";
    b.s3.put_raw("etcd", partial, vec![7u8; 9000]).await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    b.patch_status(json!({
        "lastAttempt": now,
        "inProgress": {"key": partial, "node": "cp-1", "started": now}
    }))
    .await;
    let _ctl = Running::start(b.ctx());
    wait_for("a new snapshot", SLOW, || {
        cond(&b.api, "TalosEtcdBackup", "nightly", "Snapshot")
            == Some(("True".into(), "Verified".into()))
    })
    .await;
    let events = events(&b.api, "nightly", "SnapshotInterrupted");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0]["note"]
            .as_str()
            .unwrap_or("")
            .contains("it is not counted")
    );
    let key = b.status()["lastSnapshot"]["key"]
        .as_str()
        .expect("key")
        .to_string();
    assert_ne!(key, partial);
    assert_eq!(b.kept(), std::slice::from_ref(&key));
    assert_eq!(b.stored().await, [key]);
}

/// The fresh-backup rule at the controller, with the real parts: an upgrade of a control
/// plane while the newest verified snapshot is a day and more old is refused to start
/// (the rules' words naming the backup and how to take one now); an etcd-snapshot
/// operation naming the backup is executed (the backup takes and verifies it, the
/// operation ends Succeeded), and the upgrade is then allowed to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_waits_for_a_fresh_snapshot_and_an_etcd_snapshot_operation_takes_one() {
    let b = Backed::start(3, json!({"schedule": {"interval": "1h"}})).await;
    // A snapshot taken long ago, and the schedule not due.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    b.patch_status(json!({
        "lastAttempt": now,
        "lastSnapshot": {"time": "2026-01-01T00:00:00Z", "key": "prod/old.snapshot", "size": 4096,
                         "sha256": "00", "node": "cp-1"}
    }))
    .await;
    let mut up = operation("upgrade-cp-2", "upgrade");
    up["spec"]["machine"] = json!("cp-2");
    up["spec"]["image"] = json!("ghcr.io/siderolabs/installer:v1.12.1");
    b.api.insert(up);
    let _ctl = Running::start(b.ctx());
    wait_for("the upgrade refused", SLOW, || {
        cond(&b.api, "TalosOperation", "upgrade-cp-2", "Accepted")
            == Some(("False".into(), "StartRefused".into()))
    })
    .await;
    let m = message(&b.api, "TalosOperation", "upgrade-cp-2", "Accepted");
    assert!(
        m.contains("its newest verified etcd snapshot (TalosEtcdBackup nightly) is")
            && m.contains("older than the 1440 minutes the rules allow")
            && m.contains("kubectl annotate talosetcdbackup nightly ichor.maesh.dev/snapshot-now="),
        "{m}"
    );
    let mut snap = operation("snap-now", "etcd-snapshot");
    snap["spec"]["backupRef"] = json!({"name": "nightly"});
    b.api.insert(snap);
    wait_for("the snapshot operation succeeds", SLOW, || {
        get(&b.api, "TalosOperation", "snap-now")
            .is_some_and(|o| o["status"]["phase"] == "Succeeded")
    })
    .await;
    let m = message(&b.api, "TalosOperation", "snap-now", "Running");
    let key = b.status()["lastSnapshot"]["key"]
        .as_str()
        .expect("key")
        .to_string();
    assert!(m.contains(&format!("took snapshot {key}")), "{m}");
    assert!(
        b.status()["lastSnapshot"]["request"]
            .as_str()
            .is_some_and(|r| r.starts_with("TalosOperation snap-now")),
        "{}",
        b.status()
    );
    wait_for("the upgrade allowed to start", SLOW, || {
        cond(&b.api, "TalosOperation", "upgrade-cp-2", "Accepted").is_none_or(|(s, _)| s == "True")
    })
    .await;
    b.assert_no_secret_written();
}

/// Bad input, with moto checking every request's signature: wrong keys (a wrong secret, an
/// unknown key id), a bucket that does not exist, a store nobody answers at, a Secret that
/// is not there, and a malformed endpoint each get a condition saying exactly that; none
/// counts a snapshot, leaves one in progress or leaves an object; the good backup next to
/// them takes its snapshot; no key appears in any status or Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_stores_and_keys_get_a_condition_saying_so_and_count_no_snapshot() {
    use crate::support::etcd::EtcdCluster;
    use crate::support::s3::S3Server;
    use crate::support::talos::TalosApi;
    use base64::Engine;
    // Every line the controller logs, at debug level (this test's process alone: nextest
    // runs each test in a process of its own), to grep for the keys at the end.
    let logged = LogBuffer::default();
    let _log = tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(logged.clone())
            .finish(),
    );
    let (s3, id, secret) = S3Server::start_with_keys("etcd").await;
    let talos = TalosApi::start(EtcdCluster::start(1).await).await;
    let api = ApiServer::start().await;
    api.insert(cluster("prod", 1));
    let mut m = control_plane("cp-1", 1);
    m["spec"]["endpoint"] = json!(talos.node(0).endpoint());
    api.insert(m);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let wrong_secret = "not-the-secret-4f1c9a";
    for (name, key_id, key) in [
        ("good", id.as_str(), secret.as_str()),
        ("wrong-secret", id.as_str(), wrong_secret),
        ("unknown-key", "AKIAUNKNOWNKEY00", secret.as_str()),
    ] {
        api.insert(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": NS},
            "data": {"AWS_ACCESS_KEY_ID": b64(key_id), "AWS_SECRET_ACCESS_KEY": b64(key)}
        }));
    }
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let dead = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let cases = [
        // (backup, endpoint, bucket, Secret, condition type, reason, words)
        (
            "good",
            s3.endpoint(),
            "etcd",
            "good",
            "Snapshot",
            "Verified",
            "verified",
        ),
        (
            "wrong-secret",
            s3.endpoint(),
            "etcd",
            "wrong-secret",
            "Snapshot",
            "StoreKeysRefused",
            "refused the access keys (wrong or disabled keys",
        ),
        (
            "unknown-key",
            s3.endpoint(),
            "etcd",
            "unknown-key",
            "Snapshot",
            "StoreKeysRefused",
            "refused the access keys",
        ),
        (
            "no-bucket",
            s3.endpoint(),
            "no-such-bucket",
            "good",
            "Snapshot",
            "BucketNotFound",
            "bucket `no-such-bucket` does not exist at",
        ),
        (
            "unreachable",
            dead.clone(),
            "etcd",
            "good",
            "Snapshot",
            "StoreUnreachable",
            "could not be reached",
        ),
        (
            "no-secret",
            s3.endpoint(),
            "etcd",
            "absent",
            "Snapshot",
            "StoreKeysMissing",
            "the Secret infra/absent named by spec.store.credentialsSecretRef does not exist",
        ),
        (
            "malformed",
            "s3.example.com:9000".to_string(),
            "etcd",
            "good",
            "Ready",
            "InvalidSpec",
            "spec.store.endpoint `s3.example.com:9000` is not a URL the controller can use",
        ),
    ];
    for (name, endpoint, bucket, secret_name, ..) in &cases {
        let mut b = backup(name, endpoint);
        b["spec"]["store"]["bucket"] = json!(bucket);
        b["spec"]["store"]["credentialsSecretRef"]["name"] = json!(secret_name);
        api.insert(b);
    }
    let ctx = std::sync::Arc::new(ichor_rules::runtime::controller::Context::new(
        api.client(),
        rules(),
        Some(std::sync::Arc::new(talos.tls())),
        fast_settings("backup-controller"),
        std::sync::Arc::new(ichor_rules::runtime::metrics::Metrics::default()),
    ));
    let _ctl = Running::start(ctx);
    for (name, _, _, _, type_, reason, words) in &cases {
        wait_for(&format!("{name}: {type_} {reason}"), SLOW, || {
            cond(&api, "TalosEtcdBackup", name, type_).is_some_and(|(_, r)| r == *reason)
        })
        .await;
        let m = message(&api, "TalosEtcdBackup", name, type_);
        assert!(m.contains(words), "{name}: {m}");
        let status = get(&api, "TalosEtcdBackup", name).expect("backup")["status"].clone();
        // (A failed one is tried again every second here: one may be in flight, never
        // counted.)
        if *name != "good" {
            assert!(status["lastSnapshot"].is_null(), "{name}: {status}");
            assert!(status["snapshots"].is_null(), "{name}: {status}");
            if *type_ == "Snapshot" {
                assert!(
                    m.contains("nothing of it is in the store")
                        || m.contains("no snapshot was taken"),
                    "{name}: {m}"
                );
            }
        }
    }
    // An etcd-snapshot operation naming a backup whose store has no bucket fails with the
    // backup's words.
    let mut op = operation("snap-no-bucket", "etcd-snapshot");
    op["spec"]["backupRef"] = json!({"name": "no-bucket"});
    api.insert(op);
    wait_for("the snapshot operation fails", SLOW, || {
        get(&api, "TalosOperation", "snap-no-bucket")
            .is_some_and(|o| o["status"]["phase"] == "Failed")
    })
    .await;
    let failure =
        get(&api, "TalosOperation", "snap-no-bucket").expect("op")["status"]["failureReason"]
            .as_str()
            .unwrap_or("")
            .to_string();
    assert!(
        failure.contains("TalosEtcdBackup no-bucket did not take a snapshot for this operation")
            && failure.contains("bucket `no-such-bucket` does not exist"),
        "{failure}"
    );
    // The good backup's snapshot is whole in the store (read back with its keys).
    let good =
        get(&api, "TalosEtcdBackup", "good").expect("good")["status"]["lastSnapshot"].clone();
    let store = ichor_rules::runtime::store::Store::new(
        &store_spec(&s3.endpoint(), "etcd"),
        &ichor_rules::runtime::store::Keys {
            access_key_id: id.clone(),
            secret_access_key: secret.clone(),
        },
        Duration::from_secs(10),
    )
    .expect("store");
    let checked = store
        .get_snapshot(good["key"].as_str().expect("key"), &mut Vec::new(), None)
        .await
        .expect("the good snapshot downloads whole");
    assert_eq!(Some(checked.size), good["size"].as_u64());
    for kind in ["TalosEtcdBackup", "Event"] {
        for o in api.objects(kind, None) {
            let text = o.to_string();
            for k in [secret.as_str(), wrong_secret] {
                assert!(!text.contains(k), "{kind} carries a key: {text}");
            }
        }
    }
    // Nor any line the controller logged through every one of these failures.
    let text = logged.text();
    // (Its reconciles of the failing backups are in it, the API requests included.)
    assert!(
        text.contains("talosetcdbackups/wrong-secret") && text.contains("no-bucket"),
        "the controller logged {} bytes",
        text.len()
    );
    for k in [secret.as_str(), wrong_secret] {
        assert!(!text.contains(k), "a key in the log");
        let b = base64::engine::general_purpose::STANDARD.encode(k);
        assert!(!text.contains(&b), "a key, base64, in the log");
    }
}

/// A log sink in memory, for `tracing_subscriber`'s writer.
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

/// Encryption (spec.encryption): each snapshot is encrypted with the key from its Secret
/// as it streams into the store (AES-256-GCM in segments); the stored object holds none of
/// etcd's data in clear, a download without the key says it is encrypted, the offline
/// command with `--key-file` gives the snapshot whose sha256 is the recorded one; a key
/// Secret that is missing stores nothing unencrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_snapshot_holds_nothing_in_clear_and_the_download_decrypts_it() {
    use base64::Engine;
    let b = Backed::start(
        1,
        json!({"schedule": {"interval": "1h"},
               "encryption": {"keySecretRef": {"name": "etcd-key"}}}),
    )
    .await;
    let marker = "ichor-encryption-marker-key";
    b.talos
        .etcd
        .put_at(0, marker, &vec![b'm'; 200 * 1024])
        .await
        .expect("put");
    let _ctl = Running::start(b.ctx());
    // No key Secret yet: nothing is stored, unencrypted or not.
    wait_for("the missing key said", SLOW, || {
        cond(&b.api, "TalosEtcdBackup", "nightly", "Snapshot")
            == Some(("False".into(), "EncryptionKeyMissing".into()))
    })
    .await;
    assert!(b.kept().is_empty());
    assert!(b.stored().await.is_empty(), "{:?}", b.stored().await);
    let key = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    b.api.insert(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "etcd-key", "namespace": NS},
        "data": {"key": base64::engine::general_purpose::STANDARD.encode(key)}
    }));
    wait_for("an encrypted snapshot", SLOW, || {
        cond(&b.api, "TalosEtcdBackup", "nightly", "Snapshot")
            == Some(("True".into(), "Verified".into()))
    })
    .await;
    let rec = b.status()["lastSnapshot"].clone();
    assert_eq!(rec["encrypted"], true, "{rec}");
    let object = rec["key"].as_str().expect("key").to_string();
    // In the store: the format's header, nothing of etcd in clear, the recorded size.
    let listed = b.store().list().await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(Some(listed[0].size), rec["size"].as_u64());
    let err = b
        .store()
        .get_snapshot(&object, &mut Vec::new(), None)
        .await
        .expect_err("encrypted");
    assert!(
        err.to_string().contains("the snapshot is encrypted"),
        "{err}"
    );
    // The offline command decrypts with the key from a file.
    let dir = std::env::temp_dir().join(format!("ichor-encrypted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("key"), key).expect("key file");
    let download = |out: &std::path::Path, with_key: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-rules"));
        cmd.args([
            "backup",
            "download",
            "--endpoint",
            &b.s3.endpoint(),
            "--bucket",
            "etcd",
        ])
        .args(["--key", &object, "--out"])
        .arg(out)
        .env("AWS_ACCESS_KEY_ID", "AKIAICHORTEST")
        .env("AWS_SECRET_ACCESS_KEY", SECRET);
        if with_key {
            cmd.arg("--key-file").arg(dir.join("key"));
        }
        cmd.output().expect("runs")
    };
    let out = download(&dir.join("plain.snapshot"), false);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the snapshot is encrypted"));
    let out = download(&dir.join("plain.snapshot"), true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plain = std::fs::read(dir.join("plain.snapshot")).expect("the file");
    let sha = ring::digest::digest(&ring::digest::SHA256, &plain[..plain.len() - 32]);
    let hex: String = sha.as_ref().iter().map(|x| format!("{x:02x}")).collect();
    assert_eq!(hex, rec["sha256"].as_str().expect("sha"));
    assert!(plain.windows(marker.len()).any(|w| w == marker.as_bytes()));
    // The stored bytes hold no etcd key in clear.
    let raw = download_raw(&b, &object).await;
    assert!(raw.starts_with(ichor_rules::runtime::crypt::MAGIC));
    assert!(!raw.windows(marker.len()).any(|w| w == marker.as_bytes()));
    let _ = std::fs::remove_dir_all(&dir);
    b.assert_no_secret_written();
    for o in b
        .api
        .objects("TalosEtcdBackup", None)
        .into_iter()
        .chain(b.api.objects("Event", None))
    {
        assert!(!o.to_string().contains(key), "{o}");
    }
}

/// An object's bytes as stored (no check, no decryption), through the offline command's
/// store with the test's keys: read with a decryption that is not asked for, so the raw
/// bytes come back through a plain GET.
async fn download_raw(b: &Backed, key: &str) -> Vec<u8> {
    use object_store::ObjectStoreExt;
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(b.s3.endpoint())
        .with_bucket_name("etcd")
        .with_region("us-east-1")
        .with_access_key_id("AKIAICHORTEST")
        .with_secret_access_key(SECRET)
        .with_allow_http(true)
        .build()
        .expect("s3");
    s3.get(&object_store::path::Path::from(key))
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes")
        .to_vec()
}

/// The resident set of process `pid`, now and at its peak (`VmRSS`, `VmHWM`), in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect(name)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Issue 36's memory bound, measured on the real binary: `ichor-rules serve --no-webhook`
/// (its own process, against the in-process API server, the Talos stand-in over a real
/// etcd holding over 100 MiB, and moto's S3 server) takes an encrypted snapshot of that
/// etcd, streamed node -> process -> store, and the snapshot adds under 48 MiB to its peak
/// resident set (`VmHWM`, idle against after; the figures and `/proc/<pid>/smaps_rollup`
/// are printed; `ICHOR_BACKUP_MEMORY_PLAIN=1` measures without encryption). Its whole log (info level) never shows the
/// store's secret key or the encryption key. `ICHOR_BACKUP_MEMORY_MIB` sets the etcd size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_snapshots_a_100_mib_etcd_adding_under_48_mib_and_logs_no_key() {
    snapshot_memory(
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_ichor-rules")),
        None,
    )
    .await;
}

/// Issue 36's bound as the issue states it, on the release binary (as shipped): the whole
/// `serve` process's peak resident set (`VmHWM`) while it takes an encrypted snapshot of a
/// 100 MiB etcd stays under 64 MiB, and the snapshot's recorded revision is etcd's. Ignored
/// by default (it needs the release build): `cargo build --release --bin ichor-rules`, then
/// `cargo nextest run --run-ignored only -E 'test(/release_serve_snapshots/)' --no-capture`
/// (`ICHOR_RELEASE_BIN` names another binary: `scripts/test.sh` runs it on the image's
/// static binary once the image is built).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the release binary: cargo build --release --bin ichor-rules"]
async fn release_serve_snapshots_a_100_mib_etcd_under_64_mib_peak() {
    let bin = std::env::var_os("ICHOR_RELEASE_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(
                env!("CARGO_BIN_EXE_ichor-rules").replace("/debug/", "/release/"),
            )
        });
    assert!(
        bin.exists(),
        "{} is not built: cargo build --release --bin ichor-rules",
        bin.display()
    );
    snapshot_memory(bin, Some(64 * 1024)).await;
}

/// The memory test's body: `bin serve` snapshots a 100 MiB etcd (see
/// [`serve_snapshots_a_100_mib_etcd_adding_under_48_mib_and_logs_no_key`]); with
/// `peak_under_kib`, the process's absolute peak is asserted under it too.
async fn snapshot_memory(bin: std::path::PathBuf, peak_under_kib: Option<u64>) {
    use crate::support::etcd::EtcdCluster;
    use crate::support::s3::S3Server;
    use crate::support::talos::TalosApi;
    use base64::Engine;
    let mib: usize = std::env::var("ICHOR_BACKUP_MEMORY_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let s3 = S3Server::start().await;
    s3.create_bucket("etcd").await;
    let talos = TalosApi::start(EtcdCluster::start(1).await).await;
    // Over `mib` MiB of values that do not compress.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..(mib * 8 / 7 + 1) {
        let value: Vec<u8> = (0..896 * 1024)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        talos
            .etcd
            .put_at(0, &format!("bulk-{i:04}"), &value)
            .await
            .expect("put");
    }
    let db = talos.etcd.status_at(0).await.expect("status").db_size;
    assert!(db >= (mib as i64) << 20, "etcd holds {db} bytes");
    let api = ApiServer::start().await;
    let mut c = cluster("prod", 1);
    c["spec"]["talosConfigSecretRef"] = json!({"name": "prod-talos"});
    api.insert(c);
    let mut m = control_plane("cp-1", 1);
    m["spec"]["endpoint"] = json!(talos.node(0).endpoint());
    api.insert(m);
    let store_secret = "ICHOR-STORE-SECRET-5b2e97d1";
    let enc_key = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";
    for (name, data) in [
        (
            "prod-talos",
            json!({"talosconfig": b64(talos.talosconfig_yaml().as_bytes())}),
        ),
        (
            "s3-keys",
            json!({"AWS_ACCESS_KEY_ID": b64(b"AKIAICHORTEST"),
                   "AWS_SECRET_ACCESS_KEY": b64(store_secret.as_bytes())}),
        ),
        ("etcd-key", json!({"key": b64(enc_key.as_bytes())})),
    ] {
        api.insert(json!({"apiVersion": "v1", "kind": "Secret",
                          "metadata": {"name": name, "namespace": NS}, "data": data}));
    }
    let log = std::env::temp_dir().join(format!("ichor-backup-serve-{}.log", std::process::id()));
    let child = crate::support::https::Killed(
        std::process::Command::new(&bin)
            .args(["serve", "--rules", "rules", "--api-server", &api.url()])
            .args(["--lease-namespace", OPERATOR_NS, "--no-webhook"])
            .args(["--identity", "controller-0", "--log-format", "text"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::from(
                std::fs::File::create(&log).expect("log"),
            ))
            .spawn()
            .expect("serve starts"),
    );
    let pid = child.0.id();
    // Running, idle: the figure before any snapshot.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, idle_peak) = rss_kib(pid);
    println!(
        "{}",
        std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default()
    );
    let mut b = backup("nightly", &s3.endpoint());
    b["spec"]["store"]["bucket"] = json!("etcd");
    if std::env::var_os("ICHOR_BACKUP_MEMORY_PLAIN").is_none() {
        b["spec"]["encryption"] = json!({"keySecretRef": {"name": "etcd-key"}});
    }
    api.insert(b);
    let started = std::time::Instant::now();
    wait_for("the snapshot", Duration::from_secs(180), || {
        cond(&api, "TalosEtcdBackup", "nightly", "Snapshot")
            == Some(("True".into(), "Verified".into()))
    })
    .await;
    let took = started.elapsed();
    let (rss, peak) = rss_kib(pid);
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    println!("{rollup}");
    let record =
        get(&api, "TalosEtcdBackup", "nightly").expect("backup")["status"]["lastSnapshot"].clone();
    let size = record["size"].as_u64().expect("size");
    println!(
        "{}: etcd db {} MiB; snapshot ({}) stored {} MiB in {:.1}s; serve VmHWM idle {} KiB, \
         after the snapshot {} KiB (VmRSS {} KiB); revision {}",
        bin.display(),
        db >> 20,
        if record["encrypted"] == true {
            "encrypted"
        } else {
            "plain"
        },
        size >> 20,
        took.as_secs_f64(),
        idle_peak,
        peak,
        rss,
        record["revision"]
    );
    // The revision read from the 100 MiB snapshot as it streamed is etcd's.
    let etcd_rev = talos.etcd.status_at(0).await.expect("status").revision;
    assert_eq!(record["revision"].as_i64(), Some(etcd_rev), "{record}");
    if let Some(limit) = peak_under_kib {
        assert!(
            peak < limit,
            "serve's peak resident set was {peak} KiB while snapshotting, over {limit} KiB"
        );
    }
    assert!(size >= (mib as u64) << 20, "{size}");
    // What the snapshot adds to the process's peak: its buffers (one 5 MiB part, and one
    // sealed when encrypting), never the snapshot (over 100 MiB). The absolute peak of the
    // debug binary includes some 42 MiB of its own text (file-backed pages of a 400 MiB
    // debug binary) before any snapshot.
    let added = peak.saturating_sub(idle_peak);
    assert!(
        added < 48 * 1024,
        "the snapshot added {added} KiB to the peak resident set (from {idle_peak} to {peak} KiB)"
    );
    // The event (and its log line) follows the status write waited for above.
    wait_for(
        "the SnapshotTaken log line",
        Duration::from_secs(30),
        || std::fs::read_to_string(&log).is_ok_and(|t| t.contains("SnapshotTaken")),
    )
    .await;
    drop(child);
    let text = std::fs::read_to_string(&log).expect("the log");
    for k in [store_secret, enc_key] {
        assert!(!text.contains(k), "the log shows a key:\n{text}");
    }
    assert!(!text.contains("panicked"), "{text}");
    let _ = std::fs::remove_file(&log);
}
