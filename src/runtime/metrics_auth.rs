//! `/metrics` on a port of its own, for callers the API server vouches for: the pattern of
//! controller-runtime's `WithAuthenticationAndAuthorization` and kube-rbac-proxy. The
//! bearer token of each scrape is sent to the API server in a TokenReview; the user it
//! names must then be allowed `get` on the non-resource URL `/metrics` (a
//! SubjectAccessReview). No token, or one the API server does not authenticate: 401. A
//! user without the permission: 403. A review the API server does not answer: 503 (never
//! served by default). The webhook also answers `/admissions` there
//! (`runtime::admission_link`: the admissions it keeps, for a controller in another
//! process), behind the same check for the non-resource URL `/admissions`.
//!
//! A Prometheus ServiceAccount gets the permission from a ClusterRole such as
//!
//! ```yaml
//! rules:
//!   - nonResourceURLs: ["/metrics"]
//!     verbs: ["get"]
//! ```
//!
//! Outcomes are kept per token, by its SHA-256 (never the token itself): an authenticated
//! token's for [`CACHE_FOR`], so a scrape every few seconds costs two API calls at most
//! every [`CACHE_FOR`]; a refused token's for [`REFUSED_FOR`]. A flood of bad tokens costs
//! the API server little: a token never authenticated before is reviewed only with a
//! permit from a bucket of [`UNKNOWN_REVIEW_BURST`] refilled at
//! [`UNKNOWN_REVIEWS_PER_SECOND`], and without one the scrape is answered 429 "try again"
//! (never 401: the token may be good). A token the API server did authenticate is
//! reviewed again without a permit, so a flood cannot lock out a scraper that was already
//! let in. Memory stays within [`CACHE_SIZE`] entries of each kind.

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

/// How long the outcome of an authenticated token (allowed or forbidden) is kept.
pub const CACHE_FOR: Duration = Duration::from_secs(30);
/// How long a token the API server did not authenticate is refused without asking again.
pub const REFUSED_FOR: Duration = Duration::from_secs(10);
/// A token authenticated this long ago (or longer) is no longer known: it needs a permit
/// to be reviewed again, as a new one does.
pub const KNOWN_FOR: Duration = Duration::from_secs(600);
/// The most tokens kept at once, of each kind (authenticated, refused).
pub const CACHE_SIZE: usize = 1024;
/// Reviews of tokens never authenticated before that may be made at once...
pub const UNKNOWN_REVIEW_BURST: u32 = 10;
/// ... and how many more each second.
pub const UNKNOWN_REVIEWS_PER_SECOND: u32 = 2;
/// The most a review may take.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// What a scrape is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The metrics.
    Allowed,
    /// 401: no token, or the API server does not authenticate it.
    Unauthenticated(String),
    /// 403: the user may not `get` the path asked.
    Forbidden(String),
    /// 503: the API server did not answer a review (not kept).
    Unavailable(String),
    /// 429: a token never authenticated before, and no review permit left: try again.
    Limited,
}

/// How scrapes are let in.
pub enum Access {
    /// Anyone reaching the port (`--metrics-insecure`, local use).
    Open,
    /// TokenReview + SubjectAccessReview against this API server.
    Reviewed(Box<Reviewer>),
}

/// Reviews bearer tokens with the API server.
pub struct Reviewer {
    client: kube::Client,
    cache: Mutex<Cache>,
    permits: Mutex<Bucket>,
}

type Key = [u8; 32];

/// What is known of tokens, by their SHA-256.
#[derive(Default)]
struct Cache {
    /// Tokens the API server authenticated: when, and the verdict (allowed or forbidden).
    /// Kept past [`CACHE_FOR`] (until [`KNOWN_FOR`]) so that a review again needs no
    /// permit.
    known: HashMap<Key, (Instant, Verdict)>,
    /// Tokens the API server did not authenticate, and when.
    refused: HashMap<Key, Instant>,
}

impl Cache {
    fn remember(&mut self, key: Key, verdict: &Verdict) {
        let now = Instant::now();
        match verdict {
            Verdict::Allowed | Verdict::Forbidden(_) => {
                self.refused.remove(&key);
                if self.known.len() >= CACHE_SIZE && !self.known.contains_key(&key) {
                    self.known.retain(|_, (at, _)| at.elapsed() < KNOWN_FOR);
                    if self.known.len() >= CACHE_SIZE
                        && let Some(oldest) = self
                            .known
                            .iter()
                            .min_by_key(|(_, (at, _))| *at)
                            .map(|(k, _)| *k)
                    {
                        self.known.remove(&oldest);
                    }
                }
                self.known.insert(key, (now, verdict.clone()));
            }
            Verdict::Unauthenticated(_) => {
                self.known.remove(&key);
                if self.refused.len() >= CACHE_SIZE && !self.refused.contains_key(&key) {
                    self.refused.retain(|_, at| at.elapsed() < REFUSED_FOR);
                    if self.refused.len() >= CACHE_SIZE {
                        // Forgetting refusals costs reviews, which the permits bound.
                        self.refused.clear();
                    }
                }
                self.refused.insert(key, now);
            }
            Verdict::Unavailable(_) | Verdict::Limited => {}
        }
    }
}

/// Permits to review tokens never authenticated before: a token bucket.
struct Bucket {
    permits: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill =
            now.duration_since(self.at).as_secs_f64() * f64::from(UNKNOWN_REVIEWS_PER_SECOND);
        self.permits = (self.permits + refill).min(f64::from(UNKNOWN_REVIEW_BURST));
        self.at = now;
        if self.permits >= 1.0 {
            self.permits -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The key of a token's outcome for `path`: the SHA-256 of both (a token allowed
/// `/metrics` is not thereby allowed `/admissions`).
fn token_key(token: &str, path: &str) -> Key {
    let mut c = ring::digest::Context::new(&ring::digest::SHA256);
    c.update(path.as_bytes());
    c.update(b"\0");
    c.update(token.as_bytes());
    let d = c.finish();
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
            cache: Mutex::new(Cache::default()),
            permits: Mutex::new(Bucket {
                permits: f64::from(UNKNOWN_REVIEW_BURST),
                at: Instant::now(),
            }),
        }
    }

    /// Whether the holder of `token` may `get` the non-resource URL `path` (`/metrics`,
    /// `/admissions`).
    pub async fn review(&self, token: &str, path: &str) -> Verdict {
        let key = token_key(token, path);
        let mut known = false;
        if let Ok(cache) = self.cache.lock() {
            if let Some((at, v)) = cache.known.get(&key) {
                if at.elapsed() < CACHE_FOR {
                    return v.clone();
                }
                known = at.elapsed() < KNOWN_FOR;
            }
            if cache
                .refused
                .get(&key)
                .is_some_and(|at| at.elapsed() < REFUSED_FOR)
            {
                return Verdict::Unauthenticated("the token was refused a moment ago".into());
            }
        }
        // A token never authenticated (or long ago) needs a permit; a flood of new bad
        // tokens exhausts them and is answered 429 without costing the API server.
        if !known && !self.permits.lock().is_ok_and(|mut b| b.take()) {
            return Verdict::Limited;
        }
        let verdict = self.ask(token, path).await;
        if let Ok(mut cache) = self.cache.lock() {
            cache.remember(key, &verdict);
        }
        verdict
    }

    async fn ask(&self, token: &str, path: &str) -> Verdict {
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
                    path: Some(path.into()),
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
                        "{username:?} may not get {path}{}",
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
    admissions: Option<Arc<super::records::Recorder>>,
}

/// The routes of the metrics port: `/metrics`, and for a webhook (`webhook`)
/// `/admissions`, answered from `admissions` (its recorder, which keeps them; none with
/// `--decision-log off`: no decision to link to, every answer empty) and only to a
/// reviewed caller (never with [`Access::Open`]).
pub fn metrics_router(
    metrics: Arc<Metrics>,
    access: Access,
    webhook: bool,
    admissions: Option<Arc<super::records::Recorder>>,
) -> Router {
    let router = Router::new().route("/metrics", get(serve_metrics));
    let router = if webhook && matches!(access, Access::Reviewed(_)) {
        router.route(super::admission_link::PATH, get(serve_admissions))
    } else {
        router
    };
    router.with_state(Arc::new(MetricsState {
        metrics,
        access,
        admissions,
    }))
}

fn text(code: StatusCode, message: &str) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

/// `None` when the caller may `get` `path`; otherwise the answer that says why not.
async fn refused(access: &Access, headers: &HeaderMap, path: &str) -> Option<Response> {
    if let Access::Reviewed(reviewer) = access {
        let verdict = match bearer(headers) {
            None => Verdict::Unauthenticated("no bearer token".into()),
            Some(token) => reviewer.review(token, path).await,
        };
        match verdict {
            Verdict::Allowed => {}
            Verdict::Unauthenticated(why) => {
                tracing::debug!(%why, path, "refused: 401");
                return Some(
                    (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "Unauthorized\n",
                    )
                        .into_response(),
                );
            }
            Verdict::Forbidden(why) => {
                tracing::debug!(%why, path, "refused: 403");
                return Some(text(StatusCode::FORBIDDEN, &format!("Forbidden: {why}")));
            }
            Verdict::Limited => {
                tracing::debug!(path, "refused: 429, no review permit left");
                return Some(
                    (
                        StatusCode::TOO_MANY_REQUESTS,
                        [
                            (header::RETRY_AFTER, "1"),
                            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                        ],
                        "too many tokens to review at the moment; retry shortly\n",
                    )
                        .into_response(),
                );
            }
            Verdict::Unavailable(why) => {
                tracing::warn!(%why, path, "refused: the API server did not review the token");
                return Some(text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the API server did not review the token; retry shortly",
                ));
            }
        }
    }
    None
}

async fn serve_metrics(State(state): State<Arc<MetricsState>>, headers: HeaderMap) -> Response {
    if let Some(no) = refused(&state.access, &headers, "/metrics").await {
        return no;
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// `GET /admissions` (`runtime::admission_link`): the same check as `/metrics`, for the
/// non-resource URL `/admissions`; then the kept admissions asked for.
async fn serve_admissions(
    State(state): State<Arc<MetricsState>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    if let Some(no) = refused(&state.access, &headers, super::admission_link::PATH).await {
        return no;
    }
    super::admission_link::answer(
        state.admissions.as_deref().map(|r| &r.admissions),
        uri.query(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_never_push_out_the_tokens_let_in_and_the_permits_run_out() {
        let mut cache = Cache::default();
        cache.remember([1; 32], &Verdict::Allowed);
        for i in 0..(CACHE_SIZE + 10) {
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&(i as u64).to_le_bytes());
            key[31] = 2;
            cache.remember(key, &Verdict::Unauthenticated(String::new()));
        }
        assert!(cache.refused.len() <= CACHE_SIZE);
        assert_eq!(
            cache.known.get(&[1; 32]).map(|(_, v)| v),
            Some(&Verdict::Allowed)
        );
        // A full cache of authenticated tokens drops its oldest.
        for i in 0..CACHE_SIZE {
            let mut key = [3u8; 32];
            key[..8].copy_from_slice(&(i as u64).to_le_bytes());
            cache.remember(key, &Verdict::Forbidden(String::new()));
        }
        assert_eq!(cache.known.len(), CACHE_SIZE);
        assert!(!cache.known.contains_key(&[1; 32]), "the oldest went");
        let mut bucket = Bucket {
            permits: f64::from(UNKNOWN_REVIEW_BURST),
            at: Instant::now(),
        };
        let taken = (0..UNKNOWN_REVIEW_BURST * 3)
            .filter(|_| bucket.take())
            .count();
        assert!(
            taken >= UNKNOWN_REVIEW_BURST as usize && taken <= UNKNOWN_REVIEW_BURST as usize + 1
        );
    }

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
