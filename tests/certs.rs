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
        overlap: Duration::from_secs(6),
        identity: "test-replica".into(),
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

/// The time `n` days from now (before it when negative).
fn days(n: i64) -> jiff::Timestamp {
    jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_hours(24 * n))
        .expect("time")
}

/// A certificate valid from the day of `from` to the day of `to` (UTC midnights).
fn valid(p: &mut rcgen::CertificateParams, from: jiff::Timestamp, to: jiff::Timestamp) {
    let ymd = |t: jiff::Timestamp| {
        let d = t.to_zoned(jiff::tz::TimeZone::UTC).date();
        rcgen::date_time_ymd(
            i32::from(d.year()),
            u8::try_from(d.month()).expect("month"),
            u8::try_from(d.day()).expect("day"),
        )
    };
    p.not_before = ymd(from);
    p.not_after = ymd(to);
}

/// A self-signed CA valid from `from` to `to`: (certificate PEM, key PEM).
fn new_ca(name: &str, from: jiff::Timestamp, to: jiff::Timestamp) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    p.distinguished_name
        .push(rcgen::DnType::CommonName, name.to_string());
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    valid(&mut p, from, to);
    let cert = p.self_signed(&key).expect("CA");
    (cert.pem(), key.serialize_pem())
}

/// A serving certificate for `names` issued by `ca` (certificate PEM, key PEM), valid
/// from `from` to `to`.
fn issue(
    ca: &(String, String),
    names: &[String],
    from: jiff::Timestamp,
    to: jiff::Timestamp,
) -> (String, String) {
    let ca_key = rcgen::KeyPair::from_pem(&ca.1).expect("CA key");
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.0, ca_key).expect("issuer");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p = rcgen::CertificateParams::new(names.to_vec()).expect("params");
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    valid(&mut p, from, to);
    let cert = p.signed_by(&key, &issuer).expect("certificate");
    (cert.pem(), key.serialize_pem())
}

/// Sets these keys of the Secret's data (a person's `kubectl edit`), the rest kept.
async fn store(api: &ApiServer, keys: &[(&str, &str)]) {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, Patch, PatchParams};
    let data: serde_json::Map<String, Value> = keys
        .iter()
        .map(|(k, v)| {
            use base64::Engine;
            (
                k.to_string(),
                json!(base64::engine::general_purpose::STANDARD.encode(v)),
            )
        })
        .collect();
    Api::<Secret>::namespaced(api.test_client(), NS)
        .patch(
            SECRET,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "data": data })),
        )
        .await
        .expect("store");
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
        certs::ensure(&c1, &s, None),
        certs::ensure(&c2, &s, None),
        certs::ensure(&c3, &s, None)
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
    let again = certs::ensure(&c1, &s, None).await.expect("again");
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
    let first = certs::ensure(&client, &s, None).await.expect("first");
    // A serving certificate of the same CA with ten days left (thirty is when it is
    // renewed); the annotations, which are for people, still say a year.
    let stored = secret(&api);
    let ca = (first.ca_pem.clone(), data(&stored, "ca.key"));
    let names = CertSettings::service_names("guard-ichor-rules", NS);
    let (cert, key) = issue(&ca, &names, days(-1), days(10));
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(api.test_client(), NS);
    store(&api, &[("tls.crt", &cert), ("tls.key", &key)]).await;
    let rotated = certs::ensure(&client, &s, None).await.expect("rotated");
    assert_ne!(rotated.cert_pem, cert, "a new serving certificate");
    assert_ne!(rotated.cert_pem, first.cert_pem);
    assert_ne!(rotated.key_pem, key, "and key");
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
    let other = certs::ensure(&client, &renamed, None)
        .await
        .expect("renamed");
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
    let refilled = certs::ensure(&client, &s, None).await.expect("refilled");
    handshake(
        &refilled.cert_pem,
        &refilled.key_pem,
        &refilled.ca_pem,
        "guard-ichor-rules.ichor-system.svc",
    )
    .expect("a working pair again");
}

/// A CA near its own end is replaced with the serving pair; the old CA stays in the bundle
/// beside the new one for the overlap, then leaves it.
#[tokio::test]
async fn a_ca_near_its_end_is_replaced_and_published_beside_the_old_for_the_overlap() {
    let api = ApiServer::start().await;
    let s = settings();
    let client = api.client();
    let names = CertSettings::service_names("guard-ichor-rules", NS);
    let old = new_ca("an old CA", days(-3000), days(10));
    let pair = issue(&old, &names, days(-1), days(9));
    api.insert(tls_secret(&[
        ("ca.crt", &old.0),
        ("ca.key", &old.1),
        ("tls.crt", &pair.0),
        ("tls.key", &pair.1),
    ]));
    let rotated = certs::ensure(&client, &s, None).await.expect("rotated");
    assert_ne!(ders(&rotated.ca_pem), ders(&old.0), "a new CA");
    let mut both = ders(&rotated.ca_pem);
    both.extend(ders(&old.0));
    assert_eq!(ders(&rotated.bundle_pem), both, "new and old CA published");
    handshake(
        &rotated.cert_pem,
        &rotated.key_pem,
        &rotated.ca_pem,
        "guard-ichor-rules.ichor-system.svc",
    )
    .expect("the new pair under the new CA");
    let notes = secret_events(&api, "CertificateRotated");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("the CA ends within the renewal margin")),
        "{notes:?}"
    );
    // Past the overlap: the new CA alone, and nothing is written again.
    let version = secret(&api)["metadata"]["resourceVersion"].clone();
    tokio::time::sleep(s.overlap + Duration::from_millis(200)).await;
    let later = certs::ensure(&client, &s, None).await.expect("later");
    assert_eq!(ders(&later.bundle_pem), ders(&rotated.ca_pem));
    assert_eq!(later.cert_pem, rotated.cert_pem);
    assert_eq!(secret(&api)["metadata"]["resourceVersion"], version);
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

// ---------------------------------------------------------------------------------------
// Issue 33, item 4: what the Secret holds is checked before it is served or published,
// repaired when wrong, and a change of CA never leaves a replica unverifiable.

/// `serve --tls-secret` (one webhook replica), its stderr in `log`.
fn replica(api: &ApiServer, listen: std::net::SocketAddr, log: &std::path::Path) -> https::Killed {
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
            .args(["--reload-interval-ms", "100", "--identity", "replica"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(log).expect("log file")))
            .spawn()
            .expect("serve starts"),
    )
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("certs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The caBundle every webhook of the configuration holds (the same in each), if set.
fn bundle(api: &ApiServer) -> Option<String> {
    let vwc = api.objects("ValidatingWebhookConfiguration", None);
    let hooks = vwc[0]["webhooks"].as_array().expect("webhooks").clone();
    let all: Vec<Option<String>> = hooks
        .iter()
        .map(|h| {
            h["clientConfig"]["caBundle"]
                .as_str()
                .map(|b| String::from_utf8(b64decode(b)).expect("pem"))
        })
        .collect();
    assert!(all.windows(2).all(|w| w[0] == w[1]), "one bundle: {all:?}");
    all[0].clone()
}

/// The DER of each certificate of PEM text.
fn ders(pem: &str) -> Vec<Vec<u8>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.expect("a certificate").to_vec())
        .collect()
}

/// What the replica at `listen` serves, if it verifies under `bundle` for the Service's
/// name (the API server's handshake); the served certificate's DER.
async fn served(listen: std::net::SocketAddr, bundle: &str) -> Result<Vec<u8>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let tcp = tokio::net::TcpStream::connect(listen)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("guard-ichor-rules.ichor-system.svc").expect("name");
    let s = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let leaf = s
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no certificate")?;
    Ok(leaf.to_vec())
}

/// Waits until the replica at `listen` serves a certificate the published bundle verifies;
/// (bundle, served DER).
async fn verified(
    api: &ApiServer,
    listen: std::net::SocketAddr,
    child: &mut https::Killed,
    log: &std::path::Path,
) -> (String, Vec<u8>) {
    let mut last = String::new();
    for _ in 0..200 {
        assert!(
            matches!(child.0.try_wait(), Ok(None)),
            "serve exited: {:?}\n{}",
            child.0.try_wait(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        if let Some(b) = bundle(api) {
            match served(listen, &b).await {
                Ok(der) => return (b, der),
                Err(e) => last = e,
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{listen} never served what the bundle verifies: {last}\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// The notes of the Events of `reason` about the Secret.
fn secret_events(api: &ApiServer, reason: &str) -> Vec<String> {
    api.objects("Event", Some(NS))
        .into_iter()
        .filter(|e| e["reason"] == reason && e["regarding"]["name"] == SECRET)
        .map(|e| {
            assert_eq!(e["regarding"]["kind"], "Secret", "{e}");
            e["note"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

fn tls_secret(data: &[(&str, &str)]) -> Value {
    use base64::Engine;
    let far = "2099-01-01T00:00:00Z";
    let names = CertSettings::service_names("guard-ichor-rules", NS).join(",");
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                json!(base64::engine::general_purpose::STANDARD.encode(v)),
            )
        })
        .collect();
    // Annotations that say all is well: they are for people, and not believed.
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NS, "annotations": {
            certs::NOT_AFTER: far, certs::CA_NOT_AFTER: far, certs::DNS_NAMES: names,
        }},
        "type": "kubernetes.io/tls",
        "data": data
    })
}

/// `serve` finds its Secret holding a bundle that cannot work, in each way (behind
/// annotations that say all is well), and starts anyway: it repairs the Secret (a new
/// serving pair under the CA when the CA is sound, else a new CA too), says why in an
/// Event about the Secret, and serves and publishes only what verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_repairs_a_bundle_that_cannot_verify_before_serving_or_publishing_it() {
    let names = CertSettings::service_names("guard-ichor-rules", NS);
    let a = new_ca("a person's CA", days(-10), days(3000));
    let b = new_ca("another CA", days(-10), days(3000));
    let good = issue(&a, &names, days(-1), days(300));
    let by_b = issue(&b, &names, days(-1), days(300));
    let other_key = issue(&a, &names, days(-1), days(300)).1;
    let expired = issue(&a, &names, days(-20), days(-2));
    let elsewhere = issue(
        &a,
        &CertSettings::service_names("other", NS),
        days(-1),
        days(300),
    );
    let old_ca = new_ca("an expired CA", days(-400), days(-1));
    let under_old = issue(&old_ca, &names, days(-2), days(-1));
    // (what is wrong, the Secret, why it is repaired, whether the CA is kept)
    let cases: Vec<(&str, Value, &str, bool)> = vec![
        (
            "another CA signed the certificate",
            tls_secret(&[
                ("ca.crt", &a.0),
                ("ca.key", &a.1),
                ("tls.crt", &by_b.0),
                ("tls.key", &by_b.1),
            ]),
            "tls.crt was not signed by ca.crt",
            true,
        ),
        (
            "the key is not the certificate's",
            tls_secret(&[
                ("ca.crt", &a.0),
                ("ca.key", &a.1),
                ("tls.crt", &good.0),
                ("tls.key", &other_key),
            ]),
            "tls.key does not belong to tls.crt",
            true,
        ),
        (
            "the certificate expired",
            tls_secret(&[
                ("ca.crt", &a.0),
                ("ca.key", &a.1),
                ("tls.crt", &expired.0),
                ("tls.key", &expired.1),
            ]),
            "tls.crt has expired",
            true,
        ),
        (
            "the certificate names other Service names",
            tls_secret(&[
                ("ca.crt", &a.0),
                ("ca.key", &a.1),
                ("tls.crt", &elsewhere.0),
                ("tls.key", &elsewhere.1),
            ]),
            "tls.crt does not name guard-ichor-rules",
            true,
        ),
        (
            "the CA key is not the CA's",
            tls_secret(&[
                ("ca.crt", &a.0),
                ("ca.key", &b.1),
                ("tls.crt", &good.0),
                ("tls.key", &good.1),
            ]),
            "ca.key does not belong to ca.crt",
            false,
        ),
        (
            "the CA expired",
            tls_secret(&[
                ("ca.crt", &old_ca.0),
                ("ca.key", &old_ca.1),
                ("tls.crt", &under_old.0),
                ("tls.key", &under_old.1),
            ]),
            "ca.crt has expired",
            false,
        ),
    ];
    let dir = scratch("repair");
    for (n, (what, stored, why, kept)) in cases.into_iter().enumerate() {
        let api = ApiServer::start().await;
        api.insert(webhook_configuration());
        let stored_ca =
            String::from_utf8(b64decode(stored["data"]["ca.crt"].as_str().expect("ca")))
                .expect("pem");
        let stored_crt = ders(
            &String::from_utf8(b64decode(stored["data"]["tls.crt"].as_str().expect("crt")))
                .expect("pem"),
        );
        api.insert(stored);
        let log = dir.join(format!("{n}.log"));
        let listen = https::free_address();
        let mut child = replica(&api, listen, &log);
        let (published, leaf) = verified(&api, listen, &mut child, &log).await;
        assert_ne!(
            Some(&leaf),
            stored_crt.first(),
            "{what}: not the stored certificate"
        );
        let now = secret(&api);
        let ca_now = data(&now, "ca.crt");
        if kept {
            assert_eq!(ders(&ca_now), ders(&stored_ca), "{what}: the CA is kept");
            assert_eq!(
                ders(&published),
                ders(&stored_ca),
                "{what}: the bundle is that CA"
            );
        } else {
            assert_ne!(ders(&ca_now), ders(&stored_ca), "{what}: a new CA");
            // The CA trusted until now is published beside the new one for a while.
            let mut both = ders(&ca_now);
            both.extend(ders(&stored_ca));
            assert_eq!(ders(&published), both, "{what}: new and old CA published");
        }
        let notes = secret_events(&api, "CertificateRepaired");
        assert!(
            notes.iter().any(|n| n.contains(why)),
            "{what}: an Event says {why:?}: {notes:?}"
        );
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(text.contains(why), "{what}: the log says why:\n{text}");
        assert!(!text.contains("panicked"), "{text}");
        drop(child);
    }
}

/// Two replicas serve; a person replaces the Secret with a new CA and a pair that cannot
/// be loaded. A replica repairs it (a new pair under the new CA) and records the CA they
/// served until then; the caBundle holds both CAs until both replicas serve the new pair,
/// then the new one only. Sampled all along, each replica serves what the published bundle
/// verifies; and a replica started afterwards starts and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_ca_is_published_beside_the_old_until_every_replica_serves_the_new_pair() {
    let api = ApiServer::start().await;
    api.insert(webhook_configuration());
    let dir = scratch("rotation");
    let (l1, l2) = (https::free_address(), https::free_address());
    let (log1, log2) = (dir.join("1.log"), dir.join("2.log"));
    let mut r1 = replica(&api, l1, &log1);
    let mut r2 = replica(&api, l2, &log2);
    let (first, _) = verified(&api, l1, &mut r1, &log1).await;
    verified(&api, l2, &mut r2, &log2).await;
    let old = ders(&first);
    assert_eq!(old.len(), 1, "one CA published");
    let new = new_ca("a person's new CA", days(-1), days(3000));
    store(
        &api,
        &[
            ("ca.crt", &new.0),
            ("ca.key", &new.1),
            ("tls.crt", "not a certificate"),
        ],
    )
    .await;
    let new_der = ders(&new.0);

    let (mut saw_both, mut done) = (false, false);
    let started = std::time::Instant::now();
    while !done {
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "the rotation did not finish (bundle held both: {saw_both})\n{}\n{}",
            std::fs::read_to_string(&log1).unwrap_or_default(),
            std::fs::read_to_string(&log2).unwrap_or_default()
        );
        let before = bundle(&api).expect("a bundle");
        let mut leaves = Vec::new();
        for (listen, log) in [(l1, &log1), (l2, &log2)] {
            let leaf = match served(listen, &before).await {
                Ok(leaf) => leaf,
                // The bundle may have changed between reading it and the handshake.
                Err(e) => {
                    let after = bundle(&api).expect("a bundle");
                    served(listen, &after).await.unwrap_or_else(|e2| {
                        panic!(
                            "{listen} serves what the published bundle does not verify: {e} / {e2}\n{}",
                            std::fs::read_to_string(log).unwrap_or_default()
                        )
                    })
                }
            };
            leaves.push(leaf);
        }
        let published = ders(&before);
        if published.contains(&old[0]) && published.contains(&new_der[0]) {
            saw_both = true;
        }
        // Done: the new CA alone, and both replicas verify under it.
        if published == new_der {
            assert!(
                saw_both,
                "the old CA left the bundle before the new one came"
            );
            for listen in [l1, l2] {
                served(listen, &before)
                    .await
                    .expect("the new pair, under the new CA");
            }
            done = true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stored = secret(&api);
    assert_eq!(
        ders(&data(&stored, "ca.crt")),
        new_der,
        "the person's CA is kept"
    );
    assert_eq!(
        ders(&data(&stored, certs::PREVIOUS_CA)),
        old,
        "the CA served before"
    );
    let notes = secret_events(&api, "CertificateRepaired");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("tls.crt holds no certificate")),
        "{notes:?}"
    );
    // A replica starting now starts (it used to exit 2 on a pair it could not load).
    let (l3, log3) = (https::free_address(), dir.join("3.log"));
    let mut r3 = replica(&api, l3, &log3);
    let (b, _) = verified(&api, l3, &mut r3, &log3).await;
    assert_eq!(ders(&b), new_der);
}
