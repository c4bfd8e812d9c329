//! The world a backup's snapshot runs in (`exec::backup`): the controller's world
//! ([`Live`]: the API server, Talos with the cluster's credentials), the backup's own
//! status writes and events, and its S3 store, whose access keys are read live from the
//! backup's Secret at each reconcile and never logged, put in an event or in a status.

use super::world::Live;
use super::{Context, ReconcileError};
use crate::runtime::exec::backup::{BackupWorld, Failure, Stored};
use crate::runtime::exec::{Note, World};
use crate::runtime::objects::{SnapshotRecord, TalosEtcdBackup, TalosMachine};
use crate::runtime::secrets;
use crate::runtime::snapshot::StreamError;
use crate::runtime::store::{Keys, PutError, Store, StoreError};
use crate::runtime::talos::TalosError;
use std::time::Duration;

/// The controller's world of one reconcile of a backup.
pub struct BackupLive<'c> {
    live: Live<'c>,
    ctx: &'c Context,
    /// What this reconcile last wrote of the backup (each write compares with it).
    written: Option<TalosEtcdBackup>,
    /// The store, opened once per reconcile (its keys read live).
    store: Option<Store>,
}

impl<'c> BackupLive<'c> {
    pub fn new(ctx: &'c Context, namespace: &str) -> BackupLive<'c> {
        BackupLive {
            live: Live::new(ctx, namespace, None),
            ctx,
            written: None,
            store: None,
        }
    }

    /// The backup's store, its access keys read from its Secret now.
    async fn store(&mut self, b: &TalosEtcdBackup) -> Result<&Store, Failure> {
        if self.store.is_none() {
            let keys = store_keys(self.ctx, b).await?;
            let timeout = self.ctx.settings.talos_timeout.max(Duration::from_secs(5));
            let store = Store::new(&b.spec.store, &keys, timeout).map_err(store_failure)?;
            self.store = Some(store);
        }
        // (set just above)
        #[allow(clippy::expect_used)]
        Ok(self.store.as_ref().expect("opened above"))
    }
}

/// A store error as a condition's reason and message (the error never quotes a key).
pub fn store_failure(e: StoreError) -> Failure {
    Failure {
        reason: e.reason().into(),
        message: e.to_string(),
    }
}

/// Reads the backup's access keys from the Secret `spec.store.credentialsSecretRef`
/// names, saying exactly what is missing (never what is there).
pub async fn store_keys(ctx: &Context, b: &TalosEtcdBackup) -> Result<Keys, Failure> {
    let r = &b.spec.store.credentials_secret_ref;
    let (ns, name) = (b.namespace(), r.name.as_str());
    let no = |message: String| Failure {
        reason: "StoreKeysMissing".into(),
        message,
    };
    let read = tokio::time::timeout(
        ctx.settings.read_timeout,
        secrets::get(&ctx.client, ns, name),
    )
    .await;
    let secret = match read {
        Ok(Ok(Some(s))) => s,
        Ok(Ok(None)) => {
            return Err(no(format!(
                "the Secret {ns}/{name} named by spec.store.credentialsSecretRef does not exist: \
                 create it with the store's access keys under `{}` and `{}`",
                r.access_key_id_key(),
                r.secret_access_key_key()
            )));
        }
        Ok(Err(e)) => {
            return Err(no(format!(
                "the Secret {ns}/{name} (spec.store.credentialsSecretRef) could not be read ({e})"
            )));
        }
        Err(_) => {
            return Err(no(format!(
                "the Secret {ns}/{name} (spec.store.credentialsSecretRef) could not be read (timed out)"
            )));
        }
    };
    let key = |k: &str| {
        secret.text(k).map(|v| v.trim().to_string()).ok_or_else(|| {
            no(format!(
                "the Secret {ns}/{name} (spec.store.credentialsSecretRef) has no usable key `{k}` \
                 (missing, empty, or not base64 text): put the store's access key there, or name \
                 its key in spec.store.credentialsSecretRef"
            ))
        })
    };
    Ok(Keys {
        access_key_id: key(r.access_key_id_key())?,
        secret_access_key: key(r.secret_access_key_key())?,
    })
}

/// The snapshot key spec.encryption.keySecretRef names (key `key` when it names none),
/// read live; what is missing or wrong is said, never the key.
pub async fn encryption_key(
    ctx: &Context,
    b: &TalosEtcdBackup,
    r: &crate::runtime::objects::SecretKeyRef,
) -> Result<crate::runtime::crypt::Key, Failure> {
    let (ns, name) = (b.namespace(), r.name.as_str());
    let k = r.key.as_deref().filter(|k| !k.is_empty()).unwrap_or("key");
    let no = |message: String| Failure {
        reason: "EncryptionKeyMissing".into(),
        message,
    };
    let read = tokio::time::timeout(
        ctx.settings.read_timeout,
        secrets::get(&ctx.client, ns, name),
    )
    .await;
    let secret = match read {
        Ok(Ok(Some(s))) => s,
        Ok(Ok(None)) => {
            return Err(no(format!(
                "the Secret {ns}/{name} named by spec.encryption.keySecretRef does not exist: create \
                 it with a 32-byte key under `{k}` (`openssl rand -base64 32`); no snapshot is \
                 stored unencrypted meanwhile"
            )));
        }
        Ok(Err(e)) => {
            return Err(no(format!(
                "the Secret {ns}/{name} (spec.encryption.keySecretRef) could not be read ({e})"
            )));
        }
        Err(_) => {
            return Err(no(format!(
                "the Secret {ns}/{name} (spec.encryption.keySecretRef) could not be read (timed out)"
            )));
        }
    };
    let bytes = match secret.value(k) {
        Ok(Some(b)) => b,
        Ok(None) => {
            return Err(no(format!(
                "the Secret {ns}/{name} (spec.encryption.keySecretRef) has no key `{k}`"
            )));
        }
        Err(why) => {
            return Err(no(format!(
                "the key `{k}` of Secret {ns}/{name} (spec.encryption.keySecretRef) {why}"
            )));
        }
    };
    crate::runtime::crypt::Key::from_secret(&bytes).map_err(|e| Failure {
        reason: "EncryptionKeyInvalid".into(),
        message: format!("the key `{k}` of Secret {ns}/{name} (spec.encryption.keySecretRef): {e}"),
    })
}

/// What went wrong with a snapshot stream, from both of its ends: the store's error first
/// (the node's side then only saw the pipe close), else the node's, else the check's.
fn stream_failure(from_node: Option<StreamError>, into_store: Option<PutError>) -> Failure {
    match (from_node, into_store) {
        (_, Some(PutError::Store(e))) => store_failure(e),
        (Some(StreamError::Talos(e)), _) => Failure {
            reason: match e {
                TalosError::Unreachable { .. } => "NodeUnreachable",
                _ => "TalosFailed",
            }
            .into(),
            message: format!("streaming the snapshot from the node failed: {e}"),
        },
        (Some(StreamError::Check(e)), _) | (_, Some(PutError::Check(e))) => Failure {
            reason: "SnapshotCorrupt".into(),
            message: format!("the snapshot failed its check: {e}"),
        },
        (_, Some(e @ PutError::Size { .. })) => Failure {
            reason: "SizeMismatch".into(),
            message: e.to_string(),
        },
        (_, Some(e @ (PutError::Crypt(_) | PutError::Encrypted))) => Failure {
            reason: "EncryptionFailed".into(),
            message: e.to_string(),
        },
        (Some(StreamError::Write(e)), None) => Failure {
            reason: "StreamFailed".into(),
            message: format!("the snapshot could not be passed to the store: {e}"),
        },
        (None, None) => Failure {
            reason: "StreamFailed".into(),
            message: "the snapshot stream failed".into(),
        },
    }
}

impl World for BackupLive<'_> {
    super::world::through_live!();

    fn note(&mut self, on: &TalosMachine, note: Note<'_>) {
        self.live.note(on, note);
    }
}

impl BackupWorld for BackupLive<'_> {
    async fn write_backup(
        &mut self,
        before: &TalosEtcdBackup,
        after: &TalosEtcdBackup,
    ) -> Result<(), ReconcileError> {
        let base = match &self.written {
            Some(w) if w.name() == after.name() => w,
            _ => before,
        };
        let version = super::status::write(&self.ctx.client, base, after).await?;
        let mut wrote = after.clone();
        if let Some(v) = version {
            wrote.metadata.resource_version = Some(v);
        }
        self.written = Some(wrote);
        Ok(())
    }

    async fn backup_event(
        &mut self,
        on: &TalosEtcdBackup,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let backup = format!("{}/{}", on.namespace(), on.name());
        if warning {
            tracing::warn!(%backup, reason, %note, "backup");
        } else {
            tracing::info!(%backup, reason, %note, "backup");
        }
        self.ctx.event(on, warning, reason, note).await;
    }

    async fn stream_snapshot(
        &mut self,
        b: &TalosEtcdBackup,
        m: &TalosMachine,
        key: &str,
    ) -> Result<Result<Stored, Failure>, ReconcileError> {
        let client = match self.live.client(m).await {
            Ok(c) => c,
            Err(e) => {
                return Ok(Err(Failure {
                    reason: "NoTalosCredentials".into(),
                    message: e.to_string(),
                }));
            }
        };
        let deadline = self.ctx.settings.snapshot_deadline;
        let seal = match &b.spec.encryption {
            None => None,
            Some(e) => match encryption_key(self.ctx, b, &e.key_secret_ref).await {
                Ok(k) => Some(k),
                Err(f) => return Ok(Err(f)),
            },
        };
        let store = match self.store(b).await {
            Ok(s) => s,
            Err(f) => return Ok(Err(f)),
        };
        // The node's stream feeds the store's upload through a small pipe: at most one
        // chunk in the pipe and one part of the upload in memory.
        let (mut w, r) = tokio::io::duplex(256 * 1024);
        let from_node = async move {
            let got = client.etcd_snapshot(&mut w, deadline).await;
            drop(w);
            got
        };
        let (from_node, into_store) =
            tokio::join!(from_node, store.put_snapshot(key, r, seal.as_ref()));
        Ok(match (from_node, into_store) {
            (Ok(_), Ok((checked, stored))) => Ok(Stored {
                size: stored,
                sha256: checked.sha256,
                encrypted: seal.is_some(),
                revision: checked.revision,
            }),
            (node, stored) => {
                if stored.is_ok() {
                    // The store saw a whole snapshot the node says it did not send whole.
                    let _ = store.delete(key).await;
                }
                Err(stream_failure(node.err(), stored.err()))
            }
        })
    }

    async fn delete_object(
        &mut self,
        b: &TalosEtcdBackup,
        key: &str,
    ) -> Result<Result<(), Failure>, ReconcileError> {
        let store = match self.store(b).await {
            Ok(s) => s,
            Err(f) => return Ok(Err(f)),
        };
        Ok(store.delete(key).await.map_err(store_failure))
    }

    fn snapshot_ended(
        &mut self,
        b: &TalosEtcdBackup,
        result: Result<&SnapshotRecord, &str>,
        took: Duration,
    ) {
        let backup = format!("{}/{}", b.namespace(), b.name());
        self.ctx
            .metrics
            .snapshot(&backup, result.map(|r| r.size), took);
    }
}
