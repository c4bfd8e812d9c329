//! `/metrics` on a port of its own, for callers the API server vouches for: the pattern of
//! controller-runtime's `WithAuthenticationAndAuthorization` and kube-rbac-proxy. The
//! bearer token of each scrape is sent to the API server in a TokenReview; the user it
//! names must then be allowed `get` on the non-resource URL `/metrics` (a
//! SubjectAccessReview). No token, or one the API server does not authenticate: 401. A
//! user without the permission: 403. A review the API server does not answer: 503 (never
//! served by default).
//!
//! A Prometheus ServiceAccount gets the permission from a ClusterRole such as
//!
//! ```yaml
//! rules:
//!   - nonResourceURLs: ["/metrics"]
//!     verbs: ["get"]
//! ```
//!
//! Outcomes are kept for [`CACHE_FOR`] per token (by its SHA-256, never the token itself),
//! so a scrape every few seconds costs two API calls at most every [`CACHE_FOR`], and a
//! flood of bad tokens at most [`CACHE_SIZE`] entries of memory.

use super::metrics::Metrics;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an outcome is kept for a token.
pub const CACHE_FOR: Duration = Duration::from_secs(30);
/// The most tokens kept at once (the cache is emptied when full).
pub const CACHE_SIZE: usize = 1024;
/// The most a review may take.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// What a scrape is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The metrics.
    Allowed,
    /// 401: no token, or the API server does not authenticate it.
    Unauthenticated(String),
    /// 403: the user may not `get` `/metrics`.
    Forbidden(String),
    /// 503: the API server did not answer a review (not kept).
    Unavailable(String),
}

/// How scrapes are let in.
pub enum Access {
    /// Anyone reaching the port (`--metrics-insecure`, local use).
    Open,
    /// TokenReview + SubjectAccessReview against this API server.
    Reviewed(Reviewer),
}

/// Reviews bearer tokens with the API server.
pub struct Reviewer {
    client: kube::Client,
    cache: Mutex<HashMap<[u8; 32], (Instant, Verdict)>>,
}

fn token_key(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(d.as_ref());
    key
}

/// The bearer token of an `Authorization` header.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Reviewer {
    pub fn new(client: kube::Client) -> Reviewer {
        Reviewer {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the holder of `token` may read `/metrics`.
    pub async fn review(&self, token: &str) -> Verdict {
        let key = token_key(token);
        if let Ok(cache) = self.cache.lock()
            && let Some((at, v)) = cache.get(&key)
            && at.elapsed() < CACHE_FOR
        {
            return v.clone();
        }
        let verdict = self.ask(token).await;
        if !matches!(verdict, Verdict::Unavailable(_))
            && let Ok(mut cache) = self.cache.lock()
        {
            if cache.len() >= CACHE_SIZE {
                cache.clear();
            }
            cache.insert(key, (Instant::now(), verdict.clone()));
        }
        verdict
    }

    async fn ask(&self, token: &str) -> Verdict {
        let reviews: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = match tokio::time::timeout(
            REVIEW_TIMEOUT,
            reviews.create(&PostParams::default(), &review),
        )
        .await
        {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Verdict::Unavailable(format!("TokenReview failed: {e}")),
            Err(_) => return Verdict::Unavailable("TokenReview timed out".into()),
        };
        let status = answer.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(u)) if u.username.as_deref().is_some_and(|n| !n.is_empty()) => u,
            _ => {
                return Verdict::Unauthenticated(
                    status
                        .error
                        .filter(|e| !e.is_empty())
                        .unwrap_or_else(|| "the token is not authenticated".into()),
                );
            }
        };
        let username = user.username.clone().unwrap_or_default();
        let sars: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        match tokio::time::timeout(REVIEW_TIMEOUT, sars.create(&PostParams::default(), &sar)).await
        {
            Ok(Ok(r)) => {
                let s = r.status.unwrap_or_default();
                if s.allowed && !s.denied.unwrap_or(false) {
                    Verdict::Allowed
                } else {
                    Verdict::Forbidden(format!(
                        "{username:?} may not get /metrics{}",
                        s.reason
                            .filter(|r| !r.is_empty())
                            .map(|r| format!(": {r}"))
                            .unwrap_or_default()
                    ))
                }
            }
            Ok(Err(e)) => Verdict::Unavailable(format!("SubjectAccessReview failed: {e}")),
            Err(_) => Verdict::Unavailable("SubjectAccessReview timed out".into()),
        }
    }
}

struct MetricsState {
    metrics: Arc<Metrics>,
    access: Access,
}

/// The routes of the metrics port: `/metrics` only.
pub fn metrics_router(metrics: Arc<Metrics>, access: Access) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .with_state(Arc::new(MetricsState { metrics, access }))
}

fn text(code: StatusCode, message: &str) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

async fn serve_metrics(State(state): State<Arc<MetricsState>>, headers: HeaderMap) -> Response {
    if let Access::Reviewed(reviewer) = &state.access {
        let verdict = match bearer(&headers) {
            None => Verdict::Unauthenticated("no bearer token".into()),
            Some(token) => reviewer.review(token).await,
        };
        match verdict {
            Verdict::Allowed => {}
            Verdict::Unauthenticated(why) => {
                tracing::debug!(%why, "metrics scrape refused: 401");
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "Unauthorized\n",
                )
                    .into_response();
            }
            Verdict::Forbidden(why) => {
                tracing::debug!(%why, "metrics scrape refused: 403");
                return text(StatusCode::FORBIDDEN, &format!("Forbidden: {why}"));
            }
            Verdict::Unavailable(why) => {
                tracing::warn!(%why, "metrics scrape refused: the API server did not review it");
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the API server did not review the token; retry shortly",
                );
            }
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_taken_only_from_a_bearer_header() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            "Bearer abc.def".parse().expect("value"),
        );
        assert_eq!(bearer(&h), Some("abc.def"));
        h.insert(
            header::AUTHORIZATION,
            "bearer  xyz ".parse().expect("value"),
        );
        assert_eq!(bearer(&h), Some("xyz"));
        h.insert(
            header::AUTHORIZATION,
            "Basic dXNlcjpwdw==".parse().expect("value"),
        );
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer ".parse().expect("value"));
        assert_eq!(bearer(&h), None);
    }
}
