//! The serving certificate, read from files and reloaded when they change on disk, so a
//! cert-manager rotation needs no restart. A broken new pair keeps the old one serving.

use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("{}: no certificate in the file", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: the key is not usable: {message}", path.display())]
    Key { path: PathBuf, message: String },
}

/// What is wrong with PEM text, in words that quote none of it (the parser's own error
/// may carry a line of the text, or a byte of a key).
pub fn pem_problem(e: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { .. } => "a section has no END line",
        Error::IllegalSectionStart { .. } => "a BEGIN line is malformed",
        Error::Base64Decode(_) => "a section's base64 is malformed",
        Error::Io(_) => "it cannot be read",
        Error::NoItemsFound => "it holds no PEM section of the kind wanted",
        Error::SectionTooLarge => "a section is too large",
        _ => "it is not PEM",
    }
}

/// Reads a PEM certificate chain and private key.
pub fn load_pair(cert: &PathBuf, key: &PathBuf) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| TlsError::Read {
            path: cert.clone(),
            message: e.to_string(),
        })?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Read {
            path: cert.clone(),
            message: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: cert.clone() });
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Read {
        path: key.clone(),
        message: e.to_string(),
    })?;
    let signing = any_supported_type(&der).map_err(|e| TlsError::Key {
        path: key.clone(),
        message: e.to_string(),
    })?;
    let pair = CertifiedKey::new(chain, signing);
    // A rotation that has written one file and not yet the other must not serve a
    // certificate its key cannot sign for (every handshake would fail).
    match pair.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(pair)
        }
        Err(e) => Err(TlsError::Key {
            path: key.clone(),
            message: format!(
                "it does not belong to the certificate in {} ({e})",
                cert.display()
            ),
        }),
    }
}

/// A certificate chain and key from PEM text (`what` names where it came from in errors,
/// which quote nothing of the text: it may be a Secret's).
pub fn pair_from_pem(cert: &str, key: &str, what: &str) -> Result<CertifiedKey, TlsError> {
    let path = PathBuf::from(what);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Read {
            path: path.clone(),
            message: format!("the certificate is not PEM: {}", pem_problem(&e)),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path });
    }
    let der = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| TlsError::Read {
        path: path.clone(),
        message: format!("the key is not a PEM private key: {}", pem_problem(&e)),
    })?;
    let signing = any_supported_type(&der).map_err(|_| TlsError::Key {
        path: path.clone(),
        message: "not a private key of a supported kind".into(),
    })?;
    let pair = CertifiedKey::new(chain, signing);
    match pair.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(pair)
        }
        Err(e) => Err(TlsError::Key {
            path,
            message: format!("the key does not belong to the certificate ({e})"),
        }),
    }
}

/// Serves the current certificate; [`ReloadingCert::reload_if_changed`] swaps it.
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    stamp: Mutex<Option<(SystemTime, SystemTime)>>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

fn mtimes(cert: &PathBuf, key: &PathBuf) -> Option<(SystemTime, SystemTime)> {
    let c = std::fs::metadata(cert).and_then(|m| m.modified()).ok()?;
    let k = std::fs::metadata(key).and_then(|m| m.modified()).ok()?;
    Some((c, k))
}

impl ReloadingCert {
    pub fn new(cert: PathBuf, key: PathBuf) -> Result<ReloadingCert, TlsError> {
        let pair = load_pair(&cert, &key)?;
        let stamp = mtimes(&cert, &key);
        Ok(ReloadingCert {
            cert,
            key,
            current: RwLock::new(Arc::new(pair)),
            stamp: Mutex::new(stamp),
        })
    }

    /// Serves a pair held in memory (the operator's own certificates, `serve
    /// --tls-secret`); [`ReloadingCert::replace`] swaps it. It has no files to reload.
    pub fn from_pem(cert: &str, key: &str, what: &str) -> Result<ReloadingCert, TlsError> {
        let pair = pair_from_pem(cert, key, what)?;
        Ok(ReloadingCert {
            cert: PathBuf::new(),
            key: PathBuf::new(),
            current: RwLock::new(Arc::new(pair)),
            stamp: Mutex::new(None),
        })
    }

    /// Serves `cert` and `key` from now on; an unusable pair leaves the old one serving.
    pub fn replace(&self, cert: &str, key: &str, what: &str) -> Result<(), TlsError> {
        let pair = pair_from_pem(cert, key, what)?;
        if let Ok(mut c) = self.current.write() {
            *c = Arc::new(pair);
        }
        Ok(())
    }

    /// Reloads when either file's modification time changed. `Ok(true)` when a new pair
    /// now serves; an error leaves the old pair serving.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        if self.cert.as_os_str().is_empty() {
            return Ok(false);
        }
        let now = mtimes(&self.cert, &self.key);
        let changed = self.stamp.lock().map(|s| *s != now).unwrap_or(true);
        if !changed {
            return Ok(false);
        }
        let result = load_pair(&self.cert, &self.key);
        if let Ok(mut s) = self.stamp.lock() {
            *s = now;
        }
        let pair = result?;
        if let Ok(mut c) = self.current.write() {
            *c = Arc::new(pair);
        }
        Ok(true)
    }

    /// The TLS configuration that serves this certificate.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, rustls::Error> {
        self.server_config_verifying(None)
    }

    /// The TLS configuration that serves this certificate and, with `client_ca`, completes
    /// a handshake only with a client presenting a certificate that CA signed (the API
    /// server's, `serve --client-ca`); any other client is refused in the handshake.
    pub fn server_config_verifying(
        self: &Arc<Self>,
        client_ca: Option<Arc<rustls::RootCertStore>>,
    ) -> Result<rustls::ServerConfig, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(roots) => {
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
                        .build()
                        .map_err(|e| rustls::Error::General(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.clone())
    }
}

/// A TLS configuration serving a certificate made up for this process (a fresh key,
/// self-signed, for the names `localhost` and `name`): for a port whose clients do not
/// verify the server's name against a CA of ours (a controller's metrics, scraped with
/// its bearer token as what authenticates).
pub fn self_signed_config(name: &str) -> Result<rustls::ServerConfig, String> {
    let mut names = vec!["localhost".to_string()];
    if !name.is_empty() && name != "localhost" {
        names.push(name.to_string());
    }
    let made = rcgen::generate_simple_self_signed(names).map_err(|e| e.to_string())?;
    let cert = CertificateDer::from(made.cert.der().to_vec());
    let key =
        PrivateKeyDer::try_from(made.signing_key.serialize_der()).map_err(|e| e.to_string())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The CA certificates of a PEM file (`serve --client-ca`): the client certificates they
/// sign are the ones the webhook accepts.
pub fn load_client_ca(path: &PathBuf) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError::Read {
            path: path.clone(),
            message: e.to_string(),
        })?
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Read {
            path: path.clone(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.clone() });
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|e| TlsError::Key {
            path: path.clone(),
            message: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(Arc::new(roots))
}
