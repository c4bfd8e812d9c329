//! The webhook's own certificates (`serve --tls-secret NAME`), as Gatekeeper's and Kyverno's
//! cert controllers keep theirs: a CA and a serving certificate for the Service's names,
//! stored in one Secret in the operator's namespace, created, rotated before expiry or
//! repaired by whichever replica gets there first, and the CA written into the `caBundle`
//! of every webhook of the ValidatingWebhookConfiguration. Nothing random is left to `helm
//! template`, so every render is the same.
//!
//! What the Secret holds is checked, never trusted by its annotations (which are written
//! for people only): the CA must parse, its key belong to it and be able to sign, and it
//! must be valid now and for longer than `renew_before`; the serving certificate must be
//! signed by that CA, valid now, carry every Service name and be a server certificate, and
//! its key must belong to it. A pair near its end is rotated under the same CA (the
//! `caBundle` stays valid); anything else wrong is repaired the same way: a new serving
//! pair under the CA when the CA is sound, else a new CA too. Each write says why, in the
//! log and in an Event about the Secret.
//!
//! The replicas agree through the API server: a create of the Secret that finds it already
//! there (409 AlreadyExists), or a replace that finds it changed (409 Conflict, the
//! resourceVersion precondition), means another replica wrote first, and its pair is read
//! back and checked like any other.
//!
//! When the CA changes (its own end, a repair, or someone replacing the Secret), the CA the
//! replicas served under until then is kept in the Secret (`ca-previous.crt`, with the time
//! of the change) and published in the `caBundle` beside the new one for
//! [`CertSettings::overlap`]: long enough for every replica, which reads the Secret again
//! every few seconds, to serve the new pair. A replica publishes a bundle that trusts a
//! pair before it serves that pair, so at no moment does a replica serve a certificate the
//! published bundle cannot verify.

use crate::runtime::secrets::{self, Contents, RawSecret, SecretError};
use crate::runtime::tls::pem_problem;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::sync::Arc;
use std::time::Duration;

/// When the serving certificate in the Secret stops being valid (RFC 3339; for people).
pub const NOT_AFTER: &str = "ichor.maesh.dev/not-after";
/// When the CA in the Secret stops being valid (RFC 3339; for people).
pub const CA_NOT_AFTER: &str = "ichor.maesh.dev/ca-not-after";
/// The Service names the serving certificate carries (comma-separated; for people).
pub const DNS_NAMES: &str = "ichor.maesh.dev/dns-names";
/// When the CA last changed (RFC 3339): `ca-previous.crt` is trusted until then plus
/// [`CertSettings::overlap`].
pub const CA_ROTATED_AT: &str = "ichor.maesh.dev/ca-rotated-at";
/// The key of the CA served under before the last change of CA.
pub const PREVIOUS_CA: &str = "ca-previous.crt";
/// The CA's subject.
const CA_NAME: &str = "ichor-rules webhook CA";
/// The Events' reporting controller.
const REPORTER: &str = "ichor-rules-webhook";

/// Which certificates, where.
#[derive(Clone, Debug)]
pub struct CertSettings {
    /// The operator's namespace (the Secret's).
    pub namespace: String,
    /// The Secret holding `ca.crt`, `ca.key`, `tls.crt`, `tls.key` (and, after a change of
    /// CA, `ca-previous.crt`).
    pub secret: String,
    /// The ValidatingWebhookConfiguration whose `caBundle`s are set; `None`: none is.
    pub webhook_configuration: Option<String>,
    /// The names the API server dials (`<service>.<namespace>.svc` and the like).
    pub dns_names: Vec<String>,
    /// Lifetime of a serving certificate.
    pub validity: Duration,
    /// Lifetime of the CA.
    pub ca_validity: Duration,
    /// A serving certificate (or CA) this close to its end is replaced.
    pub renew_before: Duration,
    /// How long the previous CA stays in the `caBundle` after a change of CA.
    pub overlap: Duration,
    /// This replica, as the Events it emits name it.
    pub identity: String,
}

impl CertSettings {
    /// The names of Service `service` in `namespace`, as the API server and cluster DNS know
    /// them.
    pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
        vec![
            service.to_string(),
            format!("{service}.{namespace}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ]
    }
}

/// The pair to serve, the CA that signed it, and the CAs to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The CA that signed `cert_pem` (PEM, as stored).
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// What the `caBundle` must hold now: `ca_pem`, and the previous CA while the change
    /// of CA is recent.
    pub bundle_pem: String,
    /// The Secret's resourceVersion it was read from or written as.
    pub version: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("Secret {namespace}/{name}: {source}")]
    Secret {
        namespace: String,
        name: String,
        #[source]
        source: SecretError,
    },
    #[error("ValidatingWebhookConfiguration {name}: {source}")]
    Webhook {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "ValidatingWebhookConfiguration {0} does not exist (install the chart, which creates it)"
    )]
    NoWebhook(String),
    #[error("making a certificate: {0}")]
    Generate(String),
    #[error("Secret {0} kept changing under us; retrying")]
    Contended(String),
}

fn gen_err(e: impl std::fmt::Display) -> CertError {
    CertError::Generate(e.to_string())
}

/// The calendar day (UTC) of `t`, and its midnight: certificates here start and end at a
/// day's midnight.
fn day(t: Timestamp) -> Result<((i32, u8, u8), Timestamp), CertError> {
    let d = t.to_zoned(TimeZone::UTC).date();
    let midnight = d.to_zoned(TimeZone::UTC).map_err(gen_err)?.timestamp();
    let month = u8::try_from(d.month()).map_err(gen_err)?;
    let dom = u8::try_from(d.day()).map_err(gen_err)?;
    Ok(((i32::from(d.year()), month, dom), midnight))
}

fn ca_params(not_before: Timestamp, not_after: Timestamp) -> Result<CertificateParams, CertError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ((y, m, d), _) = day(not_before)?;
    p.not_before = rcgen::date_time_ymd(y, m, d);
    let ((y, m, d), _) = day(not_after)?;
    p.not_after = rcgen::date_time_ymd(y, m, d);
    Ok(p)
}

fn later(now: Timestamp, d: Duration) -> Result<Timestamp, CertError> {
    let d = SignedDuration::try_from(d).map_err(gen_err)?;
    now.checked_add(d).map_err(gen_err)
}

/// A day before `now`: a certificate is valid from then (clocks differ a little).
fn earlier(now: Timestamp) -> Result<Timestamp, CertError> {
    now.checked_sub(SignedDuration::from_hours(24))
        .map_err(gen_err)
}

/// A new CA: (certificate PEM, key PEM).
fn new_ca(s: &CertSettings, now: Timestamp) -> Result<(String, String), CertError> {
    let key = KeyPair::generate().map_err(gen_err)?;
    let (_, not_after) = day(later(now, s.ca_validity)?)?;
    let cert = ca_params(earlier(now)?, not_after)?
        .self_signed(&key)
        .map_err(gen_err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A serving certificate for `s.dns_names` signed by `ca` (named as the CA names itself),
/// ending no later than the CA: (certificate PEM, key PEM).
fn new_serving(s: &CertSettings, ca: &Ca, now: Timestamp) -> Result<(String, String), CertError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(gen_err)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(gen_err)?;
    let key = KeyPair::generate().map_err(gen_err)?;
    let mut p = CertificateParams::new(s.dns_names.clone()).map_err(gen_err)?;
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let ((y, m, d), _) = day(earlier(now)?)?;
    p.not_before = rcgen::date_time_ymd(y, m, d);
    let end = later(now, s.validity)?.min(ca.not_after);
    let ((y, m, d), _) = day(end)?;
    p.not_after = rcgen::date_time_ymd(y, m, d);
    let cert = p.signed_by(&key, &issuer).map_err(gen_err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

// ---------------------------------------------------------------------------------------
// What the Secret holds, checked. Every reason is in words of ours: a Secret's content is
// never quoted (see `runtime::secrets`).

/// A CA that can sign: its certificate (the first PEM block of `ca.crt`), key, and end.
#[derive(Clone, Debug)]
struct Ca {
    cert_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
    not_after: Timestamp,
}

/// Why the Secret must be written: a routine rotation, or a repair.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Why {
    repair: bool,
    text: String,
}

fn repair(text: impl Into<String>) -> Why {
    Why {
        repair: true,
        text: text.into(),
    }
}

fn rotate(text: impl Into<String>) -> Why {
    Why {
        repair: false,
        text: text.into(),
    }
}

/// The text of `key`, or why it is not usable.
fn text_of(secret: &RawSecret, key: &str) -> Result<String, Why> {
    match secret.value(key) {
        Ok(Some(bytes)) if !bytes.is_empty() => {
            String::from_utf8(bytes).map_err(|_| repair(format!("{key} is not text")))
        }
        Ok(_) => Err(repair(format!("{key} is missing"))),
        Err(e) => Err(repair(format!("{key} {e}"))),
    }
}

/// The certificates of PEM text (at least one), or why not.
fn certs_of(key: &str, pem: &str) -> Result<Vec<CertificateDer<'static>>, Why> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| repair(format!("{key} is not PEM: {}", pem_problem(&e))))?;
    if certs.is_empty() {
        return Err(repair(format!("{key} holds no certificate")));
    }
    Ok(certs)
}

/// (not before, not after) of a certificate, or why it cannot be read.
fn validity(key: &str, der: &CertificateDer<'_>) -> Result<(Timestamp, Timestamp), Why> {
    let unreadable = || repair(format!("{key} is not an X.509 certificate"));
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).map_err(|_| unreadable())?;
    let v = cert.validity();
    let t = |a: &x509_parser::time::ASN1Time| Timestamp::from_second(a.timestamp());
    Ok((
        t(&v.not_before).map_err(|_| unreadable())?,
        t(&v.not_after).map_err(|_| unreadable())?,
    ))
}

/// Whether `key_pem` is the private key of `cert`, or why not.
fn key_matches(
    cert: &CertificateDer<'static>,
    key_name: &str,
    key_pem: &str,
    cert_name: &str,
) -> Result<(), Why> {
    let der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| {
        repair(format!(
            "{key_name} is not a PEM private key: {}",
            pem_problem(&e)
        ))
    })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&der).map_err(|_| {
        repair(format!(
            "{key_name} is not a private key of a supported kind"
        ))
    })?;
    rustls::sign::CertifiedKey::new(vec![cert.clone()], signing)
        .keys_match()
        .map_err(|_| repair(format!("{key_name} does not belong to {cert_name}")))
}

/// Whether `end` comes within `margin` of `now` (or is past).
fn ends_within(end: Timestamp, now: Timestamp, margin: Duration) -> bool {
    later(now, margin).map_or(true, |m| end <= m)
}

/// The CA of the Secret, if it can sign: parsed, valid now and beyond `renew_before`, its
/// key its own and usable for signing.
fn read_ca(secret: &RawSecret, s: &CertSettings, now: Timestamp) -> Result<Ca, Why> {
    let cert_pem = text_of(secret, "ca.crt")?;
    let key_pem = text_of(secret, "ca.key")?;
    let der = certs_of("ca.crt", &cert_pem)?.swap_remove(0);
    let (not_before, not_after) = validity("ca.crt", &der)?;
    if not_before > now {
        return Err(repair("ca.crt is not valid yet"));
    }
    if not_after <= now {
        return Err(repair("ca.crt has expired"));
    }
    key_matches(&der, "ca.key", &key_pem, "ca.crt")?;
    // The key signs the next serving certificates, as the CA names itself.
    let signer =
        KeyPair::from_pem(&key_pem).map_err(|_| repair("ca.key cannot sign certificates"))?;
    Issuer::from_ca_cert_pem(&cert_pem, signer)
        .map_err(|_| repair("ca.crt cannot issue certificates"))?;
    if ends_within(not_after, now, s.renew_before) {
        return Err(rotate("the CA ends within the renewal margin"));
    }
    Ok(Ca {
        cert_pem,
        key_pem,
        der,
        not_after,
    })
}

/// The serving pair of the Secret, if `ca` signed it, it is valid now and beyond
/// `renew_before`, names every Service name, and its key is its own.
fn read_serving(
    secret: &RawSecret,
    ca: &Ca,
    s: &CertSettings,
    now: Timestamp,
) -> Result<(String, String), Why> {
    let cert_pem = text_of(secret, "tls.crt")?;
    let key_pem = text_of(secret, "tls.key")?;
    let chain = certs_of("tls.crt", &cert_pem)?;
    let leaf = chain[0].clone();
    key_matches(&leaf, "tls.key", &key_pem, "tls.crt")?;
    let (_, not_after) = validity("tls.crt", &leaf)?;
    // What the API server checks: the chain to the CA, the time, server use, each name.
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(ca.der.clone())
        .map_err(|_| repair("ca.crt is not a usable CA certificate"))?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|_| repair("ca.crt is not a usable CA certificate"))?;
    let at = UnixTime::since_unix_epoch(Duration::from_secs(
        u64::try_from(now.as_second()).unwrap_or(0),
    ));
    for name in &s.dns_names {
        let server = ServerName::try_from(name.clone())
            .map_err(|_| repair(format!("{name} is not a DNS name")))?;
        verifier
            .verify_server_cert(&leaf, &chain[1..], &server, &[], at)
            .map_err(|e| repair(verify_problem(&e, name)))?;
    }
    if ends_within(not_after, now, s.renew_before) {
        return Err(rotate(
            "the serving certificate ends within the renewal margin",
        ));
    }
    Ok((cert_pem, key_pem))
}

/// Why the API server would refuse the serving certificate, in words of ours.
fn verify_problem(e: &rustls::Error, name: &str) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature => "tls.crt was not signed by ca.crt".into(),
            C::Expired | C::ExpiredContext { .. } => "tls.crt has expired".into(),
            C::NotValidYet | C::NotValidYetContext { .. } => "tls.crt is not valid yet".into(),
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                format!("tls.crt does not name {name}")
            }
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => {
                "tls.crt is not a server certificate".into()
            }
            C::BadEncoding => "tls.crt is not an X.509 certificate".into(),
            _ => "the API server would not accept tls.crt under ca.crt".into(),
        },
        _ => "the API server would not accept tls.crt under ca.crt".into(),
    }
}

/// The previous CA, while the last change of CA is recent.
fn previous_in_window(secret: &RawSecret, s: &CertSettings, now: Timestamp) -> Option<String> {
    let at: Timestamp = secret.annotations.get(CA_ROTATED_AT)?.parse().ok()?;
    if later(at, s.overlap).ok()? <= now {
        return None;
    }
    let pem = secret.text(PREVIOUS_CA)?;
    certs_of(PREVIOUS_CA, &pem).ok()?;
    Some(pem)
}

/// The first certificate of PEM text, if there is one.
fn first_der(pem: &str) -> Option<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).next()?.ok()
}

fn with_newline(pem: &str) -> String {
    let t = pem.trim_end();
    format!("{t}\n")
}

/// The Secret's verdict: serve what it holds, or write it anew (and why).
enum Verdict {
    Serve {
        ca: Ca,
        cert_pem: String,
        key_pem: String,
    },
    Write {
        /// The CA to keep (a new serving pair under it); `None`: a new CA too.
        keep: Option<Ca>,
        why: Why,
    },
}

fn verdict(secret: &RawSecret, s: &CertSettings, now: Timestamp) -> Verdict {
    let ca = match read_ca(secret, s, now) {
        Ok(ca) => ca,
        Err(why) => return Verdict::Write { keep: None, why },
    };
    match read_serving(secret, &ca, s, now) {
        Ok((cert_pem, key_pem)) => Verdict::Serve {
            ca,
            cert_pem,
            key_pem,
        },
        Err(why) => Verdict::Write {
            keep: Some(ca),
            why,
        },
    }
}

/// What to write: the Secret's content for a new serving pair under `ca` (a new CA when
/// `None`), and the previous CA (with the time it changed) when there is one to keep.
fn contents(
    s: &CertSettings,
    ca: &Ca,
    pair: (String, String),
    previous: Option<(String, String)>,
) -> Contents {
    let (cert, key) = pair;
    let leaf_end = first_der(&cert)
        .and_then(|d| validity("tls.crt", &d).ok())
        .map(|(_, end)| end.to_string())
        .unwrap_or_default();
    let mut c = Contents {
        type_: "kubernetes.io/tls".into(),
        ..Contents::default()
    };
    for (k, v) in [
        ("ca.crt", with_newline(&ca.cert_pem)),
        ("ca.key", ca.key_pem.clone()),
        ("tls.crt", cert),
        ("tls.key", key),
    ] {
        c.data.insert(k.to_string(), v.into_bytes());
    }
    for (k, v) in [
        (NOT_AFTER, leaf_end),
        (CA_NOT_AFTER, ca.not_after.to_string()),
        (DNS_NAMES, s.dns_names.join(",")),
    ] {
        c.annotations.insert(k.to_string(), v);
    }
    if let Some((pem, at)) = previous {
        c.data
            .insert(PREVIOUS_CA.to_string(), with_newline(&pem).into_bytes());
        c.annotations.insert(CA_ROTATED_AT.to_string(), at);
    }
    c
}

/// A new CA, parsed back.
fn fresh_ca(s: &CertSettings, now: Timestamp) -> Result<Ca, CertError> {
    let (cert_pem, key_pem) = new_ca(s, now)?;
    let der = first_der(&cert_pem).ok_or_else(|| gen_err("the new CA does not parse"))?;
    let (_, not_after) = validity("ca.crt", &der).map_err(|w| CertError::Generate(w.text))?;
    Ok(Ca {
        cert_pem,
        key_pem,
        der,
        not_after,
    })
}

/// Whether `mine` (PEM) is `ca` or `previous`.
fn trusted(mine: &str, ca: &Ca, previous: Option<&str>) -> bool {
    let Some(der) = first_der(mine) else {
        return true; // nothing to keep trusting
    };
    der == ca.der || previous.and_then(first_der).is_some_and(|p| p == der)
}

fn pair_of(
    secret: &RawSecret,
    ca: &Ca,
    cert_pem: String,
    key_pem: String,
    previous: Option<&str>,
) -> Pair {
    let mut bundle_pem = with_newline(&ca.cert_pem);
    if let Some(p) = previous {
        bundle_pem.push_str(&with_newline(p));
    }
    Pair {
        ca_pem: ca.cert_pem.clone(),
        cert_pem,
        key_pem,
        bundle_pem,
        version: secret.resource_version.clone(),
    }
}

/// Says why the Secret was written: in the log, and in an Event about it (best effort).
async fn announce(
    client: &kube::Client,
    s: &CertSettings,
    written: &RawSecret,
    reason: &str,
    note: String,
    warning: bool,
) {
    if warning {
        tracing::warn!(secret = %s.secret, reason, note = %note, "the webhook's certificate Secret");
    } else {
        tracing::info!(secret = %s.secret, reason, note = %note, "the webhook's certificate Secret");
    }
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: REPORTER.into(),
            instance: Some(s.identity.clone()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Secret".into()),
        name: Some(s.secret.clone()),
        namespace: Some(s.namespace.clone()),
        uid: Some(written.uid.clone()).filter(|u| !u.is_empty()),
        ..Default::default()
    };
    let ev = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &reference).await {
        tracing::warn!(error = %e, reason, "publishing an event failed");
    }
}

/// Reads the pair to serve from the Secret, first creating it when missing, rotating it
/// when near its end and repairing it when anything in it is wrong (see the module). Every
/// replica may call this at once: one write wins, and the others check what it wrote.
///
/// `serving_ca` is the CA this replica serves under now (`None` before it serves). When
/// the Secret's CA is another one and the Secret does not keep it as the previous CA (the
/// Secret was replaced), it is recorded there, so that the published bundle keeps trusting
/// this replica's pair until it switches. The Secret is read and written through
/// [`secrets`], so its contents reach no log, not even when it cannot be decoded.
pub async fn ensure(
    client: &kube::Client,
    s: &CertSettings,
    serving_ca: Option<&str>,
) -> Result<Pair, CertError> {
    let err = |source| CertError::Secret {
        namespace: s.namespace.clone(),
        name: s.secret.clone(),
        source,
    };
    let mut known: Option<RawSecret> = None;
    for _ in 0..5 {
        let now = Timestamp::now();
        let current = match known.take() {
            Some(k) => Some(k),
            None => secrets::get(client, &s.namespace, &s.secret)
                .await
                .map_err(err)?,
        };
        let Some(secret) = current else {
            let ca = fresh_ca(s, now)?;
            let pair = new_serving(s, &ca, now)?;
            // A replica already serving (the Secret was deleted) keeps being trusted.
            let previous = serving_ca.map(|p| (p.to_string(), now.to_string()));
            let c = contents(s, &ca, pair, previous);
            match secrets::create(client, &s.namespace, &s.secret, &c).await {
                Ok(written) => {
                    announce(
                        client,
                        s,
                        &written,
                        "CertificateCreated",
                        "a new CA and serving certificate for the webhook".into(),
                        false,
                    )
                    .await;
                    known = Some(written);
                }
                // Another replica wrote first: check what it wrote.
                Err(e) if e.is_conflict() => {}
                Err(e) => return Err(err(e)),
            }
            continue;
        };
        let previous = previous_in_window(&secret, s, now);
        let (ca, pair, previous, why) = match verdict(&secret, s, now) {
            Verdict::Serve {
                ca,
                cert_pem,
                key_pem,
            } => match serving_ca {
                Some(mine) if !trusted(mine, &ca, previous.as_deref()) => {
                    // The Secret was replaced under this replica: keep its CA trusted.
                    let why = rotate(
                        "the Secret's CA changed; the CA served until now stays in the caBundle",
                    );
                    let previous = Some((mine.to_string(), now.to_string()));
                    (ca, (cert_pem, key_pem), previous, why)
                }
                _ => {
                    return Ok(pair_of(
                        &secret,
                        &ca,
                        cert_pem,
                        key_pem,
                        previous.as_deref(),
                    ));
                }
            },
            Verdict::Write {
                keep: Some(ca),
                why,
            } => {
                let pair = new_serving(s, &ca, now)?;
                let rotated_at = secret.annotations.get(CA_ROTATED_AT).cloned();
                let mut previous = previous.zip(rotated_at);
                if let Some(mine) = serving_ca
                    && !trusted(mine, &ca, previous.as_ref().map(|p| p.0.as_str()))
                {
                    previous = Some((mine.to_string(), now.to_string()));
                }
                (ca, pair, previous, why)
            }
            Verdict::Write { keep: None, why } => {
                let ca = fresh_ca(s, now)?;
                let pair = new_serving(s, &ca, now)?;
                // The CA trusted until now: the one this replica serves under, else the
                // Secret's own while it is a certificate at all.
                let previous = serving_ca
                    .map(str::to_string)
                    .or_else(|| secret.text("ca.crt").filter(|p| first_der(p).is_some()))
                    .map(|p| (p, now.to_string()));
                (ca, pair, previous, why)
            }
        };
        let c = contents(s, &ca, pair, previous);
        match secrets::replace(client, &s.namespace, &s.secret, &secret, &c).await {
            Ok(written) => {
                let same_ca = secret
                    .text("ca.crt")
                    .and_then(|p| first_der(&p))
                    .is_some_and(|d| d == ca.der);
                let done = if same_ca {
                    "a new serving certificate under the same CA".to_string()
                } else {
                    format!(
                        "a new CA and serving certificate; the CA trusted until now stays in \
                         the caBundle for {} s",
                        s.overlap.as_secs()
                    )
                };
                let reason = if why.repair {
                    "CertificateRepaired"
                } else {
                    "CertificateRotated"
                };
                announce(
                    client,
                    s,
                    &written,
                    reason,
                    format!("{}: {done}", why.text),
                    why.repair,
                )
                .await;
                known = Some(written);
            }
            // Another replica wrote first: check what it wrote.
            Err(e) if e.is_conflict() => {}
            Err(e) => return Err(err(e)),
        }
    }
    Err(CertError::Contended(s.secret.clone()))
}

/// Sets the `caBundle` of every webhook of the configuration to `ca_pem` (PEM, one or more
/// CAs), if it is not
/// already; `Ok(true)` when it wrote.
pub async fn patch_ca_bundle(
    client: &kube::Client,
    name: &str,
    ca_pem: &str,
) -> Result<bool, CertError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let err = |source| CertError::Webhook {
        name: name.to_string(),
        source,
    };
    for _ in 0..5 {
        let Some(mut vwc) = api.get_opt(name).await.map_err(err)? else {
            return Err(CertError::NoWebhook(name.to_string()));
        };
        let want = ByteString(ca_pem.as_bytes().to_vec());
        let mut changed = false;
        for w in vwc.webhooks.iter_mut().flatten() {
            if w.client_config.ca_bundle.as_ref() != Some(&want) {
                w.client_config.ca_bundle = Some(want.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        match api.replace(name, &PostParams::default(), &vwc).await {
            Ok(_) => {
                tracing::info!(webhook_configuration = %name, "caBundle set to the webhook's CA");
                return Ok(true);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(err(e)),
        }
    }
    Err(CertError::Contended(name.to_string()))
}
