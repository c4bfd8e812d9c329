//! The webhook's own certificates (`serve --tls-secret NAME`), as Gatekeeper's and Kyverno's
//! cert controllers keep theirs: a CA and a serving certificate for the Service's names,
//! stored in one Secret in the operator's namespace, created or rotated before expiry by
//! whichever replica gets there first, and the CA written into the `caBundle` of every
//! webhook of the ValidatingWebhookConfiguration. Nothing random is left to `helm template`,
//! so every render is the same.
//!
//! The replicas agree through the API server: a create of the Secret that finds it already
//! there (409 AlreadyExists), or a replace that finds it changed (409 Conflict, the
//! resourceVersion precondition), means another replica wrote first, and its pair is read
//! back and used. A rotation keeps the CA (and its key), so the `caBundle` stays valid
//! while the replicas pick the new serving pair up; only a CA near its own expiry is
//! replaced, with the bundle.

use crate::runtime::secrets::{self, Contents, RawSecret, SecretError};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::time::Duration;

/// When the serving certificate in the Secret stops being valid (RFC 3339).
pub const NOT_AFTER: &str = "ichor.maesh.dev/not-after";
/// When the CA in the Secret stops being valid (RFC 3339).
pub const CA_NOT_AFTER: &str = "ichor.maesh.dev/ca-not-after";
/// The Service names the serving certificate carries (comma-separated).
pub const DNS_NAMES: &str = "ichor.maesh.dev/dns-names";
/// The CA's subject.
const CA_NAME: &str = "ichor-rules webhook CA";

/// Which certificates, where.
#[derive(Clone, Debug)]
pub struct CertSettings {
    /// The operator's namespace (the Secret's).
    pub namespace: String,
    /// The Secret holding `ca.crt`, `ca.key`, `tls.crt`, `tls.key`.
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

/// The pair to serve, and the CA that signed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
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

fn later(d: Duration) -> Result<Timestamp, CertError> {
    let d = SignedDuration::try_from(d).map_err(gen_err)?;
    Timestamp::now().checked_add(d).map_err(gen_err)
}

/// A new CA: (certificate PEM, key PEM, not-after).
fn new_ca(s: &CertSettings) -> Result<(String, String, Timestamp), CertError> {
    let key = KeyPair::generate().map_err(gen_err)?;
    let (_, not_after) = day(later(s.ca_validity)?)?;
    let cert = ca_params(earlier()?, not_after)?
        .self_signed(&key)
        .map_err(gen_err)?;
    Ok((cert.pem(), key.serialize_pem(), not_after))
}

/// A day ago: a certificate is valid from then (clocks differ a little).
fn earlier() -> Result<Timestamp, CertError> {
    Timestamp::now()
        .checked_sub(SignedDuration::from_hours(24))
        .map_err(gen_err)
}

/// A serving certificate for `s.dns_names` signed by the CA of `ca_key_pem`: (certificate
/// PEM, key PEM, not-after).
fn new_serving(
    s: &CertSettings,
    ca_key_pem: &str,
) -> Result<(String, String, Timestamp), CertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(gen_err)?;
    // The issuer is named as the CA names itself; its key signs.
    let issuer = Issuer::new(ca_params(earlier()?, later(s.ca_validity)?)?, ca_key);
    let key = KeyPair::generate().map_err(gen_err)?;
    let mut p = CertificateParams::new(s.dns_names.clone()).map_err(gen_err)?;
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let ((y, m, d), _) = day(earlier()?)?;
    p.not_before = rcgen::date_time_ymd(y, m, d);
    let ((y, m, d), not_after) = day(later(s.validity)?)?;
    p.not_after = rcgen::date_time_ymd(y, m, d);
    let cert = p.signed_by(&key, &issuer).map_err(gen_err)?;
    Ok((cert.pem(), key.serialize_pem(), not_after))
}

fn field(secret: &RawSecret, key: &str) -> Option<String> {
    secret.text(key)
}

fn annotation<'a>(secret: &'a RawSecret, key: &str) -> Option<&'a str> {
    secret.annotations.get(key).map(String::as_str)
}

/// Whether the time in annotation `key` is more than `margin` away (false when unreadable).
fn lasts(secret: &RawSecret, key: &str, margin: Duration) -> bool {
    let Some(t) = annotation(secret, key).and_then(|a| a.parse::<Timestamp>().ok()) else {
        return false;
    };
    later(margin).is_ok_and(|m| t > m)
}

/// What the Secret holds, if it is a complete pair for these names that lasts.
fn usable(secret: &RawSecret, s: &CertSettings) -> Option<Pair> {
    let names = s.dns_names.join(",");
    if annotation(secret, DNS_NAMES) != Some(names.as_str())
        || !lasts(secret, NOT_AFTER, s.renew_before)
        || !lasts(secret, CA_NOT_AFTER, s.renew_before)
    {
        return None;
    }
    Some(Pair {
        ca_pem: field(secret, "ca.crt")?,
        cert_pem: field(secret, "tls.crt")?,
        key_pem: field(secret, "tls.key")?,
        version: secret.resource_version.clone(),
    })
}

/// The Secret's content for a new serving pair (and a new CA unless `ca` is kept).
fn fill(s: &CertSettings, ca: Option<(String, String, String)>) -> Result<Contents, CertError> {
    let (ca_pem, ca_key, ca_not_after) = match ca {
        Some(kept) => kept,
        None => {
            let (c, k, t) = new_ca(s)?;
            (c, k, t.to_string())
        }
    };
    let (cert, key, not_after) = new_serving(s, &ca_key)?;
    let mut contents = Contents {
        type_: "kubernetes.io/tls".into(),
        ..Contents::default()
    };
    for (k, v) in [
        ("ca.crt", ca_pem),
        ("ca.key", ca_key),
        ("tls.crt", cert),
        ("tls.key", key),
    ] {
        contents.data.insert(k.to_string(), v.into_bytes());
    }
    for (k, v) in [
        (NOT_AFTER, not_after.to_string()),
        (CA_NOT_AFTER, ca_not_after),
        (DNS_NAMES, s.dns_names.join(",")),
    ] {
        contents.annotations.insert(k.to_string(), v);
    }
    Ok(contents)
}

/// Reads the pair from the Secret, creating or rotating it first when it is missing,
/// incomplete, for other names, or near its end. Every replica may call this at once: one
/// write wins, and the others read it back. The Secret is read and written through
/// [`secrets`], so its contents reach no log, not even when it cannot be decoded.
pub async fn ensure(client: &kube::Client, s: &CertSettings) -> Result<Pair, CertError> {
    let err = |source| CertError::Secret {
        namespace: s.namespace.clone(),
        name: s.secret.clone(),
        source,
    };
    for _ in 0..5 {
        let existing = secrets::get(client, &s.namespace, &s.secret)
            .await
            .map_err(err)?;
        let written = match existing {
            Some(secret) => {
                if let Some(pair) = usable(&secret, s) {
                    return Ok(pair);
                }
                // Rotate; keep the CA while it lasts (the caBundle stays valid).
                let keep_ca = lasts(&secret, CA_NOT_AFTER, s.renew_before)
                    .then(|| {
                        Some((
                            field(&secret, "ca.crt")?,
                            field(&secret, "ca.key")?,
                            annotation(&secret, CA_NOT_AFTER)?.to_string(),
                        ))
                    })
                    .flatten();
                let next = fill(s, keep_ca)?;
                tracing::info!(secret = %s.secret, "rotating the webhook's serving certificate");
                secrets::replace(client, &s.namespace, &s.secret, &secret, &next).await
            }
            None => {
                let secret = fill(s, None)?;
                tracing::info!(secret = %s.secret, "creating the webhook's CA and serving certificate");
                secrets::create(client, &s.namespace, &s.secret, &secret).await
            }
        };
        match written {
            Ok(secret) => {
                if let Some(pair) = usable(&secret, s) {
                    return Ok(pair);
                }
            }
            // Another replica wrote first: read what it wrote.
            Err(e) if e.is_conflict() => {}
            Err(e) => return Err(err(e)),
        }
    }
    Err(CertError::Contended(s.secret.clone()))
}

/// Sets the `caBundle` of every webhook of the configuration to `ca_pem`, if it is not
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
