//! The admission webhook: an HTTPS server answering AdmissionReview v1 requests for
//! TalosMachine, TalosCluster and TalosOperation with the rules' decision against live,
//! uncached state. The handler only unwraps the envelope; deciding is [`super::decide`].

use super::admission::{Request, immutable_spec_change, parse_review, refuse, respond};
use super::decide::{decide_request_events, request_events};
use super::facts::Expensive;
use super::live::{LiveReader, Reads};
use super::logs::Clipped;
use super::metrics::Metrics;
use super::records::{self, Recorder};
use super::reload::Rules;
use crate::vocab::Verdict;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tracing::Instrument;

/// The most an AdmissionReview body may be (the API server caps objects near 3 MiB).
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// How much of a body over [`MAX_BODY`] is read and dropped before the refusal is sent.
const DRAIN_LIMIT: u64 = 32 * 1024 * 1024;

/// Reads a body to its end (or past [`DRAIN_LIMIT`]) and drops it.
async fn drain(body: Body) {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut seen = 0u64;
    while let Some(Ok(chunk)) = stream.next().await {
        seen += chunk.len() as u64;
        if seen > DRAIN_LIMIT {
            break;
        }
    }
}

/// What the handlers share.
pub struct Webhook {
    pub rules: Arc<Rules>,
    pub reader: LiveReader,
    pub metrics: Arc<Metrics>,
    /// Set once the API server answered a read.
    pub api_ready: AtomicBool,
    /// The controller's own username (`serve --controller-username`): a request whose
    /// `userInfo.username` is exactly this has `request.by_controller`. `None`: no request
    /// is the controller's, so status changes the rules guard are refused for everyone.
    pub controller_username: Option<String>,
    /// Where decision records go (`serve --decision-log`); `None`: none are kept.
    pub records: Option<Arc<Recorder>>,
}

/// The routes: one validation endpoint per kind (any of them accepts any of our kinds),
/// health, readiness and metrics, unauthenticated: what `serve --metrics-insecure` serves
/// on its one port when there is no `--metrics-listen` (local use, and in-process tests).
pub fn router(state: Arc<Webhook>) -> Router {
    webhook_router(state.clone()).merge(
        Router::new()
            .route("/metrics", get(metrics))
            .with_state(state),
    )
}

/// The webhook's routes without `/metrics` (which `serve` then serves on its own port,
/// authenticated; see [`super::metrics_auth`]).
pub fn webhook_router(state: Arc<Webhook>) -> Router {
    Router::new()
        .route("/validate/talosmachines", post(validate))
        // Writes of talosmachines/status (the webhook configuration registers it apart).
        .route("/validate/talosmachines/status", post(validate))
        .route("/validate/talosclusters", post(validate))
        // Writes of talosclusters/status (the redacted base the dry render reads, the record
        // of the cluster's Bootstrap).
        .route("/validate/talosclusters/status", post(validate))
        .route("/validate/talosoperations", post(validate))
        .route("/validate/talosconfigpatches", post(validate))
        // Writes of talosetcdbackups/status (the snapshots the fresh-backup rules read),
        // and of the backups themselves for a caller that registers them.
        .route("/validate/talosetcdbackups/status", post(validate))
        .route("/validate/talosetcdbackups", post(validate))
        .route("/validate", post(validate))
        .with_state(state.clone())
        .merge(health_router(state))
}

/// Liveness (`/healthz`) and readiness (`/readyz`: rules loaded and the API server
/// answered) alone: the controller's health port (`serve --health-listen`).
pub fn health_router(state: Arc<Webhook>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

fn json_error(code: StatusCode, message: &str) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "error": message }).to_string(),
    )
        .into_response()
}

async fn readyz(State(state): State<Arc<Webhook>>) -> Response {
    let rules = state.rules.current();
    let api = state.api_ready.load(Ordering::Relaxed);
    if let (Some(table), true) = (&rules, api) {
        (StatusCode::OK, format!("ready\nrules {}\n", table.digest)).into_response()
    } else {
        let why = match (rules.is_some(), api) {
            (false, false) => "no rules loaded; the API server has not answered",
            (false, true) => "no rules loaded",
            _ => "the API server has not answered",
        };
        (StatusCode::SERVICE_UNAVAILABLE, why).into_response()
    }
}

async fn metrics(State(state): State<Arc<Webhook>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn validate(State(state): State<Arc<Webhook>>, headers: HeaderMap, body: Body) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/json") {
        state.metrics.bad_request();
        return json_error(
            StatusCode::BAD_REQUEST,
            &format!("expected Content-Type application/json, got {content_type:?}"),
        );
    }
    // A declared length over the limit is refused without parsing; the body is read and
    // dropped first (up to DRAIN_LIMIT), so the client, still writing, gets the answer
    // instead of a broken connection.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > MAX_BODY as u64) {
        state.metrics.bad_request();
        if n <= DRAIN_LIMIT {
            drain(body).await;
        }
        return json_error(
            StatusCode::BAD_REQUEST,
            &format!("the body is larger than {MAX_BODY} bytes ({n} declared)"),
        );
    }
    let bytes: Bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            state.metrics.bad_request();
            return json_error(
                StatusCode::BAD_REQUEST,
                &format!("the body is larger than {MAX_BODY} bytes or could not be read"),
            );
        }
    };
    let req = match parse_review(&bytes) {
        Ok(r) => r,
        Err(e) => {
            state.metrics.bad_request();
            // The error may quote what the caller sent (megabytes of it): clipped.
            tracing::warn!(error = %Clipped(&e.to_string()), reason = e.metric_label(), "malformed admission request");
            return json_error(StatusCode::BAD_REQUEST, &e.to_string());
        }
    };
    let started = Instant::now();
    let review = decide_request(&state, &req).await;
    let allowed = review.response.as_ref().is_some_and(|r| r.allowed);
    // Labelled by our kind (group and kind), never by what the caller wrote.
    state
        .metrics
        .request(req.kind.unwrap_or("other"), allowed, started.elapsed());
    match serde_json::to_vec(&review) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// Decides one request: no verb reads nothing; otherwise one live read of what the rows
/// need, then the table. Fails closed when the rules or the live state are missing.
pub async fn decide_request(
    state: &Webhook,
    req: &Request,
) -> kube::core::admission::AdmissionReview<kube::core::DynamicObject> {
    let op = operation_name(req.operation());
    // The caller's values, escaped and clipped: no forged lines, no megabyte fields.
    let span = tracing::info_span!(
        "admission",
        uid = %Clipped(req.uid()),
        kind = %Clipped(&req.inner.kind.kind),
        namespace = %Clipped(&req.namespace),
        name = %Clipped(&req.inner.name),
        operation = %op,
    );
    let started = Instant::now();
    let decided = decide_request_inner(state, req).instrument(span).await;
    let Decided {
        mut review,
        decision,
        events,
        table,
        without_rules,
    } = decided;
    if decision.is_none() && without_rules.is_none() {
        // No verb: nothing was decided, nothing is recorded.
        return review;
    }
    let id = records::decision_id();
    let digest = table.as_ref().map(|t| t.digest.clone()).unwrap_or_default();
    let empty = crate::interp::Decision::default();
    let d = decision.as_ref().unwrap_or(&empty);
    // Recorded first: the answer names the decision only when a log will hold it.
    let recorded = state.records.as_ref().map(|recorder| {
        // The caller's text, at most 256 characters a field: a queued record stays small
        // whatever a caller sends (the API server's own values are far shorter).
        recorder.record_webhook(&records::WebhookRecord {
            id: &id,
            time: k8s_openapi::jiff::Timestamp::now(),
            request: records::RequestRef {
                uid: records::clipped(req.uid()),
                user: records::clipped(req.inner.user_info.username.as_deref().unwrap_or("")),
                operation: op,
                kind: records::clipped(&req.inner.kind.kind),
                namespace: records::clipped(&req.namespace),
                name: records::clipped(&req.inner.name),
                object_uid: records::clipped(req.object_uid()),
                dry_run: req.dry_run(),
            },
            table: table.as_deref(),
            events: &events,
            decision: d,
            refused_without_rules: without_rules.as_deref(),
            latency_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        })
    });
    if let Some(resp) = review.response.as_mut() {
        let notes = &mut resp.audit_annotations;
        match recorded {
            Some(true) => {
                notes.insert("decision-id".into(), id.clone());
            }
            // No log holds the decision: an id would lead nowhere.
            Some(false) => {
                notes.insert(
                    "decision-record".into(),
                    "dropped: the decision log's queue was full".into(),
                );
            }
            None => {
                notes.insert("decision-record".into(), "off (--decision-log off)".into());
            }
        }
        if !digest.is_empty() {
            notes.insert("rules-digest".into(), digest.clone());
        }
        let deciding: Vec<&str> = d.deciding().iter().map(|f| f.rule.as_str()).collect();
        if !deciding.is_empty() {
            notes.insert("deciding-rules".into(), deciding.join(","));
        }
        let audited: Vec<&str> = d.audited.iter().map(|f| f.rule.as_str()).collect();
        if !audited.is_empty() {
            notes.insert("audit-rules-matched".into(), audited.join(","));
        }
    }
    records::give_buffer(events);
    review
}

/// An AdmissionRequest's operation as the API server spells it.
fn operation_name(op: &kube::core::admission::Operation) -> &'static str {
    use kube::core::admission::Operation;
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// What deciding a request gave: the answer, and for its record the decision, its events
/// (with their facts, as the JSON of the record's `events`: [`records::decide_recorded_into`])
/// and the table that decided, or why it was refused without rules.
struct Decided {
    review: kube::core::admission::AdmissionReview<kube::core::DynamicObject>,
    decision: Option<crate::interp::Decision>,
    events: Vec<u8>,
    table: Option<Arc<crate::compile::Table>>,
    without_rules: Option<String>,
}

impl Decided {
    /// Refused before the rules were asked.
    fn refused(req: &Request, message: String) -> Decided {
        Decided {
            review: refuse(req, message.clone()),
            decision: None,
            events: Vec::new(),
            table: None,
            without_rules: Some(message),
        }
    }
}

async fn decide_request_inner(state: &Webhook, req: &Request) -> Decided {
    let refuse = |req: &Request, message: String| Decided::refused(req, message);
    if let Some(message) = immutable_spec_change(req) {
        tracing::info!(verdict = "refuse", "an operation's spec changed: refused");
        return refuse(req, message);
    }
    // A TalosConfigPatch written: dry-rendered against the machines it selects (ADR 0106
    // §1), the result the facts of its `apply patch` event.
    let config_patch = match super::configpatch::from_request(req) {
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => return refuse(req, e.to_string()),
        None => None,
    };
    let mut dry = super::configpatch::DryRender::default();
    if let Some(p) = &config_patch {
        let read = tokio::time::timeout(
            DRY_RENDER_TIMEOUT,
            super::configpatch::dry_render_live(state.reader.client(), p),
        )
        .await;
        match read {
            Ok(Ok(d)) => dry = d,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "dry render: live read failed: refusing");
                return refuse(
                    req,
                    format!(
                        "{e}; ichor-rules refuses rather than deciding on missing data, retry shortly"
                    ),
                );
            }
            Err(_) => {
                return refuse(
                    req,
                    "the dry render of the TalosConfigPatch did not finish in time; retry shortly"
                        .into(),
                );
            }
        }
    }
    let events = match &config_patch {
        Some(p) => vec![super::configpatch::patch_event(&req.namespace, p, &dry)],
        None => request_events(
            req.operation(),
            &req.namespace,
            req.old.as_ref(),
            req.new.as_ref(),
        ),
    };
    if events.is_empty() {
        tracing::debug!("no verb: allowed without reading anything");
        return Decided {
            review: respond(req, &Default::default()),
            decision: None,
            events: Vec::new(),
            table: None,
            without_rules: None,
        };
    }
    let Some(table) = state.rules.current() else {
        tracing::error!("no rules loaded: refusing");
        return refuse(
            req,
            "ichor-rules has no valid rules loaded, so it refuses rather than deciding without them"
                .into(),
        );
    };
    let reads = Reads::for_events(&table, &events);
    let mut clusters: Vec<&str> = events.iter().map(|e| e.cluster).collect();
    clusters.sort_unstable();
    clusters.dedup();
    let snapshot = if reads.is_empty() {
        Default::default()
    } else {
        match state
            .reader
            .snapshot(&req.namespace, &clusters, reads)
            .await
        {
            Ok(s) => {
                state.api_ready.store(true, Ordering::Relaxed);
                s
            }
            Err(e) => {
                state.metrics.live_read_error(e.metric_label());
                tracing::error!(error = %e.detail(), "live read failed: refusing");
                return refuse(
                    req,
                    format!(
                        "{e}; ichor-rules refuses rather than deciding on missing data, retry shortly"
                    ),
                );
            }
        }
    };
    let ours = req.by_controller(state.controller_username.as_deref());
    // With records kept, the same decision with each event's facts read out after it.
    let (decision, recorded) = if state.records.is_some() {
        let mut json = records::take_buffer();
        let d = records::decide_recorded_into(
            &table,
            &snapshot,
            &events,
            Expensive::FromObjects,
            ours,
            &mut json,
        );
        (d, json)
    } else {
        let (d, _) = decide_request_events(
            &table,
            &snapshot,
            &events,
            Expensive::FromObjects,
            false,
            ours,
        );
        (d, Vec::new())
    };
    for f in decision.refusals.iter().chain(&decision.warnings) {
        state.metrics.decision(&f.rule, f.verdict.name());
    }
    for f in decision
        .audited
        .iter()
        .filter(|f| f.verdict == Verdict::Refuse)
    {
        state.metrics.would_refuse(&f.rule);
    }
    let verbs: Vec<String> = events
        .iter()
        .map(|e| format!("{} {}", e.event.0.name(), e.event.1.name()))
        .collect();
    let deciding: Vec<&str> = decision.refusals.iter().map(|f| f.rule.as_str()).collect();
    tracing::info!(
        verbs = ?verbs,
        verdict = if decision.verdict() == Some(Verdict::Refuse) { "refuse" } else { "allow" },
        rules = ?deciding,
        "decided"
    );
    Decided {
        review: respond(req, &decision),
        decision: Some(decision),
        events: recorded,
        table: Some(table),
        without_rules: None,
    }
}

/// How long the live reads and renders of a TalosConfigPatch's dry render may take.
const DRY_RENDER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The HTTPS server (TLS, deadlines, the connection cap) lives in [`super::server`].
pub use super::server::{Limits, serve_tls, serve_tls_with};
