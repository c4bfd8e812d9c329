//! Leases as locks: each cluster's lock on disruptive work, and the controller's leader
//! election. A Lease is held by one holder identity until it releases it or stops renewing
//! it for its duration; the same holder taking it again resumes it.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    Held {
        lease: String,
        holder: String,
        /// Its holder has not renewed it for its duration (as this replica has seen it).
        expired: bool,
    },
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
    /// What this replica has seen of its Leases ([`Observations`]), shared by every lock
    /// it makes.
    seen: Arc<Observations>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// What one replica has seen of each Lease: its record, and when (on this replica's own
/// monotonic clock) that record was first seen. A Lease held by someone else has expired
/// once this replica has seen the same record, unrenewed, for the Lease's whole duration,
/// as client-go's leader election decides: never by comparing this replica's clock with a
/// `renewTime` another replica wrote, so a clock skew between replicas cannot make two
/// holders (a replica whose clock runs ahead would otherwise take a Lease that is still
/// being renewed). A replica that has just started waits one duration before taking a
/// Lease someone holds.
#[derive(Default)]
pub struct Observations {
    seen: std::sync::Mutex<HashMap<String, (Record, Instant)>>,
}

/// The parts of a Lease that change when it is written: any write is a renewal.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: String,
    renew: Option<String>,
    acquire: Option<String>,
    transitions: Option<i32>,
    version: Option<String>,
}

impl Record {
    fn of(lease: &Lease) -> Record {
        let spec = lease.spec.as_ref();
        Record {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default(),
            renew: spec.and_then(|s| s.renew_time.as_ref().map(|t| t.0.to_string())),
            acquire: spec.and_then(|s| s.acquire_time.as_ref().map(|t| t.0.to_string())),
            transitions: spec.and_then(|s| s.lease_transitions),
            version: lease.metadata.resource_version.clone(),
        }
    }
}

impl Observations {
    /// Whether the Lease `key`, read now as `record` with `duration`, has gone unrenewed
    /// for its whole duration as this replica has watched it. Pure but for the map: `now`
    /// is the caller's.
    fn expired(&self, key: &str, record: Record, duration: Duration, now: Instant) -> bool {
        let Ok(mut seen) = self.seen.lock() else {
            // A poisoned map: nothing proves the Lease expired.
            return false;
        };
        // Bounded: a replica watches its leader Lease and one lock per cluster it works on.
        if seen.len() > 10_000 {
            seen.clear();
        }
        let entry = seen.entry(key.to_string()).or_insert((record.clone(), now));
        if entry.0 != record {
            *entry = (record, now);
        }
        now.saturating_duration_since(entry.1) >= duration
    }
}

fn lease_duration(spec: &LeaseSpec, fallback: Duration) -> Duration {
    spec.lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(fallback, Duration::from_secs)
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
        seen: Arc<Observations>,
    ) -> LeaseLock {
        LeaseLock {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            duration,
            controller: controller.to_string(),
            extra: None,
            seen,
        }
    }

    /// Whether `lease`, held by someone, has gone unrenewed for its duration as this
    /// replica has watched it ([`Observations`]).
    fn expired(&self, lease: &Lease) -> bool {
        let duration = lease
            .spec
            .as_ref()
            .map_or(self.duration, |s| lease_duration(s, self.duration));
        self.seen.expired(
            &format!("{}/{}", self.namespace, self.name),
            Record::of(lease),
            duration,
            Instant::now(),
        )
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
            let holder = l
                .spec
                .as_ref()?
                .holder_identity
                .clone()
                .filter(|h| !h.is_empty())?;
            (!self.expired(&l)).then_some(holder)
        }))
    }

    /// Takes the lock for `holder`, or resumes it when `holder` has it already. A write
    /// that races another one fails with a conflict and reports the lock as held.
    pub async fn acquire(&self, holder: &str) -> Result<Acquired, LockError> {
        self.acquire_with(holder, true).await
    }

    /// As [`LeaseLock::acquire`]; with `take_expired` false, a Lease another holder let
    /// expire is not taken either: `Held` says it expired, and the caller decides.
    pub async fn acquire_with(
        &self,
        holder: &str,
        take_expired: bool,
    ) -> Result<Acquired, LockError> {
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
                    expired: false,
                }),
                Err(e) => Err(self.api_err(e)),
            };
        };
        let expired = self.expired(&lease);
        let spec = lease.spec.get_or_insert_with(Default::default);
        let current = spec.holder_identity.clone().unwrap_or_default();
        let outcome = if current == holder {
            Acquired::Resumed
        } else if current.is_empty() || (expired && take_expired) {
            spec.holder_identity = Some(holder.to_string());
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            Acquired::Taken
        } else {
            return Err(LockError::Held {
                lease: self.name(),
                holder: current,
                expired,
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
                expired: false,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, version: &str, renew: &str) -> Record {
        Record {
            holder: holder.into(),
            renew: Some(renew.into()),
            acquire: None,
            transitions: Some(0),
            version: Some(version.into()),
        }
    }

    /// Expiry is measured on the reader's own clock from when it first saw a record: the
    /// writer's `renewTime` (here: a year before the reader's clock, as a skewed clock
    /// would make it) does not make a Lease that is still renewed look expired.
    #[test]
    fn a_lease_expires_only_after_a_whole_duration_unrenewed_on_the_readers_clock() {
        let seen = Observations::default();
        let d = Duration::from_secs(15);
        let t0 = Instant::now();
        let old = "2025-12-04T00:00:00Z";
        assert!(!seen.expired("ns/l", record("a", "1", old), d, t0));
        assert!(!seen.expired("ns/l", record("a", "1", old), d, t0 + d / 2));
        // Renewed (a new resourceVersion): the wait starts again.
        assert!(!seen.expired("ns/l", record("a", "2", old), d, t0 + d));
        assert!(!seen.expired("ns/l", record("a", "2", old), d, t0 + d + d / 2));
        assert!(seen.expired("ns/l", record("a", "2", old), d, t0 + d * 2));
        // Another Lease is watched apart.
        assert!(!seen.expired("ns/m", record("a", "2", old), d, t0 + d * 2));
        // A new holder is a new record.
        assert!(!seen.expired("ns/l", record("b", "3", old), d, t0 + d * 3));
        assert!(seen.expired("ns/l", record("b", "3", old), d, t0 + d * 4));
    }
}
