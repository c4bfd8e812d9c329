//! The reads themselves ([`LiveReader`]): one cluster's objects through the kube client,
//! bounded in time, size and reads in flight, shared only by decisions that asked before
//! the read was sent.

use super::*;
use crate::runtime::objects::{
    Snapshot, TalosCluster, TalosEtcdBackup, TalosMachine, TalosOperation,
};
use axum::body::Bytes;
use kube::api::{GetParams, ListParams};
use kube::{Api, Client};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// One read a decision may share with others.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum ReadKey {
    /// The TalosMachines of one cluster (`namespace`, `spec.clusterRef.name`).
    Machines { namespace: String, cluster: String },
    /// The TalosOperations of one cluster.
    Operations { namespace: String, cluster: String },
    /// The TalosEtcdBackups of one cluster.
    Backups { namespace: String, cluster: String },
    /// One TalosCluster.
    Cluster { namespace: String, name: String },
    /// One TalosMachine, by name.
    Machine { namespace: String, name: String },
}

impl ReadKey {
    /// What is read, for a refusal: "the TalosMachines of TalosCluster `ns/name`".
    fn what(&self) -> String {
        match self {
            ReadKey::Machines { namespace, cluster } => format!(
                "the TalosMachines of TalosCluster `{namespace}/{}`",
                clip(cluster, 64)
            ),
            ReadKey::Operations { namespace, cluster } => format!(
                "the TalosOperations of TalosCluster `{namespace}/{}`",
                clip(cluster, 64)
            ),
            ReadKey::Backups { namespace, cluster } => format!(
                "the TalosEtcdBackups of TalosCluster `{namespace}/{}`",
                clip(cluster, 64)
            ),
            ReadKey::Cluster { namespace, name } => {
                format!("TalosCluster `{namespace}/{}`", clip(name, 64))
            }
            ReadKey::Machine { namespace, name } => {
                format!("TalosMachine `{namespace}/{}`", clip(name, 64))
            }
        }
    }
}

/// What a read found; shared by every decision that waited for it.
#[derive(Clone, Debug)]
pub(super) enum Fetched {
    Machines(Arc<Vec<TalosMachine>>),
    Operations(Arc<Vec<TalosOperation>>),
    Backups(Arc<Vec<TalosEtcdBackup>>),
    Cluster(Option<Arc<TalosCluster>>),
    Machine(Option<Arc<TalosMachine>>),
}

pub(super) type Outcome = Option<Result<Fetched, LiveError>>;

/// The reads of one key: one at a time, and the next one, not yet sent, that requests
/// arriving now wait for.
pub(super) struct KeyState {
    /// Held while a read of this key runs: the next one starts when it ends.
    running: Arc<tokio::sync::Mutex<()>>,
    /// The read that has not been sent yet. Joining it is sound: it is sent after the
    /// request that joins it arrived, so it sees state at least as new as the request.
    next: Option<watch::Receiver<Outcome>>,
}

#[derive(Default)]
pub(super) struct Flights {
    keys: Mutex<HashMap<ReadKey, KeyState>>,
    /// Reads asked for, and how many of them waited for a read another request asked.
    asked: AtomicU64,
    joined: AtomicU64,
}

/// Reads live state for decisions.
///
/// Every read is of one cluster: its TalosMachines and TalosOperations are LISTed with
/// `fieldSelector=spec.clusterRef.name=<cluster>` (the API server filters; the answer is
/// checked to hold only that cluster's objects), its TalosCluster is a GET. Concurrent
/// decisions about the same cluster may share a read, but only one sent after they asked
/// ([`KeyState::next`]): a decision never decides on state older than its request. Reads
/// in flight are bounded by a [`ReadLimit`].
#[derive(Clone)]
pub struct LiveReader {
    client: Client,
    timeout: Duration,
    decode: Decode,
    limit: ReadLimit,
    flights: Arc<Flights>,
}

/// What an answer said.
pub(super) enum Answer {
    Found(Bytes),
    NotFound,
}

impl LiveReader {
    /// A reader of whole objects (the controller's), with its own [`ReadLimit`] of
    /// [`ReadLimit::DEFAULT`] reads in flight.
    pub fn new(client: Client, timeout: Duration) -> LiveReader {
        LiveReader {
            client,
            timeout,
            decode: Decode::Full,
            limit: ReadLimit::new(ReadLimit::DEFAULT),
            flights: Arc::default(),
        }
    }

    /// The same reader decoding as `decode` says (with reads of its own to share).
    pub fn decoding(mut self, decode: Decode) -> LiveReader {
        self.decode = decode;
        self.flights = Arc::default();
        self
    }

    /// The same reader taking its turns from `limit` (one limit for a replica's readers).
    pub fn limited(mut self, limit: ReadLimit) -> LiveReader {
        self.limit = limit;
        self
    }

    pub fn limit(&self) -> &ReadLimit {
        &self.limit
    }

    /// Reads asked for, and how many of them were answered by a read another decision
    /// asked for (sent after both asked).
    pub fn shared_reads(&self) -> (u64, u64) {
        (
            self.flights.asked.load(Ordering::SeqCst),
            self.flights.joined.load(Ordering::SeqCst),
        )
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends one request; a 2xx answer must be at most [`MAX_ANSWER`] bytes. A 404 is
    /// `NotFound`; any other status is an error.
    async fn send(
        &self,
        what: &str,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<Answer, LiveError> {
        let invalid = |why: String| LiveError::Invalid {
            what: what.to_string(),
            why,
        };
        let request = request.map_err(|e| invalid(format!("the request cannot be made: {e}")))?;
        let response = self
            .client
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(|source| LiveError::Api {
                what: what.to_string(),
                source: Arc::new(source),
            })?;
        let code = response.status();
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), MAX_ANSWER)
            .await
            .map_err(|e| {
                invalid(format!(
                    "the answer was cut off or is larger than {MAX_ANSWER} bytes: {e}"
                ))
            })?;
        if code == http::StatusCode::NOT_FOUND {
            return Ok(Answer::NotFound);
        }
        if !code.is_success() {
            let status: kube::core::Status =
                crate::runtime::nesting::json(&body).unwrap_or_default();
            return Err(LiveError::Status {
                what: what.to_string(),
                code: code.as_u16(),
                reason: status.reason,
                message: if status.message.is_empty() {
                    String::from_utf8_lossy(&body[..body.len().min(1000)]).into_owned()
                } else {
                    status.message
                },
            });
        }
        Ok(Answer::Found(body))
    }

    /// Every object of `K` in `namespace` the field selector `selector` selects, read page
    /// by page to the end; each must be of `cluster` when one is named.
    async fn list_all<K: Validate>(
        &self,
        what: &str,
        url: &str,
        namespace: &str,
        selector: &str,
        cluster: Option<&str>,
    ) -> Result<Vec<K>, LiveError> {
        let invalid = |why: String| LiveError::Invalid {
            what: what.to_string(),
            why,
        };
        let request = kube::core::Request::new(url);
        let expect = Expect {
            kind: K::KIND,
            namespace,
            name: None,
            cluster,
        };
        let mut out: Vec<K> = Vec::new();
        let mut names = HashSet::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params = ListParams::default().fields(selector).limit(PAGE);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let body = match self.send(what, request.list(&params)).await? {
                Answer::Found(b) => b,
                Answer::NotFound => {
                    return Err(invalid(
                        "the API server answered 404: is the CustomResourceDefinition installed?"
                            .into(),
                    ));
                }
            };
            let (objects, next) = K::page(&body, self.decode, &expect).map_err(&invalid)?;
            drop(body);
            for o in objects {
                let o = o.validate().map_err(&invalid)?;
                if !names.insert(o.name().to_string()) {
                    return Err(invalid(format!(
                        "the answer lists {} `{}` twice",
                        K::KIND,
                        clip(o.name(), 64)
                    )));
                }
                out.push(o);
            }
            match next {
                None => return Ok(out),
                Some(t) if token.as_deref() == Some(t.as_str()) => {
                    return Err(invalid(
                        "the API server answered the same `continue` token twice".into(),
                    ));
                }
                Some(t) => token = Some(t),
            }
        }
        Err(invalid(format!(
            "the list did not end within {MAX_PAGES} pages of {PAGE}"
        )))
    }

    /// One object by name, or `None` when the API server says it does not exist.
    async fn get_one<K: Validate>(
        &self,
        what: &str,
        url: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>, LiveError> {
        if !valid_name(name) {
            return Err(LiveError::Invalid {
                what: what.to_string(),
                why: "that is not a valid object name".into(),
            });
        }
        let request = kube::core::Request::new(url).get(name, &GetParams::default());
        let expect = Expect {
            kind: K::KIND,
            namespace,
            name: Some(name),
            cluster: None,
        };
        match self.send(what, request).await? {
            Answer::NotFound => Ok(None),
            Answer::Found(body) => K::one(&body, self.decode, &expect)
                .and_then(K::validate)
                .map(Some)
                .map_err(|why| LiveError::Invalid {
                    what: what.to_string(),
                    why,
                }),
        }
    }

    /// Sends the read `key` names, bounded in time, once it has a turn of the limit.
    async fn fetch(&self, key: &ReadKey) -> Result<Fetched, LiveError> {
        let what = key.what();
        let Some(_turn) = self.limit.turn().await else {
            return Err(LiveError::Invalid {
                what,
                why: "the reader is shutting down".into(),
            });
        };
        let read = async {
            Ok(match key {
                ReadKey::Machines { namespace, cluster } => {
                    let api: Api<TalosMachine> = Api::namespaced(self.client.clone(), namespace);
                    Fetched::Machines(Arc::new(
                        self.list_all(
                            &what,
                            api.resource_url(),
                            namespace,
                            &cluster_selector(cluster),
                            Some(cluster),
                        )
                        .await?,
                    ))
                }
                ReadKey::Operations { namespace, cluster } => {
                    let api: Api<TalosOperation> = Api::namespaced(self.client.clone(), namespace);
                    Fetched::Operations(Arc::new(
                        self.list_all(
                            &what,
                            api.resource_url(),
                            namespace,
                            &cluster_selector(cluster),
                            Some(cluster),
                        )
                        .await?,
                    ))
                }
                ReadKey::Backups { namespace, cluster } => {
                    let api: Api<TalosEtcdBackup> = Api::namespaced(self.client.clone(), namespace);
                    Fetched::Backups(Arc::new(
                        self.list_all(
                            &what,
                            api.resource_url(),
                            namespace,
                            &cluster_selector(cluster),
                            Some(cluster),
                        )
                        .await?,
                    ))
                }
                ReadKey::Cluster { namespace, name } => {
                    let api: Api<TalosCluster> = Api::namespaced(self.client.clone(), namespace);
                    Fetched::Cluster(
                        self.get_one(&what, api.resource_url(), namespace, name)
                            .await?
                            .map(Arc::new),
                    )
                }
                // A LIST selecting the name, not a GET: what the controller is granted.
                ReadKey::Machine { namespace, name } => {
                    let api: Api<TalosMachine> = Api::namespaced(self.client.clone(), namespace);
                    let selector = format!("metadata.name={}", escape_field_value(name));
                    let found: Vec<TalosMachine> = self
                        .list_all(&what, api.resource_url(), namespace, &selector, None)
                        .await?;
                    if found.iter().any(|m| m.name() != name) {
                        return Err(LiveError::Invalid {
                            what: what.clone(),
                            why: "the answer holds a TalosMachine of another name".into(),
                        });
                    }
                    Fetched::Machine(found.into_iter().next().map(Arc::new))
                }
            })
        };
        match tokio::time::timeout(self.timeout, read).await {
            Ok(r) => r,
            Err(_) => Err(LiveError::Timeout {
                what,
                timeout: self.timeout,
            }),
        }
    }

    /// The read `key` names, sent after this call began: the one not yet sent, if another
    /// decision already asked for it, else a new one (sent once the read of the same key
    /// that is running, if any, has ended, and the limit gives a turn). Waiting is bounded
    /// by the read timeout.
    async fn read(&self, key: ReadKey) -> Result<Fetched, LiveError> {
        self.flights.asked.fetch_add(1, Ordering::SeqCst);
        let what = key.what();
        let rx = {
            let mut keys = self
                .flights
                .keys
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let state = keys.entry(key.clone()).or_insert_with(|| KeyState {
                running: Arc::default(),
                next: None,
            });
            match &state.next {
                Some(rx) => {
                    self.flights.joined.fetch_add(1, Ordering::SeqCst);
                    rx.clone()
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    state.next = Some(rx.clone());
                    let running = state.running.clone();
                    let reader = self.clone();
                    // Its own task: a decision that stops waiting (its client went away)
                    // does not take the read from the others waiting for it; the read
                    // ends early only when every one of them stopped waiting.
                    tokio::spawn(async move {
                        let guard = running.lock().await;
                        // Sent from here on: a request arriving now needs the next read.
                        reader.started(&key);
                        // Abandoned when no decision waits for it any more (each gave up
                        // or failed on another read): it would only load the API server.
                        tokio::select! {
                            result = reader.fetch(&key) => {
                                let _ = tx.send(Some(result));
                            }
                            () = tx.closed() => {}
                        }
                        drop(guard);
                        drop(running);
                        reader.forget_if_idle(&key);
                    });
                    rx
                }
            }
        };
        let mut rx = rx;
        let waited = tokio::time::timeout(self.timeout, rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(outcome)) => match &*outcome {
                Some(r) => r.clone(),
                None => Err(LiveError::Invalid {
                    what,
                    why: "the read ended without an answer".into(),
                }),
            },
            Ok(Err(_)) => Err(LiveError::Invalid {
                what,
                why: "the read ended without an answer".into(),
            }),
            Err(_) => Err(LiveError::Timeout {
                what,
                timeout: self.timeout,
            }),
        }
    }

    fn started(&self, key: &ReadKey) {
        let mut keys = self
            .flights
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(state) = keys.get_mut(key) {
            state.next = None;
        }
    }

    /// Drops the state of a key no read is running or waiting for.
    fn forget_if_idle(&self, key: &ReadKey) {
        let mut keys = self
            .flights
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if keys
            .get(key)
            .is_some_and(|s| s.next.is_none() && Arc::strong_count(&s.running) == 1)
        {
            keys.remove(key);
        }
    }

    /// One TalosMachine, read live by name (a LIST selecting `metadata.name`, which the
    /// controller's grants cover); `None` when it does not exist.
    pub async fn machine(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<TalosMachine>, LiveError> {
        let key = ReadKey::Machine {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        if !valid_namespace(namespace) {
            return Err(LiveError::Invalid {
                what: key.what(),
                why: "that is not a valid namespace name".into(),
            });
        }
        match self.read(key).await? {
            Fetched::Machine(m) => Ok(m.map(|m| (*m).clone())),
            _ => Ok(None),
        }
    }

    /// Reads what `reads` asks for about `clusters` of `namespace`, concurrently: for each
    /// cluster its TalosMachines and TalosOperations (a LIST each, selected by
    /// `spec.clusterRef.name`) and its TalosCluster (a GET). Facts are computed per
    /// cluster (`FactInfo.read`), so these are all a decision needs. A namespace or
    /// cluster name that cannot name an object is a failed read (it would not make a
    /// sound URL either).
    pub async fn snapshot(
        &self,
        namespace: &str,
        clusters: &[&str],
        reads: Reads,
    ) -> Result<Snapshot, LiveError> {
        if !reads.is_empty() && !valid_namespace(namespace) {
            return Err(LiveError::Invalid {
                what: format!("the objects of namespace `{}`", clip(namespace, 64)),
                why: "that is not a valid namespace name".into(),
            });
        }
        let mut names: Vec<&str> = clusters.to_vec();
        names.sort_unstable();
        names.dedup();
        let mut keys = Vec::new();
        for name in &names {
            let (namespace, cluster) = (namespace.to_string(), name.to_string());
            if reads.machines {
                keys.push(ReadKey::Machines {
                    namespace: namespace.clone(),
                    cluster: cluster.clone(),
                });
            }
            if reads.operations {
                keys.push(ReadKey::Operations {
                    namespace: namespace.clone(),
                    cluster: cluster.clone(),
                });
            }
            if reads.backups {
                keys.push(ReadKey::Backups {
                    namespace: namespace.clone(),
                    cluster: cluster.clone(),
                });
            }
            if reads.clusters && !name.is_empty() {
                keys.push(ReadKey::Cluster {
                    namespace,
                    name: cluster,
                });
            }
        }
        let fetched = futures::future::try_join_all(keys.into_iter().map(|k| self.read(k))).await?;
        let mut snapshot = Snapshot::default();
        for f in fetched {
            match f {
                Fetched::Machines(m) => snapshot.machines.extend(m.iter().cloned()),
                Fetched::Operations(o) => snapshot.operations.extend(o.iter().cloned()),
                Fetched::Backups(b) => snapshot.backups.extend(b.iter().cloned()),
                Fetched::Cluster(c) => snapshot.clusters.extend(c.map(|c| (*c).clone())),
                Fetched::Machine(m) => snapshot.machines.extend(m.map(|m| (*m).clone())),
            }
        }
        Ok(snapshot)
    }
}
