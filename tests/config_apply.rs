//! Issue 37, the Talos side of applying: `ApplyConfiguration` (dry run, `auto`,
//! `no-reboot`, `staged`, the conflict table refused with Talos' words) and `Bootstrap`
//! (once), spoken by the client over mutual TLS to the stand-in with a real etcd, with
//! configurations the render library makes.

use crate::support::etcd::EtcdCluster;
use crate::support::talos::TalosApi;
use ichor_rules::runtime::render::{self, Base, Identity, Patch, Role};
use ichor_rules::runtime::talos::ApplyMode;

const CP: &str = include_str!("fixtures/talos/controlplane.yaml");
const WORKER: &str = include_str!("fixtures/talos/worker.yaml");

fn rendered(patches: &[&Patch]) -> String {
    let base = Base::parse(CP, WORKER, true).unwrap();
    render::render(
        &base,
        Role::ControlPlane,
        patches,
        Identity {
            hostname: Some("cp-1"),
            install_disk: None,
        },
    )
    .unwrap()
    .text
}

#[tokio::test]
async fn apply_configuration_dry_runs_applies_and_refuses_as_talos_does() {
    let api = TalosApi::start(EtcdCluster::start(1).await).await;
    let client = api.client(0);
    let first = rendered(&[]);
    // A dry run changes nothing and says what applying would do.
    let dry = client
        .apply_configuration(first.as_bytes(), ApplyMode::Auto, true)
        .await
        .unwrap();
    assert_eq!(dry.mode, ApplyMode::NoReboot);
    // Talos' answer is a diff of the whole configuration (the stand-in's, as Talos', holds
    // the base's secrets): the client keeps none of it.
    assert_eq!(
        dry.details,
        ichor_rules::runtime::talos::DRY_RUN_DETAILS_WITHHELD,
        "{}",
        dry.details
    );
    assert!(!format!("{dry:?}").contains("SECRET-BASE"));
    assert_eq!(api.node(0).config(), None);
    // Applied.
    let applied = client
        .apply_configuration(first.as_bytes(), ApplyMode::Auto, false)
        .await
        .unwrap();
    assert_eq!(applied.mode, ApplyMode::NoReboot);
    assert_eq!(api.node(0).config().as_deref(), Some(first.as_str()));
    // A change of the install disk needs a reboot: a dry run says so, no-reboot refuses it,
    // staged keeps it for the next boot.
    let disk = Patch::parse(
        "p",
        Some("version: v1alpha1\nmachine:\n  install:\n    disk: /dev/sdb\n"),
        None,
    )
    .unwrap();
    let second = rendered(&[&disk]);
    let dry = client
        .apply_configuration(second.as_bytes(), ApplyMode::Auto, true)
        .await
        .unwrap();
    assert_eq!(dry.mode, ApplyMode::Reboot);
    let e = client
        .apply_configuration(second.as_bytes(), ApplyMode::NoReboot, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("requires a reboot"), "{e}");
    let staged = client
        .apply_configuration(second.as_bytes(), ApplyMode::Staged, false)
        .await
        .unwrap();
    assert_eq!(staged.mode, ApplyMode::Staged);
    assert_eq!(
        api.node(0).config().as_deref(),
        Some(first.as_str()),
        "not applied yet"
    );
    assert_eq!(
        api.node(0).staged_config().as_deref(),
        Some(second.as_str())
    );
    // The conflict table, refused as Talos refuses it (a configuration made by hand: the
    // render library would not make it).
    let conflicting = format!("{first}\n---\napiVersion: v1alpha1\nkind: KubeletConfig\n");
    let e = client
        .apply_configuration(conflicting.as_bytes(), ApplyMode::Auto, true)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kubelet config is already set in v1alpha1 config (.machine.kubelet)"),
        "{e}"
    );
    // The error carries Talos' message, never the configuration (its secrets).
    assert!(!e.contains("SECRET-BASE"), "{e}");
    // Every document's conflict, as Talos reports them (its multierror), each in its words.
    let two = format!(
        "{conflicting}---\napiVersion: v1alpha1\nkind: KubeProxyConfig\n---\napiVersion: v1alpha1\nkind: KubeSpanConfig\n"
    );
    let e = client
        .apply_configuration(two.as_bytes(), ApplyMode::Auto, true)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "2 errors occurred:\n\t* kubelet config is already set in v1alpha1 config (.machine.kubelet)\n\t* cluster proxy config in v1alpha1 config (.machine.cluster.proxy) can't be used with KubeProxyConfig document, please remove it to avoid conflicts\n\n"
        ),
        "{e}"
    );
    assert_eq!(api.node(0).config().as_deref(), Some(first.as_str()));
}

#[tokio::test]
async fn bootstrap_is_accepted_once() {
    // A new cluster's node: its etcd never ran, so its member list fails.
    let api = TalosApi::start(EtcdCluster::unstarted(&["cp-1"])).await;
    let client = api.client(0);
    assert!(client.etcd_member_list().await.is_err());
    client.bootstrap().await.unwrap();
    // A real etcd of one member runs on it now.
    let members = client.etcd_member_list().await.unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].hostname, "cp-1");
    let e = client.bootstrap().await.unwrap_err().to_string();
    assert!(e.contains("etcd data directory is not empty"), "{e}");
    assert_eq!(api.node(0).bootstraps(), 2);
    // A node whose etcd runs already (an existing cluster's) is refused too.
    let running = TalosApi::start(EtcdCluster::start(1).await).await;
    let e = running.client(0).bootstrap().await.unwrap_err().to_string();
    assert!(e.contains("etcd data directory is not empty"), "{e}");
}
