//! Live, uncached reads from the API server: what a decision's rows need, read right now
//! through the kube client (`Api::list` / `get`; no reflector, no informer cache), each
//! bounded in time. A read that fails or times out fails the decision closed.

use super::facts::{EventFacts, Subject};
use super::objects::{Snapshot, TalosCluster, TalosMachine, TalosOperation};
use crate::compile::Table;
use crate::vocab::Fact;
use kube::api::ListParams;
use kube::{Api, Client};
use std::time::Duration;

/// Which kinds a decision must read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// One LIST of the namespace's TalosMachines.
    pub machines: bool,
    /// One GET of each TalosCluster the events are about.
    pub clusters: bool,
    /// One LIST of the namespace's TalosOperations.
    pub operations: bool,
}

const MACHINE_FACTS: &[Fact] = &[
    Fact::Approved,
    Fact::Workers,
    Fact::Transitioning,
    Fact::Rank,
    Fact::TargetControlPlane,
];
const CLUSTER_FACTS: &[Fact] = &[
    Fact::Count,
    Fact::Schedulable,
    Fact::ClusterExists,
    Fact::ClusterDeleting,
];
const OPERATION_FACTS: &[Fact] = &[
    Fact::UnfinishedExists,
    Fact::UnfinishedName,
    Fact::UnfinishedKind,
    Fact::UnfinishedPhase,
    Fact::UnfinishedParked,
];

fn any(mask: u32, facts: &[Fact]) -> bool {
    facts.iter().any(|f| mask & (1 << f.slot()) != 0)
}

impl Reads {
    /// What the rows of these events may read. Events without rows read nothing.
    pub fn for_events(table: &Table, events: &[EventFacts<'_>]) -> Reads {
        let mut r = Reads::default();
        for ev in events {
            let (verb, subject, site) = ev.event;
            let mask = table.facts_read(verb, subject, site);
            r.machines |= any(mask, MACHINE_FACTS);
            // A request about a TalosCluster carries the cluster itself.
            r.clusters |= any(mask, CLUSTER_FACTS) && !matches!(ev.subject, Subject::Cluster(_));
            r.operations |= any(mask, OPERATION_FACTS);
        }
        r
    }

    pub fn is_empty(&self) -> bool {
        !(self.machines || self.clusters || self.operations)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("reading {what} timed out after {} ms", timeout.as_millis())]
    Timeout { what: String, timeout: Duration },
    #[error("reading {what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl LiveError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            LiveError::Timeout { .. } => "timeout",
            LiveError::Api { .. } => "api",
        }
    }
}

/// Reads live state for decisions.
#[derive(Clone)]
pub struct LiveReader {
    client: Client,
    timeout: Duration,
}

impl LiveReader {
    pub fn new(client: Client, timeout: Duration) -> LiveReader {
        LiveReader { client, timeout }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn bounded<T>(
        &self,
        what: String,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LiveError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(LiveError::Api { what, source }),
            Err(_) => Err(LiveError::Timeout {
                what,
                timeout: self.timeout,
            }),
        }
    }

    /// Reads what `reads` asks for in `namespace`, concurrently; `clusters` names the
    /// TalosClusters to GET.
    pub async fn snapshot(
        &self,
        namespace: &str,
        clusters: &[&str],
        reads: Reads,
    ) -> Result<Snapshot, LiveError> {
        let machines = async {
            if !reads.machines {
                return Ok(Vec::new());
            }
            let api: Api<TalosMachine> = Api::namespaced(self.client.clone(), namespace);
            let list = self
                .bounded(
                    format!("TalosMachines in {namespace}"),
                    api.list(&ListParams::default()),
                )
                .await?;
            Ok::<_, LiveError>(list.items)
        };
        let operations = async {
            if !reads.operations {
                return Ok(Vec::new());
            }
            let api: Api<TalosOperation> = Api::namespaced(self.client.clone(), namespace);
            let list = self
                .bounded(
                    format!("TalosOperations in {namespace}"),
                    api.list(&ListParams::default()),
                )
                .await?;
            Ok::<_, LiveError>(list.items)
        };
        let cluster_reads = async {
            let mut out = Vec::new();
            if !reads.clusters {
                return Ok(out);
            }
            let api: Api<TalosCluster> = Api::namespaced(self.client.clone(), namespace);
            for name in clusters {
                if name.is_empty() {
                    continue;
                }
                let got = self
                    .bounded(
                        format!("TalosCluster {namespace}/{name}"),
                        api.get_opt(name),
                    )
                    .await?;
                out.extend(got);
            }
            Ok::<_, LiveError>(out)
        };
        let (machines, operations, clusters) = tokio::join!(machines, operations, cluster_reads);
        Ok(Snapshot {
            machines: machines?,
            clusters: clusters?,
            operations: operations?,
        })
    }
}
