//! Live, uncached reads from the API server: what a decision's rows need, read right now
//! through the kube client (no reflector, no informer cache), each bounded in time and in
//! size. A read that fails or times out fails the decision closed, and so does an answer
//! that is partial or contradicts the request: a LIST is read page by page to its end
//! (`limit`/`continue`), and every object in an answer must be of the kind, namespace,
//! cluster and name asked for, with the fields a decision needs. The decision never sees a
//! partial list.
//!
//! Reads are proportional to a cluster, not to its namespace: every fact is computed from
//! the objects of the event's cluster (`FactInfo.read`; `read_declarations.rs`
//! computes each from only that cluster's objects beside another cluster's), so a LIST
//! selects `spec.clusterRef.name` on the API server (a CRD `selectableFields` entry,
//! Kubernetes >= 1.32) and an answer is decoded straight from its bytes into the fields
//! decisions read ([`Decode::Decisions`]). Concurrent decisions about one cluster may share
//! a read sent after they asked, never one sent before; a [`ReadLimit`] bounds the reads in
//! flight.
//!
//! The parts: [`list`] (names, selectors, a LIST to its end), [`limit`] (reads in flight),
//! [`decode`] (answers to objects: pure) and [`reader`] (the reads: I/O).

mod decode;
mod limit;
mod list;
mod reader;

use self::{decode::*, list::*};
pub use decode::Decode;
pub use limit::ReadLimit;
pub use list::{
    CLUSTER_FIELD, cluster_selector, escape_field_value, list_complete, valid_name, valid_namespace,
};
pub use reader::LiveReader;

use crate::compile::Table;
use crate::runtime::facts::{EventFacts, Subject};
use crate::vocab::{FACTS, Read};
use std::sync::Arc;
use std::time::Duration;

/// Which kinds a decision must read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// One LIST of each cluster's TalosMachines (`spec.clusterRef.name` selected).
    pub machines: bool,
    /// One GET of each TalosCluster the events are about.
    pub clusters: bool,
    /// One LIST of each cluster's TalosOperations (`spec.clusterRef.name` selected).
    pub operations: bool,
    /// One LIST of each cluster's TalosEtcdBackups (`spec.clusterRef.name` selected).
    pub backups: bool,
}

/// Whether any fact of `mask` is computed from `read` (the one declaration is `FACTS`).
pub(super) fn any(mask: u64, read: Read) -> bool {
    FACTS
        .iter()
        .any(|f| f.read == read && mask & (1 << f.fact.slot()) != 0)
}

impl Reads {
    /// What the rows of these events may read. Events without rows read nothing.
    pub fn for_events(table: &Table, events: &[EventFacts<'_>]) -> Reads {
        let mut r = Reads::default();
        for ev in events {
            let (verb, subject, site) = ev.event;
            let mask = table.facts_read(verb, subject, site);
            r.machines |= any(mask, Read::Machines);
            // A request about a TalosCluster carries the cluster itself.
            r.clusters |= any(mask, Read::Cluster) && !matches!(ev.subject, Subject::Cluster(_));
            r.operations |= any(mask, Read::Operations);
            // Whether a backup's store is inside the cluster reads the cluster's network.
            let backups = any(mask, Read::Backups);
            r.backups |= backups;
            r.clusters |= backups && !matches!(ev.subject, Subject::Cluster(_));
        }
        r
    }

    pub fn is_empty(&self) -> bool {
        !(self.machines || self.clusters || self.operations || self.backups)
    }
}

/// Why a live read failed. `Display` is the one short sentence a refusal carries (what
/// could not be read, and why in a few words); [`LiveError::detail`] is for the log.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LiveError {
    #[error("{what} could not be read (no answer within {} ms)", timeout.as_millis())]
    Timeout { what: String, timeout: Duration },
    /// The request did not get an answer: connection refused, TLS, a broken body.
    #[error("{what} could not be read (the API server could not be reached)")]
    Api {
        what: String,
        #[source]
        source: Arc<kube::Error>,
    },
    /// The API server answered with an error status.
    #[error(
        "{what} could not be read (the API server answered {code}{})",
        short_reason(reason)
    )]
    Status {
        what: String,
        code: u16,
        reason: String,
        message: String,
    },
    /// The answer is partial, malformed, or contradicts the request.
    #[error("{what} could not be read ({why})")]
    Invalid { what: String, why: String },
}

/// A Kubernetes `reason` (CamelCase, such as `InternalError`) for a message; anything else
/// the server put there stays in the log.
pub(super) fn short_reason(reason: &str) -> String {
    if !reason.is_empty() && reason.len() <= 40 && reason.chars().all(|c| c.is_ascii_alphabetic()) {
        format!(" {reason}")
    } else {
        String::new()
    }
}

/// At most `max` characters of `s`, control characters escaped: server-chosen text in a
/// message stays one short line.
pub(super) fn clip(s: &str, max: usize) -> String {
    // The common case, a name as Kubernetes allows it, is copied as it is.
    if s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'\\' | b'"' | b'\''))
    {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max).flat_map(char::escape_debug).collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

impl LiveError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            LiveError::Timeout { .. } => "timeout",
            LiveError::Api { .. } | LiveError::Status { .. } => "api",
            LiveError::Invalid { .. } => "invalid",
        }
    }

    /// Everything known about the failure, for the log (never for a refusal message).
    pub fn detail(&self) -> String {
        match self {
            LiveError::Timeout { .. } | LiveError::Invalid { .. } => self.to_string(),
            LiveError::Api { source, .. } => {
                let mut out = format!("{self}: {source}");
                let mut cause = std::error::Error::source(source.as_ref());
                while let Some(c) = cause {
                    out.push_str(&format!(": {c}"));
                    cause = c.source();
                }
                out
            }
            LiveError::Status {
                reason, message, ..
            } => format!(
                "{self}: reason {:?}, message {:?}",
                clip(reason, 200),
                clip(message, 1000)
            ),
        }
    }
}

mod read_declarations;

#[cfg(test)]
mod clipping {
    use super::clip;

    /// What `clip` always meant: at most `max` characters, escaped as `escape_debug` does.
    fn slow(s: &str, max: usize) -> String {
        let mut out: String = s.chars().take(max).flat_map(char::escape_debug).collect();
        if s.chars().count() > max {
            out.push('…');
        }
        out
    }

    #[test]
    fn the_fast_path_for_plain_names_says_what_the_escaping_one_says() {
        for s in [
            "cp-1",
            "",
            "a\"b",
            "it's",
            "back\\slash",
            "tab\there",
            "new\nline",
            "sp ace",
            "é",
            "x".repeat(64).as_str(),
            "x".repeat(65).as_str(),
            "\u{202e}rtl",
        ] {
            assert_eq!(clip(s, 64), slow(s, 64), "{s:?}");
        }
    }
}
