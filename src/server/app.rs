//! The hook router: CAPI's exact paths, body and time limits, client-certificate enforcement, panic
//! capture, and one log line plus metrics per call. `app(state)` is what tests drive with `oneshot`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::TimeoutLayer;

use super::agent_routes::agent_router;
use super::error::HttpError;
use super::listener::ConnInfo;
use super::metrics::Metrics;
use super::state::AppState;
use crate::api::{Hook, parse_go_duration};
use crate::hooks::{self, Answer, Engine};

/// Largest request body accepted (CAPI's own Go server SDK uses the same cap).
pub const MAX_BODY_BYTES: usize = 20 * 1024 * 1024;
/// Timeout assumed when CAPI sends no `?timeout=` (CAPI's default handler timeout).
pub const DEFAULT_CAPI_TIMEOUT: Duration = Duration::from_secs(10);
/// Share of CAPI's timeout we allow ourselves, so the answer arrives before CAPI gives up.
pub const DEADLINE_FRACTION: f64 = 0.8;
/// Hard ceiling on any hook request, whatever `?timeout=` says (CAPI's maximum handler timeout).
pub const MAX_HOOK_TIME: Duration = Duration::from_secs(30);
/// Least time a hook request body gets to arrive, however short `?timeout=` is.
pub const MIN_BODY_READ_TIME: Duration = Duration::from_secs(1);

/// Bodies up to this size are decided on the async worker that read them; larger ones on the blocking pool.
/// A CanUpdate of this size takes about a millisecond, less than handing it to another thread and back costs
/// in latency at high call rates; a 20 MiB body takes ~100 ms and must not stall agents' long-polls meanwhile.
pub const INLINE_COMPUTE_MAX_BODY_BYTES: usize = 256 * 1024;

/// A boxed future answering a hook.
pub type AnswerFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Answer> + Send>>;

/// A hook's computation: request body in, answer out.
#[derive(Clone, Copy)]
pub enum Compute {
    /// CPU-bound work (decode, diff, patch): inline for small bodies, on the blocking pool for large ones.
    Blocking(fn(&Engine, &[u8]) -> Answer),
    /// CPU-bound judgement run like `Blocking`, whose verdict is then stored before the answer is sent
    /// (CanUpdateMachine, CanUpdateMachineSet).
    Judging(fn(&Engine, &[u8]) -> hooks::Judged),
    /// Work that waits on the store (UpdateMachine).
    Async(fn(Arc<Engine>, Bytes) -> AnswerFuture),
}

/// The hook router with every hook at CAPI's path, plus the agent API under `/agent/v1/`.
pub fn app(state: AppState) -> Router {
    let mut router = Router::new();
    for (hook, compute) in [
        (
            Hook::Discovery,
            Compute::Blocking(|_, _| hooks::discovery()),
        ),
        (
            Hook::CanUpdateMachine,
            Compute::Judging(hooks::can_update_machine),
        ),
        (
            Hook::CanUpdateMachineSet,
            Compute::Judging(hooks::can_update_machine_set),
        ),
        (
            Hook::UpdateMachine,
            Compute::Async(|engine, body| Box::pin(hooks::update_machine(engine, body))),
        ),
    ] {
        router = router.merge(hook_route(hook, compute, state.clone()));
    }
    router
        .merge(agent_router(state))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

/// One hook's route with every per-hook layer; public so tests can mount a computation of their own
/// (e.g. one that panics) behind exactly the same stack.
pub fn hook_route(hook: Hook, compute: Compute, state: AppState) -> Router {
    let metrics = state.metrics.clone();
    let panic_answer = move |_: Box<dyn std::any::Any + Send + 'static>| {
        metrics.panics.inc();
        tracing::error!(hook = hook.name(), "handler panicked; answered Failure");
        json_response(
            hooks::failure(
                hook,
                "internal error: the handler panicked (a bug: please report it)",
                "panic",
                None,
            )
            .body,
        )
    };
    Router::new()
        .route(
            hook.path(),
            post(
                move |State(state): State<AppState>,
                      RawQuery(query): RawQuery,
                      request: Request| async move {
                    handle(hook, compute, state, query, request).await
                },
            ),
        )
        .layer(CatchPanicLayer::custom(panic_answer))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            MAX_HOOK_TIME,
        ))
        .with_state(state)
}

/// Counts a call in `hook_calls_in_flight` for as long as it lives.
struct InFlight(Arc<Metrics>);

impl InFlight {
    fn enter(metrics: &Arc<Metrics>) -> Self {
        metrics.in_flight.inc();
        Self(metrics.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

fn json_response(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn too_large() -> HttpError {
    HttpError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body exceeds the {MAX_BODY_BYTES}-byte limit"),
    )
}

async fn method_not_allowed(request: Request) -> HttpError {
    HttpError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed here: hooks take POST", request.method()),
    )
    .with_header(header::ALLOW, header::HeaderValue::from_static("POST"))
}

async fn not_found(request: Request) -> HttpError {
    let path: String = request.uri().path().chars().take(200).collect();
    HttpError::new(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {path} (see /openapi.yaml in the repository for every route)"),
    )
}

/// Runs CPU-bound hook work: on the worker that read a small body (a panic caught here is answered and
/// counted exactly like one on the pool), on the blocking pool within `budget` otherwise.
async fn cpu<T: Send + 'static>(
    small: bool,
    budget: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<Result<T, String>, tokio::time::error::Elapsed> {
    if small {
        return Ok(std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
            .map_err(|_| "panicked inline".to_owned()));
    }
    tokio::time::timeout(budget, tokio::task::spawn_blocking(work))
        .await
        .map(|joined| joined.map_err(|err| err.to_string()))
}

/// The time we allow ourselves for one call, from CAPI's `?timeout=`.
fn deadline(query: Option<&str>) -> Result<Duration, String> {
    let timeout = query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("timeout="));
    let capi_timeout = match timeout {
        None => DEFAULT_CAPI_TIMEOUT,
        Some(text) => {
            parse_go_duration(text).map_err(|err| format!("query parameter `timeout`: {err}"))?
        }
    };
    Ok(capi_timeout.mul_f64(DEADLINE_FRACTION).min(MAX_HOOK_TIME))
}

/// One hook call: [`authorize`], [`read_body`], [`compute_answer`], [`record_call`], then the answer.
async fn handle(
    hook: Hook,
    compute: Compute,
    state: AppState,
    query: Option<String>,
    request: Request,
) -> Response {
    // Tokio's clock, the one the timeouts below run on (and the one a paused test runtime advances).
    let started = tokio::time::Instant::now();
    let _in_flight = InFlight::enter(&state.metrics);
    if let Err(refused) = authorize(hook, &state, &request) {
        return refused.into_response();
    }
    // Parsed once: the body read and the computation both keep to it.
    let allowed = deadline(query.as_deref());
    let body = match read_body(allowed.as_ref().ok().copied(), request).await {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
    let answer = compute_answer(hook, compute, &state, allowed, started, body).await;
    record_call(hook, &state, &answer, started.elapsed());
    json_response(answer.body)
}

/// Refuses a hook call without a verified client certificate when the server requires one (counted as
/// `Unauthorized` and logged).
fn authorize(hook: Hook, state: &AppState, request: &Request) -> Result<(), HttpError> {
    let verified = request
        .extensions()
        .get::<ConnInfo>()
        .is_some_and(|info| info.client_cert_verified);
    if state.require_client_cert && !verified {
        state
            .metrics
            .calls
            .get_or_create(&super::metrics::CallLabels {
                hook: hook.name(),
                status: "Unauthorized",
            })
            .inc();
        tracing::warn!(
            hook = hook.name(),
            "hook call without a verified client certificate refused"
        );
        return Err(HttpError::new(
            StatusCode::UNAUTHORIZED,
            "this server requires a client certificate signed by its --client-ca for hook calls",
        ));
    }
    Ok(())
}

/// The request body, at most [`MAX_BODY_BYTES`], received within the call's deadline `allowed` (at least
/// [`MIN_BODY_READ_TIME`]; CAPI's default when `?timeout=` could not be read).
async fn read_body(allowed: Option<Duration>, request: Request) -> Result<Bytes, HttpError> {
    let declared_length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared_length.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    // Chunked bodies are counted while they stream in and cut off at the limit, never buffered past it;
    // a body that trickles in is cut off at the call's deadline (a slow client cannot hold the call open).
    // A `?timeout=0ns` call still gets its body read (a zero budget refused bodies already sent with 408);
    // the computation below keeps the caller's deadline.
    let read_budget = allowed
        .unwrap_or(DEFAULT_CAPI_TIMEOUT.mul_f64(DEADLINE_FRACTION))
        .max(MIN_BODY_READ_TIME);
    match tokio::time::timeout(
        read_budget,
        axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(_)) => Err(too_large()),
        Err(_) => Err(HttpError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request body not received within {:.1}s",
                read_budget.as_secs_f64()
            ),
        )),
    }
}

/// The hook's answer within the call's deadline `allowed` (counted from `started`; an unreadable `?timeout=`
/// is answered as a bad request); a panic or a missed deadline is answered as a Failure.
async fn compute_answer(
    hook: Hook,
    compute: Compute,
    state: &AppState,
    allowed: Result<Duration, String>,
    started: tokio::time::Instant,
    body: Bytes,
) -> Answer {
    match allowed {
        Err(message) => hooks::failure(hook, message, "bad-request", None),
        Ok(allowed) => {
            // The deadline counts from the request's arrival: time spent receiving the body is spent. Without
            // this a slow body plus a slow computation outlived the route's 30 s timeout and got a 504.
            let budget = allowed.saturating_sub(started.elapsed());
            let engine = state.engine.clone();
            let small = body.len() <= INLINE_COMPUTE_MAX_BODY_BYTES;
            let work = match compute {
                Compute::Blocking(compute) => {
                    cpu(small, budget, move || compute(&engine, &body)).await
                }
                Compute::Judging(compute) => {
                    let judging = engine.clone();
                    match cpu(small, budget, move || compute(&judging, &body)).await {
                        // The verdict is stored before the answer leaves; spawned, so a caller that hangs
                        // up cannot cancel the write half-way.
                        Ok(Ok(judged)) => tokio::time::timeout(
                            allowed.saturating_sub(started.elapsed()),
                            tokio::spawn(hooks::record(engine, judged)),
                        )
                        .await
                        .map(|joined| joined.map_err(|err| err.to_string())),
                        Ok(Err(panic)) => Ok(Err(panic)),
                        Err(elapsed) => Err(elapsed),
                    }
                }
                // Spawned, so a caller that hangs up cannot cancel a store write half-way.
                Compute::Async(compute) => {
                    tokio::time::timeout(budget, tokio::spawn(compute(engine, body)))
                        .await
                        .map(|joined| joined.map_err(|err| err.to_string()))
                }
            };
            match work {
                Ok(Ok(answer)) => answer,
                Ok(Err(panic)) => {
                    state.metrics.panics.inc();
                    tracing::error!(hook = hook.name(), error = %panic, "handler panicked; answered Failure");
                    hooks::failure(
                        hook,
                        "internal error: the handler panicked (a bug: please report it)",
                        "panic",
                        None,
                    )
                }
                Err(_) => hooks::failure(
                    hook,
                    format!(
                        "no answer within {:.1}s (80% of CAPI's timeout); CAPI will call again",
                        allowed.as_secs_f64()
                    ),
                    "deadline",
                    None,
                ),
            }
        }
    }
}

/// Counts the call in the metrics and logs it (below info for UpdateMachine's in-progress repeats, a
/// warning for a Failure).
fn record_call(hook: Hook, state: &AppState, answer: &Answer, elapsed: Duration) {
    state.metrics.record_call(
        hook.name(),
        answer.status.as_str(),
        answer.verdict,
        elapsed.as_secs_f64(),
    );
    let object = answer
        .object
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    macro_rules! log_call {
        ($level:ident) => {
            tracing::$level!(
                hook = hook.name(),
                object = %object,
                status = answer.status.as_str(),
                verdict = answer.verdict,
                duration_ms = elapsed.as_secs_f64() * 1000.0,
                detail = %answer.message,
                "hook call"
            )
        };
    }
    // CAPI re-asks UpdateMachine every few seconds while an update runs: those repeats say nothing new (the
    // run's start, its steps and its end are logged where they happen), so they stay below info; so do the
    // Discovery calls after the first, whose answer is fixed (CAPI discovers again on every ExtensionConfig
    // sync). A Failure answer stops CAPI's change (or names a bug in the request): someone has to look, so it
    // is a warning.
    let repeat = match hook {
        Hook::Discovery => state.metrics.discovered_before(),
        _ => answer.verdict == hooks::VERDICT_IN_PROGRESS,
    };
    if repeat && answer.status == crate::api::Status::Success {
        log_call!(debug);
    } else if answer.status == crate::api::Status::Failure {
        log_call!(warn);
    } else {
        log_call!(info);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_inside_capi_timeout() {
        assert_eq!(deadline(Some("timeout=10s")), Ok(Duration::from_secs(8)));
        assert_eq!(deadline(None), Ok(Duration::from_secs(8)));
        assert_eq!(deadline(Some("timeout=5m")), Ok(MAX_HOOK_TIME));
        assert!(
            deadline(Some("timeout=abc"))
                .unwrap_err()
                .contains("`timeout`")
        );
    }
}
