//! The webhook's own certificates (`runtime::certs`, `serve --tls-secret`), with the real
//! kube client against the in-process API server: replicas racing agree on one Secret, the
//! caBundle of every webhook is set, a pair near its end is rotated under the same CA, and
//! `serve` serves what the Secret holds, for the Service's name, under the bundle.

use crate::support::apiserver;

use crate::support::https;

use apiserver::ApiServer;
use ichor_rules::runtime::certs::{self, CertSettings};
use ichor_rules::runtime::tls::ReloadingCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "ichor-system";
const SECRET: &str = "guard-ichor-rules-tls";
const VWC: &str = "guard-ichor-rules-ichor-system";
const DAY: Duration = Duration::from_secs(24 * 3600);

fn settings() -> CertSettings {
    CertSettings {
        namespace: NS.into(),
        secret: SECRET.into(),
        webhook_configuration: Some(VWC.into()),
        dns_names: CertSettings::service_names("guard-ichor-rules", NS),
        validity: DAY * 365,
        ca_validity: DAY * 3650,
        renew_before: DAY * 30,
    }
}

fn webhook_configuration() -> Value {
    let hook = |r: &str| {
        json!({
            "name": format!("{r}.validate.ichor.maesh.dev"),
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "clientConfig": {"service": {"name": "guard-ichor-rules", "namespace": NS,
                                          "path": format!("/validate/{r}"), "port": 443}},
            "rules": [{"apiGroups": ["ichor.maesh.dev"], "apiVersions": ["v1alpha1"],
                       "operations": ["UPDATE"], "resources": [r]}]
        })
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": VWC},
        "webhooks": [hook("talosmachines"), hook("talosclusters")]
    })
}

fn b64decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64")
}

fn secret(api: &ApiServer) -> Value {
    let all = api.objects("Secret", Some(NS));
    assert_eq!(all.len(), 1, "one Secret: {all:?}");
    all[0].clone()
}

fn data(secret: &Value, key: &str) -> String {
    String::from_utf8(b64decode(secret["data"][key].as_str().expect(key))).expect("utf-8")
}

/// A TLS handshake, in memory, between the pair and a client trusting `ca_pem` that dials
/// `name`: what the API server does.
fn handshake(cert_pem: &str, key_pem: &str, ca_pem: &str, name: &str) -> Result<(), String> {
    let cert =
        Arc::new(ReloadingCert::from_pem(cert_pem, key_pem, "test").map_err(|e| e.to_string())?);
    let server_config = Arc::new(cert.server_config().map_err(|e| e.to_string())?);
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut client = rustls::ClientConnection::new(
        Arc::new(client_config),
        ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let mut server = rustls::ServerConnection::new(server_config).map_err(|e| e.to_string())?;
    for _ in 0..10 {
        let mut buf = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut buf).map_err(|e| e.to_string())?;
        }
        server
            .read_tls(&mut buf.as_slice())
            .map_err(|e| e.to_string())?;
        server
            .process_new_packets()
            .map_err(|e| format!("server: {e}"))?;
        let mut buf = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut buf).map_err(|e| e.to_string())?;
        }
        client
            .read_tls(&mut buf.as_slice())
            .map_err(|e| e.to_string())?;
        client
            .process_new_packets()
            .map_err(|e| format!("client: {e}"))?;
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
    }
    Err("the handshake did not finish".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_racing_agree_on_one_secret_and_the_ca_bundle_is_set() {
    let api = ApiServer::start().await;
    api.insert(webhook_configuration());
    let s = settings();
    // Three replicas start at once.
    let (c1, c2, c3) = (api.client(), api.client(), api.client());
    let (a, b, c) = tokio::join!(
        certs::ensure(&c1, &s),
        certs::ensure(&c2, &s),
        certs::ensure(&c3, &s)
    );
    let (a, b, c) = (a.expect("a"), b.expect("b"), c.expect("c"));
    assert_eq!(a, b, "the replicas serve the same pair");
    assert_eq!(b, c);
    let stored = secret(&api);
    assert_eq!(stored["metadata"]["name"], SECRET);
    assert_eq!(stored["type"], "kubernetes.io/tls");
    assert_eq!(data(&stored, "tls.crt"), a.cert_pem);
    assert_eq!(data(&stored, "ca.crt"), a.ca_pem);
    // The pair serves every name the API server may dial, under the CA.
    for name in CertSettings::service_names("guard-ichor-rules", NS) {
        handshake(&a.cert_pem, &a.key_pem, &a.ca_pem, &name)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    handshake(&a.cert_pem, &a.key_pem, &a.ca_pem, "other.ichor-system.svc")
        .expect_err("a name it does not carry");
    // Asked again: nothing new.
    let again = certs::ensure(&c1, &s).await.expect("again");
    assert_eq!(again, a);
    assert_eq!(
        secret(&api)["metadata"]["resourceVersion"],
        stored["metadata"]["resourceVersion"]
    );

    // The caBundle of every webhook.
    assert!(
        certs::patch_ca_bundle(&c1, VWC, &a.ca_pem)
            .await
            .expect("patch")
    );
    let vwc = api.objects("ValidatingWebhookConfiguration", None);
    let hooks = vwc[0]["webhooks"].as_array().expect("webhooks");
    assert_eq!(hooks.len(), 2);
    for h in hooks {
        let bundle = b64decode(h["clientConfig"]["caBundle"].as_str().expect("caBundle"));
        assert_eq!(String::from_utf8(bundle).expect("pem"), a.ca_pem);
        assert_eq!(
            h["clientConfig"]["service"]["name"], "guard-ichor-rules",
            "kept"
        );
    }
    assert!(
        !certs::patch_ca_bundle(&c2, VWC, &a.ca_pem)
            .await
            .expect("patch"),
        "already set"
    );
    // A missing configuration is said.
    let err = certs::patch_ca_bundle(&c1, "nope", &a.ca_pem)
        .await
        .expect_err("missing");
    assert!(err.to_string().contains("nope does not exist"), "{err}");
}

#[tokio::test]
async fn a_pair_near_its_end_is_rotated_under_the_same_ca() {
    let api = ApiServer::start().await;
    let s = settings();
    let client = api.client();
    let first = certs::ensure(&client, &s).await.expect("first");
    // Ten days left, and thirty is when it is renewed.
    let soon = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(240))
        .expect("time")
        .to_string();
    let mut stored = secret(&api);
    stored["metadata"]["annotations"][certs::NOT_AFTER] = json!(soon);
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(api.test_client(), NS);
    let typed: k8s_openapi::api::core::v1::Secret = serde_json::from_value(stored).expect("secret");
    secrets
        .replace(SECRET, &Default::default(), &typed)
        .await
        .expect("age the Secret");
    let rotated = certs::ensure(&client, &s).await.expect("rotated");
    assert_ne!(
        rotated.cert_pem, first.cert_pem,
        "a new serving certificate"
    );
    assert_ne!(rotated.key_pem, first.key_pem, "and key");
    assert_eq!(
        rotated.ca_pem, first.ca_pem,
        "the same CA: the caBundle stays valid"
    );
    handshake(
        &rotated.cert_pem,
        &rotated.key_pem,
        &first.ca_pem,
        "guard-ichor-rules.ichor-system.svc",
    )
    .expect("the new pair verifies under the bundle already set");
    let not_after: jiff::Timestamp = secret(&api)["metadata"]["annotations"][certs::NOT_AFTER]
        .as_str()
        .expect("not-after")
        .parse()
        .expect("a time");
    assert!(
        not_after
            > jiff::Timestamp::now()
                .checked_add(jiff::SignedDuration::from_hours(24 * 300))
                .expect("t")
    );
    // Other names (the Service renamed): a new serving certificate for them.
    let renamed = CertSettings {
        dns_names: CertSettings::service_names("guard", NS),
        ..s.clone()
    };
    let other = certs::ensure(&client, &renamed).await.expect("renamed");
    assert_eq!(other.ca_pem, first.ca_pem);
    handshake(
        &other.cert_pem,
        &other.key_pem,
        &other.ca_pem,
        "guard.ichor-system.svc",
    )
    .expect("the new name");
    // A Secret that is not a complete pair (someone emptied it) is filled again.
    let mut broken = secret(&api);
    broken["data"] = json!({});
    let typed: k8s_openapi::api::core::v1::Secret = serde_json::from_value(broken).expect("secret");
    secrets
        .replace(SECRET, &Default::default(), &typed)
        .await
        .expect("empty it");
    let refilled = certs::ensure(&client, &s).await.expect("refilled");
    handshake(
        &refilled.cert_pem,
        &refilled.key_pem,
        &refilled.ca_pem,
        "guard-ichor-rules.ichor-system.svc",
    )
    .expect("a working pair again");
}

/// `serve --tls-secret`: two webhook replicas start against an empty namespace; they
/// create one Secret, set the caBundle, and both serve its pair for the Service's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_serve_replicas_create_one_secret_set_the_bundle_and_serve_it() {
    let api = ApiServer::start().await;
    api.insert(webhook_configuration());
    let start = |listen: std::net::SocketAddr| {
        https::Killed(
            Command::new(env!("CARGO_BIN_EXE_ichor-rules"))
                .args(["serve", "--no-controller", "--rules", "rules"])
                .args(["--listen", &listen.to_string(), "--api-server", &api.url()])
                .args([
                    "--tls-secret",
                    SECRET,
                    "--service-name",
                    "guard-ichor-rules",
                ])
                .args(["--webhook-configuration", VWC, "--lease-namespace", NS])
                .args(["--reload-interval-ms", "100"])
                .stderr(Stdio::null())
                .spawn()
                .expect("serve starts"),
        )
    };
    let (l1, l2) = (https::free_address(), https::free_address());
    let (_a, _b) = (start(l1), start(l2));
    let mut bundle = None;
    for _ in 0..100 {
        let vwc = api.objects("ValidatingWebhookConfiguration", None);
        if let Some(b) = vwc[0]["webhooks"][1]["clientConfig"]["caBundle"].as_str() {
            bundle = Some(String::from_utf8(b64decode(b)).expect("pem"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bundle = bundle.expect("the caBundle is set");
    assert_eq!(data(&secret(&api), "ca.crt"), bundle, "one Secret, its CA");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        roots.add(c.expect("cert")).expect("root");
    }
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    for listen in [l1, l2] {
        let mut ok = false;
        for _ in 0..100 {
            if let Ok(tcp) = tokio::net::TcpStream::connect(listen).await {
                let name =
                    ServerName::try_from("guard-ichor-rules.ichor-system.svc").expect("name");
                let mut s = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .expect("the API server's handshake verifies");
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .await
                    .expect("write");
                let mut t = String::new();
                let _ = s.read_to_string(&mut t).await;
                assert!(t.starts_with("HTTP/1.1 200"), "{t}");
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ok, "{listen} serves");
    }
    // A helm upgrade re-applies the configuration without the bundle: it is set again.
    let mut vwc = api.objects("ValidatingWebhookConfiguration", None)[0].clone();
    for h in vwc["webhooks"].as_array_mut().expect("webhooks") {
        h["clientConfig"]
            .as_object_mut()
            .expect("cc")
            .remove("caBundle");
    }
    let typed: k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration =
        serde_json::from_value(vwc).expect("vwc");
    kube::Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
        api.test_client(),
    )
    .replace(VWC, &Default::default(), &typed)
    .await
    .expect("reset the bundle");
    let mut again = false;
    for _ in 0..100 {
        let vwc = api.objects("ValidatingWebhookConfiguration", None);
        if vwc[0]["webhooks"][0]["clientConfig"]["caBundle"].is_string() {
            again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(again, "the caBundle is set again");
    // Every call the two replicas made is one the chart grants the webhook with
    // certificates of its own (access::webhook_role), in the scope it grants it.
    use ichor_rules::runtime::access::{Scope, webhook_role};
    let granted = webhook_role(false, true);
    let mut seen = std::collections::BTreeSet::new();
    for r in api
        .store
        .faults
        .take_log()
        .into_iter()
        .filter(|r| !r.by_test)
    {
        let parts: Vec<&str> = r.path.trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", _, rest @ ..] => ("", rest),
            ["apis", g, _, rest @ ..] => (*g, rest),
            _ => continue,
        };
        let (scope, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (
                if *ns == NS {
                    Scope::LeaseNamespace
                } else {
                    Scope::Cluster
                },
                rest,
            ),
            rest => (Scope::Cluster, rest),
        };
        let (resource, named) = match rest {
            [res] => (res.to_string(), false),
            [res, _] => (res.to_string(), true),
            [res, _, sub] => (format!("{res}/{sub}"), true),
            _ => continue,
        };
        let verb = match (r.method.as_str(), named) {
            ("GET", true) => "get",
            ("GET", false) if r.watch => "watch",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            _ => "delete",
        };
        assert!(
            granted.iter().any(|a| a.api_group == group
                && a.resource == resource
                && a.verbs.contains(&verb)
                && (a.scope == scope || a.scope == Scope::Cluster)),
            "the webhook called {} {} ({verb} {group}/{resource}), which it is not granted",
            r.method,
            r.path
        );
        seen.insert((group.to_string(), resource, verb));
    }
    for call in [("", "secrets", "get"), ("", "secrets", "create")] {
        assert!(
            seen.contains(&(call.0.to_string(), call.1.to_string(), call.2)),
            "{call:?} in {seen:?}"
        );
    }
}
