//! The live objects of one decision.

use super::{TalosCluster, TalosConfigPatch, TalosEtcdBackup, TalosMachine, TalosOperation};

/// The live objects a decision is made against.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub machines: Vec<TalosMachine>,
    pub clusters: Vec<TalosCluster>,
    pub operations: Vec<TalosOperation>,
    /// The cluster's TalosEtcdBackups (read only when a decision's facts need them).
    #[serde(default)]
    pub backups: Vec<TalosEtcdBackup>,
    /// The TalosConfigPatches of an objects file (`eval`, `test`: what a patch's dry render
    /// reads; the webhook reads them live for that render alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<TalosConfigPatch>,
}

impl Snapshot {
    pub fn cluster(&self, namespace: &str, name: &str) -> Option<&TalosCluster> {
        self.clusters
            .iter()
            .find(|c| c.namespace() == namespace && c.name() == name)
    }

    pub fn machine(&self, namespace: &str, name: &str) -> Option<&TalosMachine> {
        self.machines
            .iter()
            .find(|m| m.namespace() == namespace && m.name() == name)
    }

    pub fn backup(&self, namespace: &str, name: &str) -> Option<&TalosEtcdBackup> {
        self.backups
            .iter()
            .find(|b| b.namespace() == namespace && b.name() == name)
    }

    pub fn operation(&self, namespace: &str, name: &str) -> Option<&TalosOperation> {
        self.operations
            .iter()
            .find(|o| o.namespace() == namespace && o.name() == name)
    }
}
