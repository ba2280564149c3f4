//! The one HTTP-level refusal on the hook port, for hook routes and agent routes alike: a status, the body
//! `{"message":…,"status":"Failure"}` (`application/json`), and the headers some statuses need (`Allow` on
//! 405, `WWW-Authenticate: Bearer` on an agent's 401). A hook's own `Failure` answer (HTTP 200) is not one of
//! these: that is `hooks::failure`.

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// A request refused before (or instead of) an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct HttpError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What the body's `message` says; names the problem for the caller.
    pub message: String,
    /// Headers added to the refusal.
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl HttpError {
    /// A refusal with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    /// The same refusal with one more header.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "status": "Failure", "message": self.message }).to_string();
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        for (name, value) in self.headers {
            response.headers_mut().insert(name, value);
        }
        response
    }
}
