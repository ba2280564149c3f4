//! The agent API under `/agent/v1/` on the hook port: the bearer token read from the request (checked by
//! `dispatch::upkeep::tokens`), body limits, JSON decoding that names the bad field, and the mapping of
//! dispatch's answers to HTTP statuses the agent understands
//! (401 no/unknown/expired token, 403 outside the token's scope, 409 stale run, 400 bad body, 408 body too
//! slow, 413 body too large, 503 store down). Every 401 and 403 is handed to dispatch's refusal tracking with
//! the Machine the request claimed (read from its body, best effort) and the peer address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use inplace_agent_api::{
    AckResponse, AgentIdentity, BINARY_PATH, CA_PATH, INVENTORY_PATH, InventoryReport,
    MAX_REQUEST_BODY_BYTES, MAX_WAIT_SECONDS, POLL_GRACE_SECONDS, POLL_PATH, PollRequest,
    REPORT_PATH, StepReport,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tower_http::timeout::TimeoutLayer;

use super::error::HttpError;
use super::listener::ConnInfo;
use super::state::AppState;
use crate::dispatch::upkeep::tokens::verify::{TokenRefusal, Verified, verify};
use crate::dispatch::upkeep::tokens::{AgentRefusalReason, AuthError};
use crate::dispatch::{DispatchError, Dispatcher};

/// Ceiling on any agent request: the longest poll plus the grace agents allow for it.
pub const MAX_AGENT_REQUEST_TIME: Duration =
    Duration::from_secs((MAX_WAIT_SECONDS + POLL_GRACE_SECONDS) as u64);
/// Longest an agent may take to send its request body (at most 64 KiB); then 408.
pub const AGENT_BODY_READ_TIME: Duration = Duration::from_secs(10);
/// Longest the body of a request refused for its token is waited for, to learn which Machine it claims.
pub const REFUSED_BODY_READ_TIME: Duration = Duration::from_secs(2);
/// Longest `Authorization` header value considered.
pub const MAX_TOKEN_BYTES: usize = 512;

/// The agent endpoints.
pub fn agent_router(state: AppState) -> Router {
    Router::new()
        .route(POLL_PATH, post(poll))
        .route(REPORT_PATH, post(report))
        .route(INVENTORY_PATH, post(inventory))
        .route(BINARY_PATH, get(binary))
        .route(CA_PATH, get(ca_bundle))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            MAX_AGENT_REQUEST_TIME,
        ))
        .with_state(state)
}

impl HttpError {
    /// The status a dispatch error is answered with.
    fn status_of(err: &DispatchError) -> StatusCode {
        // Exhaustive, so a new kind of error is sorted here; 503 exactly when the store is to blame (a test
        // holds `DispatchError::is_the_stores` to the same sorting).
        match err {
            DispatchError::Forbidden(_) => StatusCode::FORBIDDEN,
            DispatchError::Conflict(_) => StatusCode::CONFLICT,
            DispatchError::BadRequest(_) => StatusCode::BAD_REQUEST,
            DispatchError::Store(_)
            | DispatchError::Contention(_)
            | DispatchError::Corrupt { .. }
            | DispatchError::Format { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<DispatchError> for HttpError {
    fn from(err: DispatchError) -> Self {
        HttpError::new(HttpError::status_of(&err), err.to_string())
    }
}

/// An agent request body: each says which agent sends it.
trait Claimant {
    /// The route's name in logs.
    const ROUTE: &'static str;
    fn agent(&self) -> &AgentIdentity;
}

impl Claimant for PollRequest {
    const ROUTE: &'static str = "poll";
    fn agent(&self) -> &AgentIdentity {
        &self.agent
    }
}

impl Claimant for StepReport {
    const ROUTE: &'static str = "step report";
    fn agent(&self) -> &AgentIdentity {
        &self.agent
    }
}

impl Claimant for InventoryReport {
    const ROUTE: &'static str = "inventory report";
    fn agent(&self) -> &AgentIdentity {
        &self.agent
    }
}

/// An authenticated, decoded agent request.
struct Accepted<T> {
    token: Verified,
    dispatcher: Arc<Dispatcher>,
    body: T,
    peer: Option<SocketAddr>,
}

impl<T> Accepted<T> {
    /// The refusal for a dispatch error; a 403 is also counted and logged as a refused agent.
    async fn refusal(&self, agent: &AgentIdentity, err: DispatchError) -> HttpError
    where
        T: Claimant,
    {
        // A poll logs its own failed store calls, with their keys (`StoreFailures::noted`).
        if err.is_the_stores() && T::ROUTE != PollRequest::ROUTE {
            self.dispatcher.agents.answered_unavailable(T::ROUTE, &err);
        }
        if let DispatchError::Forbidden(message) = &err {
            self.dispatcher
                .agents
                .refusals
                .refused(
                    Some(agent),
                    AgentRefusalReason::OutOfScope,
                    message,
                    self.peer,
                )
                .await;
        }
        HttpError::from(err)
    }
}

/// Whether the request's `Content-Length` is over [`MAX_REQUEST_BODY_BYTES`].
fn declared_too_large(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|length| length > MAX_REQUEST_BODY_BYTES)
}

/// Which agent a refused request says it is, from its body (best effort: bounded in size and time).
async fn claimed_agent(request: Request) -> Option<AgentIdentity> {
    #[derive(Deserialize)]
    struct Claimed {
        agent: AgentIdentity,
    }
    if declared_too_large(&request) {
        return None;
    }
    let body = tokio::time::timeout(
        REFUSED_BODY_READ_TIME,
        axum::body::to_bytes(request.into_body(), MAX_REQUEST_BODY_BYTES),
    )
    .await
    .ok()?
    .ok()?;
    serde_json::from_slice::<Claimed>(&body)
        .ok()
        .map(|claimed| claimed.agent)
}

/// The 401 for a refused token, counted and logged as a refused agent.
async fn unauthorized(
    dispatcher: &Dispatcher,
    claimed: Option<&AgentIdentity>,
    err: &AuthError,
    peer: Option<SocketAddr>,
) -> HttpError {
    let message = err.to_string();
    dispatcher
        .agents
        .refusals
        .refused(claimed, err.refusal_reason(), &message, peer)
        .await;
    HttpError::new(StatusCode::UNAUTHORIZED, message)
        .with_header(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))
}

/// The bearer token of an `Authorization` header value (none: no header, no `Bearer ` prefix, an empty
/// token, or a value over [`MAX_TOKEN_BYTES`]).
fn bearer_token(header: Option<&str>) -> Option<&str> {
    header
        .filter(|h| h.len() <= MAX_TOKEN_BYTES)
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The request's verified bearer token, or the 401 (recorded as a refusal, with the Machine its body claims).
async fn authenticate(
    state: &AppState,
    request: Request,
) -> Result<(Verified, Request), HttpError> {
    let dispatcher = &state.engine.dispatcher;
    let peer = request.extensions().get::<ConnInfo>().map(|info| info.peer);
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok());
    let verified = match bearer_token(header) {
        Some(token) => verify(&state.tokens, &dispatcher.upkeep.tokens, token).await,
        None => Err(AuthError::Missing.into()),
    };
    match verified {
        Ok(token) => Ok((token, request)),
        Err(TokenRefusal::Refused(err)) => {
            let claimed = claimed_agent(request).await;
            Err(unauthorized(dispatcher, claimed.as_ref(), &err, peer).await)
        }
        Err(TokenRefusal::Store(err)) => {
            dispatcher.agents.answered_unavailable("token check", &err);
            Err(HttpError::from(err))
        }
    }
}

/// Authenticates, reads and decodes an agent request.
async fn accept<T: DeserializeOwned + Claimant>(
    state: &AppState,
    request: Request,
) -> Result<Accepted<T>, HttpError> {
    let dispatcher = state.engine.dispatcher.clone();
    let peer = request.extensions().get::<ConnInfo>().map(|info| info.peer);
    let (token, request) = authenticate(state, request).await?;
    let too_large = || {
        HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("agent request bodies are limited to {MAX_REQUEST_BODY_BYTES} bytes"),
        )
    };
    if declared_too_large(&request) {
        return Err(too_large());
    }
    // Without its own deadline a trickling body was only stopped by the route's timeout, answered 504.
    let body: Bytes = tokio::time::timeout(
        AGENT_BODY_READ_TIME,
        axum::body::to_bytes(request.into_body(), MAX_REQUEST_BODY_BYTES),
    )
    .await
    .map_err(|_| {
        HttpError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request body not received within {}s",
                AGENT_BODY_READ_TIME.as_secs()
            ),
        )
    })?
    .map_err(|_| too_large())?;
    let body: T = decode_agent_body(&body)
        .map_err(|err| HttpError::new(StatusCode::BAD_REQUEST, err.to_string()))?;
    match token
        .check_retired(&dispatcher.upkeep.tokens, body.agent())
        .await
    {
        Ok(()) => {}
        Err(TokenRefusal::Refused(err)) => {
            return Err(unauthorized(&dispatcher, Some(body.agent()), &err, peer).await);
        }
        Err(TokenRefusal::Store(err)) => {
            dispatcher.agents.answered_unavailable("token check", &err);
            return Err(HttpError::from(err));
        }
    }
    Ok(Accepted {
        token,
        dispatcher,
        body,
        peer,
    })
}

/// An agent request body that is not the expected JSON: where decoding stopped and what serde said.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode the body: {0}")]
pub struct AgentBodyError(pub String);

/// Decodes an agent request body (poll, report or inventory), naming the field that is wrong. The routes
/// and the agent_api fuzz target share it.
pub fn decode_agent_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, AgentBodyError> {
    crate::api::decode_json(body).map_err(AgentBodyError)
}

fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(err) => HttpError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the answer: {err}"),
        )
        .into_response(),
    }
}

async fn poll(State(state): State<AppState>, request: Request) -> Result<Response, HttpError> {
    let accepted: Accepted<PollRequest> = accept(&state, request).await?;
    let agents = &accepted.dispatcher.agents;
    let tokens = &accepted.dispatcher.upkeep.tokens;
    let body = &accepted.body;
    // Only agents that send their facts know what to do with a successor token.
    let offer = match &body.facts {
        Some(_) => match accepted.token.offer(tokens, &body.agent).await {
            Ok(offer) => offer,
            Err(err) => {
                tracing::warn!(agent = %body.agent, error = %err, "no successor token offered");
                None
            }
        },
        None => None,
    };
    // With a successor to hand over, or one used for the first time, the poll answers at once rather than
    // waiting: the agent keeps (or promotes) it without waiting out a long-poll.
    let quick;
    let asked = if offer.is_some() || accepted.token.first_use {
        quick = PollRequest {
            wait_seconds: 0,
            ..body.clone()
        };
        &quick
    } else {
        body
    };
    let mut answer = match agents.poll(&accepted.token.scope, asked).await {
        Ok(answer) => answer,
        Err(err) => return Err(accepted.refusal(&body.agent, err).await),
    };
    if let Some(offer) = offer {
        tracing::info!(agent = %body.agent, expires_unix = offer.expires_unix, "successor token offered");
        answer.token = Some(offer);
    }
    if let Some(plan) = &answer.plan {
        tracing::info!(agent = %body.agent, run = %plan.id.chars().take(12).collect::<String>(), steps = plan.steps.len(), "plan handed to agent");
    }
    Ok(json(&answer))
}

async fn report(State(state): State<AppState>, request: Request) -> Result<Response, HttpError> {
    let accepted: Accepted<StepReport> = accept(&state, request).await?;
    let body = &accepted.body;
    let hold = match accepted
        .dispatcher
        .agents
        .report(&accepted.token.scope, body)
        .await
    {
        Ok(hold) => hold,
        Err(err) => return Err(accepted.refusal(&body.agent, err).await),
    };
    tracing::info!(
        agent = %body.agent,
        run = %body.plan_id.chars().take(12).collect::<String>(),
        step = body.step_index,
        status = ?body.status,
        attempt = body.attempt,
        "step report"
    );
    Ok(json(&AckResponse { hold }))
}

async fn inventory(State(state): State<AppState>, request: Request) -> Result<Response, HttpError> {
    let accepted: Accepted<InventoryReport> = accept(&state, request).await?;
    let body = &accepted.body;
    if let Err(err) = accepted
        .dispatcher
        .agents
        .inventory(&accepted.token.scope, body)
        .await
    {
        return Err(accepted.refusal(&body.agent, err).await);
    }
    Ok(json(&AckResponse::default()))
}

/// Header carrying the SHA-256 of the agent executable served at [`BINARY_PATH`].
pub const SHA256_HEADER: &str = "x-inplace-sha256";

/// `GET /agent/v1/binary`: the agent executable this server hands out (404 without one).
async fn binary(State(state): State<AppState>, request: Request) -> Result<Response, HttpError> {
    authenticate(&state, request).await?;
    let Some(image) = state.agent_image.clone() else {
        return Err(HttpError::new(
            StatusCode::NOT_FOUND,
            "this server hands out no agent executable (no --agent-binary, and no inplace-agent beside it)",
        ));
    };
    let sha = HeaderValue::from_str(&image.sha256)
        .map_err(|_| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, "bad digest"))?;
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::HeaderName::from_static(SHA256_HEADER), sha),
        ],
        image.bytes.clone(),
    )
        .into_response())
}

/// `GET /agent/v1/ca`: the CA bundle agents should trust, to any authenticated agent (a CA certificate is
/// no secret; the token keeps strangers from probing). 404 when none is configured or none passed the checks.
async fn ca_bundle(State(state): State<AppState>, request: Request) -> Result<Response, HttpError> {
    authenticate(&state, request).await?;
    let Some(bundle) = state.engine.dispatcher.upkeep.served_ca.current() else {
        return Err(HttpError::new(
            StatusCode::NOT_FOUND,
            "this server hands out no CA bundle (serve --agent-ca-bundle)",
        ));
    };
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-pem-file".to_owned()),
            (header::ETAG, format!("\"{}\"", bundle.sha256)),
        ],
        bundle.pem,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_token_is_read_from_the_header_or_the_request_is_refused_as_missing() {
        assert_eq!(bearer_token(Some("Bearer iu1_abc")), Some("iu1_abc"));
        assert_eq!(bearer_token(Some("Bearer  iu1_abc ")), Some("iu1_abc"));
        assert_eq!(bearer_token(None), None, "no header");
        assert_eq!(bearer_token(Some("iu1_abc")), None, "no Bearer prefix");
        assert_eq!(bearer_token(Some("Bearer ")), None, "empty token");
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES));
        assert_eq!(bearer_token(Some(&long)), None, "over MAX_TOKEN_BYTES");
    }

    #[test]
    fn an_error_is_answered_503_exactly_when_the_store_is_to_blame() {
        let every = [
            DispatchError::Store(inplace_store::StoreError::Backend("down".into())),
            DispatchError::Corrupt {
                key: "k".into(),
                detail: "d".into(),
            },
            DispatchError::Contention("k".into()),
            DispatchError::Forbidden("f".into()),
            DispatchError::Conflict("c".into()),
            DispatchError::BadRequest("b".into()),
            DispatchError::Format {
                found: 2,
                expected: 1,
            },
        ];
        for err in every {
            assert_eq!(
                HttpError::status_of(&err) == StatusCode::SERVICE_UNAVAILABLE,
                err.is_the_stores(),
                "{err:?}"
            );
        }
    }
}
