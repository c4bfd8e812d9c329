//! The HTTPS server under the webhook: TLS, then one HTTP/1.1 connection per client, with
//! the limits that keep hostile clients from holding it. The webhook port is reachable
//! without credentials in most clusters, so every phase of a connection has a deadline and
//! the number of connections is capped:
//!
//! - the TLS handshake must finish within [`Limits::handshake_timeout`];
//! - a request head, once its first byte arrived, within [`Limits::header_timeout`];
//! - a request body, once its head was read, within [`Limits::body_timeout`];
//! - the next request must begin within [`Limits::idle_timeout`] of the connection being
//!   ready (after the handshake, or after the previous answer);
//! - at most [`Limits::max_connections`] are open; one more is closed as soon as it is
//!   accepted (counted in `ichor_rules_connections_refused_total`).
//!
//! When the server shuts down (SIGTERM) it stops accepting, closes idle connections and
//! lets each busy one finish the answer in progress, for at most [`DRAIN`].
//!
//! A connection over a deadline is closed (counted in
//! `ichor_rules_connections_timed_out_total` by phase). Request heads are capped at
//! [`MAX_HEAD`] bytes and each connection buffers at most [`MAX_BUFFER`] bytes; the
//! webhook caps each body itself ([`super::webhook::MAX_BODY`]).
//!
//! Request bodies are also bounded all together: the bytes of the bodies being received,
//! decoded and decided at once never exceed [`BODY_BUDGET`]. A body takes its share of the
//! budget as its bytes arrive (so a client holds only what it really sent) and gives it
//! back when its answer is written (decoding a body costs memory many times its size, so
//! bodies near [`super::webhook::MAX_BODY`] must not be decoded many at once). A body
//! waiting for budget waits within its deadline.

use super::metrics::{Closed, Metrics};
use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use hyper::service::Service as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The largest request head (request line and headers) accepted, in bytes.
pub const MAX_HEAD: usize = 32 * 1024;

/// The most a connection buffers for reading or writing, in bytes.
pub const MAX_BUFFER: usize = 64 * 1024;

/// The request body bytes held at once, all connections together: one body of the
/// largest size the webhook accepts, and 1 MiB for the others meanwhile.
pub const BODY_BUDGET: usize = super::webhook::MAX_BODY + 1024 * 1024;

/// The budget's unit, in bytes.
const UNIT: u64 = 1024;

/// Deadlines and the connection cap (`serve`'s flags of the same names).
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 256,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves `app` over TLS on `listener` with the default [`Limits`] until `shutdown`
/// resolves.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    serve_tls_with(
        listener,
        tls,
        app,
        Limits::default(),
        Arc::new(Metrics::default()),
        shutdown,
    )
    .await
}

/// Serves `app` over TLS on `listener` within `limits` until `shutdown` resolves.
pub async fn serve_tls_with(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    let max_connections = limits.max_connections.max(1);
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let shared = Arc::new(Shared {
        acceptor: tokio_rustls::TlsAcceptor::from(tls),
        app,
        limits,
        metrics: metrics.clone(),
        budget: Arc::new(tokio::sync::Semaphore::new(BODY_BUDGET / UNIT as usize)),
        stopping,
    });
    let mut at_cap = false;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => {
                // Stop accepting; let open connections finish the request in progress
                // (idle ones close now), for at most DRAIN.
                let _ = stop.send(true);
                let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
                let _ = tokio::time::timeout(DRAIN, slots.acquire_many(all)).await;
                return;
            }
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.connection_refused();
            if !at_cap {
                tracing::warn!(
                    max_connections,
                    "connection cap reached: new connections are closed until some end"
                );
                at_cap = true;
            }
            drop(stream);
            continue;
        };
        at_cap = false;
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            shared.metrics.connection(true);
            connection(stream, peer, &shared).await;
            shared.metrics.connection(false);
            drop(slot);
        });
    }
}

/// How long a server shutting down waits for its open connections to finish.
pub const DRAIN: Duration = Duration::from_secs(5);

/// What every connection of a server shares.
struct Shared {
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    budget: Arc<tokio::sync::Semaphore>,
    /// Turns true when the server shuts down.
    stopping: tokio::sync::watch::Receiver<bool>,
}

/// One connection, from the handshake to its end or a deadline.
async fn connection(stream: tokio::net::TcpStream, peer: std::net::SocketAddr, shared: &Shared) {
    let (limits, metrics) = (&shared.limits, &shared.metrics);
    let (app, budget) = (shared.app.clone(), shared.budget.clone());
    let tls = match tokio::time::timeout(limits.handshake_timeout, shared.acceptor.accept(stream))
        .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            metrics.connection_timed_out(Closed::Handshake);
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let activity = Arc::new(Activity::new());
    let io = hyper_util::rt::TokioIo::new(Tracked {
        inner: tls,
        activity: activity.clone(),
    });
    let service = {
        let (activity, body_timeout) = (activity.clone(), limits.body_timeout);
        let app = hyper_util::service::TowerToHyperService::new(app);
        hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            activity.set(Phase::Busy);
            // A body declared longer than the webhook takes is refused, and read only to
            // be dropped: it is not held, so it takes no budget.
            let declared = req
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            let held = Arc::new(Mutex::new(Vec::new()));
            let share = declared
                .is_none_or(|n| n <= super::webhook::MAX_BODY as u64)
                .then(|| Share {
                    budget: budget.clone(),
                    held: held.clone(),
                    received: 0,
                    units: 0,
                    waiting: None,
                });
            let req = req.map(|inner| {
                Body::new(Deadline {
                    inner,
                    sleep: Box::pin(tokio::time::sleep(body_timeout)),
                    activity: activity.clone(),
                    share,
                })
            });
            let (answer, activity) = (app.call(req), activity.clone());
            async move {
                let answer = answer.await;
                activity.set(Phase::Idle);
                // The body's share of the budget is given back once its answer is written
                // (an answer may quote the request: an AdmissionReview's uid, an error).
                answer.map(|r| r.map(|inner| Body::new(Holding { inner, _held: held })))
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .max_header_size(MAX_HEAD)
        .max_buf_size(MAX_BUFFER)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = shared.stopping.clone();
    let mut draining = *stopping.borrow();
    if draining {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            ended = conn.as_mut() => {
                // A body past its deadline may end the connection before the watchdog
                // sees it.
                if let (Phase::Expired(why), _) = activity.get() {
                    metrics.connection_timed_out(why);
                }
                if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            why = watchdog(&activity, limits) => {
                metrics.connection_timed_out(why);
                tracing::debug!(%peer, phase = why.label(), "connection closed: timed out");
                return;
            }
            _ = stopping.changed(), if !draining => {
                // The answer in progress is finished; no other request is read.
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Where a connection is in its request/answer cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request to begin.
    Idle,
    /// A request began; its head is not complete.
    Head,
    /// The application has the request (its body has its own deadline).
    Busy,
    /// A deadline passed inside the application: close now.
    Expired(Closed),
}

/// A connection's phase and since when, shared by its reader, its service and its
/// watchdog.
struct Activity {
    phase: Mutex<(Phase, Instant)>,
    changed: tokio::sync::Notify,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            phase: Mutex::new((Phase::Idle, Instant::now())),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn get(&self) -> (Phase, Instant) {
        self.phase
            .lock()
            .map(|p| *p)
            .unwrap_or((Phase::Expired(Closed::Idle), Instant::now()))
    }

    fn set(&self, phase: Phase) {
        if let Ok(mut p) = self.phase.lock() {
            if matches!(p.0, Phase::Expired(_)) {
                return;
            }
            *p = (phase, Instant::now());
        }
        self.changed.notify_one();
    }

    /// Bytes arrived: an idle connection now reads a request head.
    fn bytes_arrived(&self) {
        let began = self
            .phase
            .lock()
            .map(|mut p| {
                if p.0 == Phase::Idle {
                    *p = (Phase::Head, Instant::now());
                    true
                } else {
                    false
                }
            })
            .unwrap_or(false);
        if began {
            self.changed.notify_one();
        }
    }
}

/// Resolves when the connection overstays its phase's deadline, with the phase.
async fn watchdog(activity: &Activity, limits: &Limits) -> Closed {
    loop {
        let (phase, since) = activity.get();
        let (limit, why) = match phase {
            Phase::Expired(why) => return why,
            Phase::Idle => (limits.idle_timeout, Closed::Idle),
            Phase::Head => (limits.header_timeout, Closed::Header),
            Phase::Busy => {
                activity.changed.notified().await;
                continue;
            }
        };
        let deadline = since + limit;
        if Instant::now() >= deadline {
            return why;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = activity.changed.notified() => {}
        }
    }
}

/// The connection's stream, noting when request bytes arrive.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.activity.bytes_arrived();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that must arrive whole before its deadline; past it, reading fails and
/// the connection is closed. Its bytes take their share of the [`BODY_BUDGET`] as they
/// arrive.
struct Deadline<B> {
    inner: B,
    sleep: Pin<Box<tokio::time::Sleep>>,
    activity: Arc<Activity>,
    share: Option<Share>,
}

type Acquiring = Pin<
    Box<
        dyn Future<Output = Result<tokio::sync::OwnedSemaphorePermit, tokio::sync::AcquireError>>
            + Send,
    >,
>;

/// One body's share of the budget: the permits it holds (shared with its request, which
/// keeps them until the answer is ready), and a frame waiting for more.
struct Share {
    budget: Arc<tokio::sync::Semaphore>,
    held: Arc<Mutex<Vec<tokio::sync::OwnedSemaphorePermit>>>,
    received: u64,
    units: u64,
    waiting: Option<(http_body::Frame<Bytes>, Acquiring)>,
}

impl Share {
    /// Takes budget for `frame`: `Some(frame)` when it may pass now; otherwise it waits
    /// in `waiting`.
    fn admit(&mut self, frame: http_body::Frame<Bytes>) -> Option<http_body::Frame<Bytes>> {
        self.received += frame.data_ref().map_or(0, |d| d.len() as u64);
        let total = (BODY_BUDGET as u64) / UNIT;
        let need = self
            .received
            .div_ceil(UNIT)
            .min(total)
            .saturating_sub(self.units);
        if need == 0 {
            return Some(frame);
        }
        self.units += need;
        let n = u32::try_from(need).unwrap_or(u32::MAX);
        match self.budget.clone().try_acquire_many_owned(n) {
            Ok(permit) => {
                self.keep(permit);
                Some(frame)
            }
            Err(_) => {
                let acquiring = Box::pin(self.budget.clone().acquire_many_owned(n));
                self.waiting = Some((frame, acquiring));
                None
            }
        }
    }

    fn keep(&self, permit: tokio::sync::OwnedSemaphorePermit) {
        if let Ok(mut h) = self.held.lock() {
            h.push(permit);
        }
    }
}

/// An answer's body, holding its request's share of the budget until it is written or
/// dropped.
struct Holding<B> {
    inner: B,
    _held: Arc<Mutex<Vec<tokio::sync::OwnedSemaphorePermit>>>,
}

impl<B: HttpBody + Unpin> HttpBody for Holding<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The error of a body that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyTimedOut;

impl<B> HttpBody for Deadline<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        loop {
            // A frame that waits for budget passes once it has it.
            if let Some(share) = this.share.as_mut()
                && let Some((_, acquiring)) = share.waiting.as_mut()
            {
                match acquiring.as_mut().poll(cx) {
                    Poll::Ready(Ok(permit)) => {
                        share.keep(permit);
                        if let Some((frame, _)) = share.waiting.take() {
                            return Poll::Ready(Some(Ok(frame)));
                        }
                    }
                    Poll::Ready(Err(_)) => {
                        share.waiting = None;
                        return Poll::Ready(Some(Err(BodyTimedOut.into())));
                    }
                    Poll::Pending => break,
                }
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match this.share.as_mut() {
                    None => return Poll::Ready(Some(Ok(frame))),
                    Some(share) => match share.admit(frame) {
                        Some(frame) => return Poll::Ready(Some(Ok(frame))),
                        None => continue,
                    },
                },
                Poll::Ready(other) => return Poll::Ready(other.map(|f| f.map_err(Into::into))),
                Poll::Pending => break,
            }
        }
        if this.sleep.as_mut().poll(cx).is_ready() {
            this.activity.set(Phase::Expired(Closed::Body));
            return Poll::Ready(Some(Err(BodyTimedOut.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
