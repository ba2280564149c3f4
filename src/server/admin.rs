//! The plaintext admin ports: `/healthz` and `/readyz` on the health port, `/metrics` on the metrics port.
//! Readiness is a flag flipped when start-up work is done (certificates loaded, listener bound) and
//! dropped again when shutdown begins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::metrics::Metrics;

/// Shared readiness flag.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the server ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    /// Whether the server is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Router of the health port.
pub fn health_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(readiness): State<Readiness>| async move {
                if readiness.get() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            }),
        )
        .with_state(readiness)
}

/// Router of the metrics port.
pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(metrics): State<Arc<Metrics>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.encode(),
                )
                    .into_response()
            }),
        )
        .with_state(metrics)
}

/// Header of every `/status` answer: how many CanUpdateMachine, CanUpdateMachineSet and UpdateMachine calls
/// this process has answered since it started (`status` explains a zero: CAPI may not be calling at all).
pub const HOOK_CALLS_ANSWERED_HEADER: &str = "inplace-updater-hook-calls-answered";

/// `GET /status` on the health port: every recorded update with its current step and message (what
/// `inplace-updater status` prints). No secrets: runs are shown by machine, step description and message.
/// `GET /status/agents`: every agent seen or refused (what `inplace-updater status --agents` prints); refusals
/// show the reason, the answer and the peer address, never a token. `GET /status/retention`: what the last
/// retention sweep deleted and the bounds (the last line of `inplace-updater status`). `GET /status/budget`: the
/// update budget (limit, holders, Machines waiting; the line before it). `GET /status/events`: the Events written
/// to the management cluster and those dropped, by why (the line after it).
pub fn status_router(
    dispatcher: Arc<crate::dispatch::Dispatcher>,
    metrics: Arc<Metrics>,
) -> Router {
    Router::new()
        .route(
            "/status",
            get(
                |State((dispatcher, metrics)): State<(
                    Arc<crate::dispatch::Dispatcher>,
                    Arc<Metrics>,
                )>| async move {
                    match dispatcher.fleet.status().await {
                        Ok(rows) => (
                            [(
                                HOOK_CALLS_ANSWERED_HEADER,
                                metrics.decision_calls().to_string(),
                            )],
                            axum::Json(rows),
                        )
                            .into_response(),
                        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n"))
                            .into_response(),
                    }
                },
            ),
        )
        .route(
            "/status/retention",
            get(
                |State((dispatcher, _)): State<(
                    Arc<crate::dispatch::Dispatcher>,
                    Arc<Metrics>,
                )>| async move {
                    match dispatcher.retention().await {
                        Ok(record) => axum::Json(record).into_response(),
                        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n"))
                            .into_response(),
                    }
                },
            ),
        )
        .route(
            "/status/changes",
            get(
                |State((dispatcher, _)): State<(
                    Arc<crate::dispatch::Dispatcher>,
                    Arc<Metrics>,
                )>| async move {
                    match dispatcher.changes.list().await {
                        Ok(rows) => axum::Json(rows).into_response(),
                        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n"))
                            .into_response(),
                    }
                },
            ),
        )
        .route(
            "/status/budget",
            get(
                |State((dispatcher, _)): State<(
                    Arc<crate::dispatch::Dispatcher>,
                    Arc<Metrics>,
                )>| async move {
                    match dispatcher.budget.status().await {
                        Ok(status) => axum::Json(status).into_response(),
                        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n"))
                            .into_response(),
                    }
                },
            ),
        )
        .route(
            "/status/events",
            get(
                |State((dispatcher, metrics)): State<(
                    Arc<crate::dispatch::Dispatcher>,
                    Arc<Metrics>,
                )>| async move {
                    axum::Json(crate::mgmt::events::metrics::EventsStatus::of(
                        dispatcher.events_connected(),
                        &metrics.events,
                    ))
                },
            ),
        )
        .route(
            "/status/guards",
            get(
                |State((dispatcher, _)): State<(
                    Arc<crate::dispatch::Dispatcher>,
                    Arc<Metrics>,
                )>| async move {
                    match dispatcher.remediation_guards().await {
                        Ok(rows) => axum::Json(rows).into_response(),
                        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n"))
                            .into_response(),
                    }
                },
            ),
        )
        .route(
            "/status/agents",
            get(
                |State((dispatcher, _)): State<(
                    Arc<crate::dispatch::Dispatcher>,
                    Arc<Metrics>,
                )>| async move {
                    match dispatcher.agents.list().await {
                        Ok(rows) => axum::Json(rows).into_response(),
                        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {err}\n"))
                            .into_response(),
                    }
                },
            ),
        )
        .with_state((dispatcher, metrics))
}
