//! Leases as locks: each cluster's lock on disruptive work, and the controller's leader
//! election. A Lease is held by one holder identity until it releases it or stops renewing
//! it for its duration; the same holder taking it again resumes it.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

/// The annotation naming the controller instance that last wrote a lock.
pub const CONTROLLER_ANNOTATION: &str = "ichor.maesh.dev/controller";

/// How a lock was got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// It was free (or expired) and is ours now.
    Taken,
    /// We held it already (a restarted controller resuming its own work).
    Resumed,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("the lock {lease} is held by {holder:?}")]
    Held { lease: String, holder: String },
    #[error("the lock {lease} was lost to {holder:?}")]
    Lost { lease: String, holder: String },
    #[error("lock {lease}: {source}")]
    Api {
        lease: String,
        #[source]
        source: kube::Error,
    },
}

/// One Lease used as a lock.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    duration: Duration,
    controller: String,
    /// Another annotation written with every write (the leader Lease's version mark).
    extra: Option<(String, String)>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn expired(spec: &LeaseSpec, fallback: Duration) -> bool {
    let secs = spec
        .lease_duration_seconds
        .map(|s| u64::try_from(s).unwrap_or(0))
        .unwrap_or(fallback.as_secs());
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return true;
    };
    let age = Timestamp::now().duration_since(renewed.0);
    age.as_secs() >= i64::try_from(secs).unwrap_or(i64::MAX)
}

impl LeaseLock {
    /// `controller` is recorded on the Lease for people reading it; the holder identity is
    /// what decides ownership.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        duration: Duration,
        controller: &str,
    ) -> LeaseLock {
        LeaseLock {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            duration,
            controller: controller.to_string(),
            extra: None,
        }
    }

    /// The same lock, writing the annotation `key: value` with every write.
    pub fn annotated(mut self, key: &str, value: &str) -> LeaseLock {
        self.extra = Some((key.to_string(), value.to_string()));
        self
    }

    /// `None` when the Lease does not exist; else the value of its annotation `key`.
    pub async fn annotation(&self, key: &str) -> Result<Option<Option<String>>, LockError> {
        let lease = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.api_err(e))?;
        Ok(lease.map(|l| l.metadata.annotations.and_then(|mut a| a.remove(key))))
    }

    pub fn name(&self) -> String {
        format!("Lease {}/{}", self.namespace, self.name)
    }

    fn api_err(&self, source: kube::Error) -> LockError {
        LockError::Api {
            lease: self.name(),
            source,
        }
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    fn stamp(&self, lease: &mut Lease) {
        lease
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(CONTROLLER_ANNOTATION.into(), self.controller.clone());
        if let Some((k, v)) = &self.extra {
            lease
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(k.clone(), v.clone());
        }
    }

    /// The current holder, if the lock is held and not expired.
    pub async fn holder(&self) -> Result<Option<String>, LockError> {
        let lease = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.api_err(e))?;
        Ok(lease.and_then(|l| {
            let spec = l.spec?;
            let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
            (!expired(&spec, self.duration)).then_some(holder)
        }))
    }

    /// Takes the lock for `holder`, or resumes it when `holder` has it already. A write
    /// that races another one fails with a conflict and reports the lock as held.
    pub async fn acquire(&self, holder: &str) -> Result<Acquired, LockError> {
        let existing = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.api_err(e))?;
        let Some(mut lease) = existing else {
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(holder.to_string()),
                    lease_duration_seconds: Some(self.duration_secs()),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            self.stamp(&mut lease);
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Acquired::Taken),
                Err(kube::Error::Api(s)) if s.code == 409 => Err(LockError::Held {
                    lease: self.name(),
                    holder: "(another writer, just now)".into(),
                }),
                Err(e) => Err(self.api_err(e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let current = spec.holder_identity.clone().unwrap_or_default();
        let outcome = if current == holder {
            Acquired::Resumed
        } else if current.is_empty() || expired(spec, self.duration) {
            spec.holder_identity = Some(holder.to_string());
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            Acquired::Taken
        } else {
            return Err(LockError::Held {
                lease: self.name(),
                holder: current,
            });
        };
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(self.duration_secs());
        self.stamp(&mut lease);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(outcome),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(LockError::Held {
                lease: self.name(),
                holder: "(another writer, just now)".into(),
            }),
            Err(e) => Err(self.api_err(e)),
        }
    }

    /// Renews the lock `holder` has; fails with `Lost` when someone else has it now.
    pub async fn renew(&self, holder: &str) -> Result<(), LockError> {
        match self.acquire(holder).await {
            Ok(Acquired::Resumed) => Ok(()),
            Ok(Acquired::Taken) => Ok(()),
            Err(LockError::Held { holder: h, .. }) => Err(LockError::Lost {
                lease: self.name(),
                holder: h,
            }),
            Err(e) => Err(e),
        }
    }

    /// Gives the lock up if `holder` has it (the Lease stays, with no holder).
    pub async fn release(&self, holder: &str) -> Result<(), LockError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.api_err(e))?
        else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(holder) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = Some(now());
        self.stamp(&mut lease);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            // Someone else wrote it meanwhile: it is not ours to release any more.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(()),
            Err(e) => Err(self.api_err(e)),
        }
    }
}

/// Keeps renewing a lock while long work runs; stops when dropped.
pub struct Renewal {
    task: tokio::task::JoinHandle<()>,
}

impl Renewal {
    pub fn start(lock: LeaseLock, holder: String, every: Duration) -> Renewal {
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = lock.renew(&holder).await {
                    tracing::warn!(error = %e, "renewing the cluster lock failed");
                }
            }
        });
        Renewal { task }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.task.abort();
    }
}
