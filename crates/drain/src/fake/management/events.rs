//! events.k8s.io/v1 Events on the fake management API. Their create and patch routes and the Events held
//! belong here (merged into the fake's router by `mod.rs`); the authorization in front of them is the shared
//! one (a request the shipped RBAC does not grant is refused 403 before it reaches a route).

use axum::Router;

use super::Shared;

/// The Events the fake holds.
#[derive(Debug, Default)]
pub(super) struct Events {}

/// The Event routes.
pub(super) fn routes() -> Router<Shared> {
    Router::new()
}
