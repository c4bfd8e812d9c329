//! The Talos API client against Talos API stand-ins backed by a REAL etcd cluster on
//! 127.0.0.1: reads, leadership, leaving, removing a dead member, reset, per-node errors,
//! unreachable nodes, mutual TLS and talosconfig parsing.

use crate::support::etcd;
use crate::support::talos;

use etcd::EtcdCluster;
use ichor_rules::runtime::talos::{TalosClient, TalosContext, TalosError, TalosTls};
use std::time::Duration;
use talos::{Pki, TalosApi, VERSION_TAG};
use tonic::Code;

const SETTLE: Duration = Duration::from_secs(30);

async fn cluster(n: usize) -> TalosApi {
    TalosApi::start(EtcdCluster::start(n).await).await
}

/// The index of the current leader.
async fn leader_index(api: &TalosApi) -> usize {
    let leader = api.etcd.leader(SETTLE).await.expect("a leader");
    api.etcd.index_of_id(leader).await.expect("the leader runs")
}

#[tokio::test]
async fn reads_version_members_and_status_directly_and_through_a_node() {
    let api = cluster(3).await;
    // The TLS material comes from the talosconfig the stand-ins hand out.
    let config = api.talosconfig_yaml();
    let tls = TalosTls::from_talosconfig(&config, None).expect("talosconfig");
    let ctx = TalosContext::from_talosconfig(&config, None).expect("talosconfig");
    assert_eq!(ctx.name, "ichor-test");
    assert_eq!(ctx.endpoints[0], api.node(0).endpoint());
    assert_eq!(ctx.nodes, ["cp-1", "cp-2", "cp-3"]);
    let client = TalosClient::new(&ctx.endpoints[0], &tls, Duration::from_secs(3)).expect("client");

    assert_eq!(client.version().await.expect("version"), VERSION_TAG);

    let members = client.etcd_member_list().await.expect("member list");
    let mut names: Vec<&str> = members.iter().map(|m| m.hostname.as_str()).collect();
    names.sort();
    assert_eq!(names, ["cp-1", "cp-2", "cp-3"]);
    let real = api.etcd.members().await;
    for m in &members {
        let r = real.iter().find(|r| r.id == m.id).expect("a real member");
        assert_eq!(r.name, m.hostname);
        assert_eq!(r.peer_urls, m.peer_urls);
        assert_eq!(r.client_urls, m.client_urls);
        assert!(!m.is_learner);
    }

    let leader = api.etcd.leader(SETTLE).await.expect("leader");
    let status = client.etcd_status().await.expect("status");
    assert_eq!(Some(status.member_id), api.etcd.member_id(0).await);
    assert_eq!(status.leader, leader);
    assert!(status.has_leader());
    assert!(status.errors.is_empty(), "{:?}", status.errors);
    assert!(
        status.protocol_version.starts_with("3.4"),
        "{}",
        status.protocol_version
    );

    // Through cp-1's endpoint, answered by cp-2 (by name) and cp-3 (by address).
    let via_name = client.with_node("cp-2");
    assert_eq!(via_name.node(), Some("cp-2"));
    let s2 = via_name.etcd_status().await.expect("status of cp-2");
    assert_eq!(Some(s2.member_id), api.etcd.member_id(1).await);
    assert_ne!(s2.member_id, status.member_id);
    let s3 = client
        .with_node(&api.node(2).endpoint())
        .etcd_status()
        .await
        .expect("status of cp-3");
    assert_eq!(Some(s3.member_id), api.etcd.member_id(2).await);
    // The original client still talks to cp-1.
    assert_eq!(
        client.etcd_status().await.expect("status").member_id,
        status.member_id
    );
}

#[tokio::test]
async fn forfeit_leadership_moves_the_leader_only_from_the_leader() {
    let api = cluster(3).await;
    let li = leader_index(&api).await;
    let old = api.etcd.member_id(li).await.expect("leader id");
    let follower = (li + 1) % 3;

    // A follower has nothing to give up.
    let none = api
        .client(follower)
        .etcd_forfeit_leadership()
        .await
        .expect("forfeit");
    assert_eq!(none, "");
    assert_eq!(api.etcd.leader(SETTLE).await, Some(old));

    // The leader gives it up, through a sibling's endpoint (node metadata).
    let gave = api
        .client(follower)
        .with_node(api.node(li).name())
        .etcd_forfeit_leadership()
        .await
        .expect("forfeit");
    assert_eq!(gave, api.node(li).name());
    let new = api.etcd.leader(SETTLE).await.expect("a new leader");
    assert_ne!(new, old, "leadership did not move");
    let status = api.client(li).etcd_status().await.expect("status");
    assert_eq!(status.leader, new);
    assert!(!status.is_leader());
}

#[tokio::test]
async fn leave_cluster_removes_the_member_from_real_etcd() {
    let api = cluster(3).await;
    // A leader leaves too: forfeit first, as the controller does.
    let li = leader_index(&api).await;
    let client = api.client(li);
    client.etcd_forfeit_leadership().await.expect("forfeit");
    client.etcd_leave_cluster().await.expect("leave");

    let mut expected: Vec<String> = (0..3)
        .filter(|&i| i != li)
        .map(|i| api.etcd.name(i))
        .collect();
    expected.sort();
    assert_eq!(api.etcd.member_names().await, expected);
    assert!(!api.etcd.is_running(li), "the member's etcd still runs");
    let sibling = (li + 1) % 3;
    let listed = api
        .client(sibling)
        .etcd_member_list()
        .await
        .expect("member list");
    assert_eq!(listed.len(), 2);
    assert!(
        api.etcd.leader(SETTLE).await.is_some(),
        "two members keep a leader"
    );

    // Leaving again: the node answers with a clear error, and nothing changes.
    let again = client.etcd_leave_cluster().await.expect_err("second leave");
    match &again {
        TalosError::Failed { code, message, .. } => {
            assert_eq!(*code, Code::FailedPrecondition);
            assert!(message.contains("etcd is not running"), "{message}");
        }
        other => panic!("expected Failed, got {other}"),
    }
    assert_eq!(api.etcd.member_names().await, expected);
}

#[tokio::test]
async fn a_dead_member_is_removed_by_id_through_a_sibling() {
    let api = cluster(3).await;
    let dead_id = api.etcd.member_id(2).await.expect("id of cp-3");
    api.etcd.kill(2);

    // Its Talos API answers, its etcd does not: a failure, not an unreachable node.
    let err = api
        .client(2)
        .etcd_status()
        .await
        .expect_err("status of a dead member");
    match &err {
        TalosError::Failed {
            code,
            message,
            node,
            ..
        } => {
            assert_eq!(*code, Code::Unknown);
            assert!(message.contains("does not answer"), "{message}");
            assert_eq!(node.as_deref(), None);
        }
        other => panic!("expected Failed, got {other}"),
    }
    // Through a sibling: the per-node error in the response metadata, with the node named.
    let err = api
        .client(0)
        .with_node("cp-3")
        .etcd_member_list()
        .await
        .expect_err("member list of a dead member");
    match &err {
        TalosError::Failed {
            node,
            code,
            message,
            endpoint,
        } => {
            assert_eq!(node.as_deref(), Some("cp-3"));
            assert_eq!(*code, Code::Unknown);
            assert!(message.contains("does not answer"), "{message}");
            assert_eq!(endpoint, &api.node(0).endpoint());
        }
        other => panic!("expected Failed, got {other}"),
    }
    assert!(
        err.to_string().contains("of node cp-3 (through 127.0.0.1:"),
        "{err}"
    );

    // A healthy sibling still lists the dead member, and removes it by ID (once the two
    // left have a leader: the dead one may have led).
    assert!(
        api.etcd.leader(SETTLE).await.is_some(),
        "no leader after the kill"
    );
    let sibling = api.client(0);
    let listed = sibling.etcd_member_list().await.expect("member list");
    assert!(
        listed
            .iter()
            .any(|m| m.id == dead_id && m.hostname == "cp-3")
    );
    sibling
        .etcd_remove_member_by_id(dead_id)
        .await
        .expect("remove by id");
    assert_eq!(api.etcd.member_names().await, ["cp-1", "cp-2"]);
    let listed = sibling.etcd_member_list().await.expect("member list");
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|m| m.id != dead_id));

    // Removing it again: etcd's NotFound, mapped as the node's failure.
    let err = sibling
        .etcd_remove_member_by_id(dead_id)
        .await
        .expect_err("second remove");
    match &err {
        TalosError::Failed { code, message, .. } => {
            assert_eq!(*code, Code::NotFound);
            assert!(message.contains("member not found"), "{message}");
            assert!(message.contains(&dead_id.to_string()), "{message}");
        }
        other => panic!("expected Failed, got {other}"),
    }
}

#[tokio::test]
async fn graceful_reset_leaves_etcd_then_the_node_reboots() {
    let api = cluster(3).await;
    let client = api.client(1);
    client.reset(true, true).await.expect("reset");
    assert_eq!(api.node(1).resets(), 1);
    assert_eq!(api.etcd.member_names().await, ["cp-1", "cp-3"]);
    assert!(!api.etcd.is_running(1));

    // Rebooting: unreachable, directly and through a sibling.
    let err = client.version().await.expect_err("a rebooting node");
    assert!(err.is_unreachable(), "{err}");
    assert!(err.to_string().contains("rebooting"), "{err}");
    let err = api
        .client(0)
        .with_node("cp-2")
        .version()
        .await
        .expect_err("through a sibling");
    match &err {
        TalosError::Unreachable { node, .. } => assert_eq!(node.as_deref(), Some("cp-2")),
        other => panic!("expected Unreachable, got {other}"),
    }
    // A second reset does not reach it.
    assert!(
        client
            .reset(true, true)
            .await
            .expect_err("second reset")
            .is_unreachable()
    );
    assert_eq!(api.node(1).resets(), 1);

    // Back from the reboot: answers again, no etcd member, the reset counted once.
    api.node(1).start_again().await;
    assert_eq!(
        client.version().await.expect("version after reboot"),
        VERSION_TAG
    );
    assert!(
        client.etcd_status().await.is_err(),
        "a wiped node has no etcd member"
    );
    assert_eq!(api.node(1).resets(), 1);
    assert_eq!(api.etcd.member_names().await, ["cp-1", "cp-3"]);

    // A hard (non-graceful) reset leaves the member listed, dead.
    api.client(2).reset(false, false).await.expect("hard reset");
    assert_eq!(api.node(2).resets(), 1);
    assert!(!api.etcd.is_running(2));
    let listed = api.etcd.member_list_at(0).await.expect("member list");
    assert!(listed.iter().any(|m| m.name == "cp-3"), "{listed:?}");
}

#[tokio::test]
async fn unreachable_nodes_and_refused_certificates() {
    let api = cluster(1).await;
    let client = api.client(0);
    assert_eq!(client.version().await.expect("version"), VERSION_TAG);

    // A client certificate from another CA: the node refuses the handshake.
    let foreign = TalosClient::new(
        &api.node(0).endpoint(),
        &api.pki().foreign_client_tls(),
        Duration::from_secs(3),
    )
    .expect("client");
    let err = foreign
        .version()
        .await
        .expect_err("a foreign client certificate");
    let text = err.to_string();
    assert!(
        text.contains("UnknownCA") || text.contains("certificate"),
        "{text}"
    );
    assert!(err.is_unreachable(), "{err}");

    // A client that trusts another CA refuses the node's certificate.
    let other = Pki::new();
    let distrust = TalosClient::new(
        &api.node(0).endpoint(),
        &other.client_tls(),
        Duration::from_secs(3),
    )
    .expect("client");
    let err = distrust
        .version()
        .await
        .expect_err("a node from another CA");
    assert!(err.is_unreachable(), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    // Unknown node behind a reachable endpoint.
    let err = client
        .with_node("cp-9")
        .version()
        .await
        .expect_err("unknown node");
    match &err {
        TalosError::Unreachable { node, detail, .. } => {
            assert_eq!(node.as_deref(), Some("cp-9"));
            assert!(detail.contains("no such host"), "{detail}");
        }
        other => panic!("expected Unreachable, got {other}"),
    }

    // The node's Talos API stops: dials are refused, with the dial error in the detail.
    api.node(0).stop().await;
    let err = client.version().await.expect_err("a stopped node");
    match &err {
        TalosError::Unreachable {
            endpoint,
            node,
            detail,
        } => {
            assert_eq!(endpoint, &api.node(0).endpoint());
            assert_eq!(node, &None);
            assert!(
                detail.to_lowercase().contains("connection refused"),
                "{detail}"
            );
        }
        other => panic!("expected Unreachable, got {other}"),
    }
    assert_eq!(err.metric_label(), "unreachable");
    assert!(
        err.to_string().starts_with("Talos API at 127.0.0.1:"),
        "{err}"
    );
    // Its etcd kept running.
    assert!(api.etcd.is_running(0));
}

#[tokio::test]
async fn the_node_certificate_must_name_the_endpoint() {
    let etcd = EtcdCluster::start(1).await;
    // Signed by the trusted CA, but for another address only.
    let api =
        TalosApi::start_with_pki(etcd, Pki::with_server_sans(&["10.9.9.9", "cp-1.example"])).await;
    let err = api
        .client(0)
        .version()
        .await
        .expect_err("a certificate for another address");
    assert!(err.is_unreachable(), "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    // The same node with a certificate naming 127.0.0.1 answers.
    let good = TalosApi::start(api.etcd.clone()).await;
    assert_eq!(
        good.client(0).version().await.expect("version"),
        VERSION_TAG
    );
}

#[tokio::test]
async fn a_replacement_grows_the_cluster_to_four_then_the_old_member_leaves() {
    let mut api = cluster(3).await;
    let index = api.etcd.add_member("cp-4").await;
    assert_eq!(index, 3);
    let node = api.add_node(index).await;
    assert_eq!(node.name(), "cp-4");
    api.etcd
        .wait_healthy(4)
        .await
        .expect("four healthy members");

    // The new node answers for itself, and through an old node's endpoint.
    let new = api.client(3);
    let listed = new.etcd_member_list().await.expect("member list on cp-4");
    assert_eq!(listed.len(), 4);
    let s4 = api
        .client(0)
        .with_node("cp-4")
        .etcd_status()
        .await
        .expect("status of cp-4");
    assert_eq!(Some(s4.member_id), api.etcd.member_id(3).await);
    assert!(s4.has_leader());

    // The replaced member leaves (forfeiting leadership first), and three remain.
    let old = api.client(0);
    old.etcd_forfeit_leadership().await.expect("forfeit");
    old.etcd_leave_cluster().await.expect("leave");
    assert_eq!(api.etcd.member_names().await, ["cp-2", "cp-3", "cp-4"]);
    assert!(api.etcd.leader(SETTLE).await.is_some());
    let listed = new.etcd_member_list().await.expect("member list on cp-4");
    let mut names: Vec<String> = listed.into_iter().map(|m| m.hostname).collect();
    names.sort();
    assert_eq!(names, ["cp-2", "cp-3", "cp-4"]);
}

#[tokio::test]
async fn a_silent_endpoint_is_unreachable_after_the_timeout() {
    // Accepts connections (the kernel's backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = silent.local_addr().expect("addr").to_string();
    let pki = Pki::new();
    let client =
        TalosClient::new(&endpoint, &pki.client_tls(), Duration::from_millis(300)).expect("client");
    let started = std::time::Instant::now();
    let err = client.etcd_status().await.expect_err("no answer");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    match &err {
        TalosError::Unreachable {
            endpoint: e,
            detail,
            ..
        } => {
            assert_eq!(e, &endpoint);
            assert!(
                detail.contains("deadline") || detail.contains("timed out"),
                "{detail}"
            );
        }
        other => panic!("expected Unreachable, got {other}"),
    }
}

#[test]
fn talosconfig_good_named_and_malformed() {
    let pki = Pki::new();
    let good = pki.talosconfig("prod", &["10.0.0.5".into()], &["cp-1".into()]);
    let ctx = TalosContext::from_talosconfig(&good, None).expect("current context");
    assert_eq!(ctx.name, "prod");
    assert_eq!(ctx.endpoints, ["10.0.0.5"]);
    assert!(TalosTls::from_talosconfig(&good, Some("prod")).is_ok());

    let config_error = |yaml: &str, context: Option<&str>| -> String {
        match TalosTls::from_talosconfig(yaml, context) {
            Err(TalosError::Config(m)) => m,
            Err(other) => panic!("expected a config error, got {other}"),
            Ok(_) => panic!("accepted {yaml:?}"),
        }
    };
    let m = config_error(&good, Some("staging"));
    assert!(
        m.contains("no context `staging`") && m.contains("`prod`"),
        "{m}"
    );
    let m = config_error("contexts: {}\n", None);
    assert!(m.contains("no current context"), "{m}");
    let m = config_error("context: a\ncontexts: [1, 2]\n", None);
    assert!(m.contains("not valid YAML of the expected shape"), "{m}");
    let m = config_error(":: not yaml\n\t- [", None);
    assert!(m.contains("YAML"), "{m}");
    // Nested too deep: refused by the one bounded loader, before the YAML parser.
    let m = config_error(&"[".repeat(60_000), None);
    assert!(m.contains("nested more than 128 levels deep"), "{m}");
    let m = config_error("context: a\ncontexts:\n  a:\n", None);
    assert!(m.contains("context `a` is empty"), "{m}");
    let m = config_error("context: a\ncontexts:\n  a:\n    endpoints: [x]\n", None);
    assert!(m.contains("has no `ca`"), "{m}");
    let m = config_error(
        "context: a\ncontexts:\n  a:\n    ca: '%%%'\n    crt: eA==\n    key: eA==\n",
        None,
    );
    assert!(m.contains("`ca` is not base64"), "{m}");
    // base64 of something that is not PEM.
    let m = config_error(
        "context: a\ncontexts:\n  a:\n    ca: aGVsbG8=\n    crt: aGVsbG8=\n    key: aGVsbG8=\n",
        None,
    );
    assert!(m.contains("ca: no PEM certificate"), "{m}");
    // A key that is not a key.
    let bad_key = good.replace(
        good.lines()
            .find(|l| l.trim_start().starts_with("key:"))
            .expect("key line"),
        "    key: aGVsbG8=",
    );
    let m = config_error(&bad_key, None);
    assert!(m.contains("key: not a PEM private key"), "{m}");

    // Every prefix of a good config: an answer, never a panic.
    for end in (0..good.len()).step_by(7) {
        let _ = TalosTls::from_talosconfig(&good[..end], None);
    }

    // PEM directly.
    assert!(
        TalosTls::from_pem(
            pki.ca_pem.as_bytes(),
            pki.client_crt.as_bytes(),
            pki.client_key.as_bytes()
        )
        .is_ok()
    );
    assert!(matches!(
        TalosTls::from_pem(b"", pki.client_crt.as_bytes(), pki.client_key.as_bytes()),
        Err(TalosError::Config(_))
    ));
}

#[test]
fn a_client_needs_a_runtime_and_a_usable_endpoint() {
    let tls = Pki::new().client_tls();
    match TalosClient::new("127.0.0.1", &tls, Duration::from_secs(1)) {
        Err(TalosError::Config(m)) => assert!(m.contains("Tokio runtime"), "{m}"),
        other => panic!("expected a config error, got {other:?}"),
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let c = TalosClient::new("127.0.0.1", &tls, Duration::from_secs(1)).expect("client");
        assert_eq!(c.endpoint(), "127.0.0.1:50000");
        assert!(matches!(
            TalosClient::new("https://127.0.0.1", &tls, Duration::from_secs(1)),
            Err(TalosError::Config(_))
        ));
    });
}

/// Issue 35: the operation calls on the wire, against the stand-in and real etcd. A reboot
/// takes the node down for its downtime (its etcd member down, every call `Unavailable`)
/// and brings it back with a new `SystemStat.boot_time`, its member restarted from its
/// data; the legacy `Upgrade` reboots into the image's tag; `Rollback` back to the tag it
/// ran before; the `ImageService/Pull` and `LifecycleService/Upgrade` streams name the
/// pulled image and end with an `exit_code` (non-zero read as such, not as an error); a
/// node that never comes back stays down.
#[tokio::test]
async fn operation_calls_reboot_upgrade_roll_back_and_stream_an_exit_code() {
    let api = cluster(3).await;
    let client = api.client(1);
    let node = api.node(1);
    node.set_downtime(Duration::from_millis(800));
    let booted = client.boot_time().await.expect("boot time");
    assert_eq!(booted, talos::FIRST_BOOT + 1);

    // Reboot: answered, then down, then back with a new boot time and its etcd member.
    let actor = client
        .reboot(ichor_rules::runtime::talos::RebootMode::Default)
        .await
        .expect("reboot");
    assert!(actor.contains("reboot"), "{actor}");
    let deadline = std::time::Instant::now() + SETTLE;
    while !node.is_down() {
        assert!(std::time::Instant::now() < deadline, "never went down");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let down = client.boot_time().await.expect_err("down");
    assert!(down.is_unreachable(), "{down}");
    let back = loop {
        if let Ok(t) = client.boot_time().await {
            break t;
        }
        assert!(std::time::Instant::now() < deadline, "never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(back > booted, "{back} after {booted}");
    api.etcd.wait_healthy(3).await.expect("etcd whole again");
    let downs = api.downtimes();
    assert_eq!(downs.len(), 1, "{downs:?}");
    assert_eq!(downs[0].node, "cp-2");
    assert!(
        downs[0].to.is_some_and(|to| to > downs[0].from),
        "{downs:?}"
    );

    // The legacy upgrade reboots into the image's tag.
    let u = ichor_rules::runtime::talos::LegacyUpgrade {
        image: "ghcr.io/siderolabs/installer:v1.12.4".into(),
        preserve: false,
        stage: false,
        force: false,
        powercycle: false,
    };
    assert!(!client.upgrade_legacy(&u).await.expect("upgrade").is_empty());
    let wait_version = |want: &'static str| {
        let client = client.clone();
        async move {
            let deadline = std::time::Instant::now() + SETTLE;
            loop {
                if client.version().await.is_ok_and(|v| v == want) {
                    return;
                }
                assert!(std::time::Instant::now() < deadline, "never ran {want}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_version("v1.12.4").await;
    // Rollback: back to what it ran before.
    client.rollback().await.expect("rollback");
    wait_version(VERSION_TAG).await;

    // The newer path: pull, install (exit code 0 stages the tag), reboot.
    let name = client
        .image_pull(
            "ghcr.io/siderolabs/installer:v1.13.1",
            Duration::from_secs(5),
        )
        .await
        .expect("pull");
    assert_eq!(name, "ghcr.io/siderolabs/installer:v1.13.1");
    let done = client
        .lifecycle_upgrade(&name, Duration::from_secs(5))
        .await
        .expect("install");
    assert_eq!(done.exit_code, 0, "{done:?}");
    assert_eq!(client.version().await.expect("v"), VERSION_TAG);
    client
        .reboot(ichor_rules::runtime::talos::RebootMode::Default)
        .await
        .expect("reboot");
    wait_version("v1.13.1").await;
    // A failing install: its exit code, not an error, and nothing staged.
    node.set_install_exit_code(3);
    let failed = client
        .lifecycle_upgrade(
            "ghcr.io/siderolabs/installer:v1.13.2",
            Duration::from_secs(5),
        )
        .await
        .expect("a stream that ends");
    assert_eq!(failed.exit_code, 3, "{failed:?}");
    assert_eq!(api.calls_to("LifecycleService/Upgrade", "cp-2"), 2);

    // A node that never comes back.
    let other = api.client(2);
    api.node(2).never_back();
    other.shutdown(false).await.expect("shutdown");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(other.version().await.expect_err("gone").is_unreachable());
    assert!(
        api.downtimes()
            .iter()
            .any(|d| d.node == "cp-3" && d.to.is_none())
    );
}
