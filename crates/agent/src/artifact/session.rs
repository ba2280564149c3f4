//! One fetch's HTTP conversation: GETs with the registry's auth (Basic, or the Bearer token flow a 401
//! `WWW-Authenticate: Bearer realm=…,service=…,scope=…` asks for), redirects followed (credentials dropped
//! when a redirect leaves the host), every status turned into an error naming the URL.

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{
    ACCEPT, AUTHORIZATION, HeaderValue, LOCATION, RANGE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use hyper::{Response, StatusCode};
use tokio::sync::Mutex;

use super::error::FetchErrorKind;
use super::options::Credential;
use super::url_text::{authority, encode, param, resolve};
use super::{ARTIFACT_REQUEST_TIMEOUT, MAX_ARTIFACT_REDIRECTS, MAX_REGISTRY_ANSWER_BYTES};
use crate::net::client::{HttpsClient, TransportKind, error_chain, transport_kind};

/// Characters of an error answer kept in the error.
const ERROR_TEXT_KEPT: usize = 300;

/// One registry (or `https://` host) conversation.
pub(crate) struct Session<'a> {
    pub http: &'a HttpsClient,
    /// The registry's credential, if the credentials file has one.
    pub credential: Option<&'a Credential>,
    /// The registry (`host[:port]`), for the 401 hint.
    pub registry: String,
    /// The `Authorization` that last worked (Basic or a Bearer token).
    auth: Mutex<Option<HeaderValue>>,
}

impl<'a> Session<'a> {
    pub fn new(
        http: &'a HttpsClient,
        credential: Option<&'a Credential>,
        registry: String,
    ) -> Self {
        Self {
            http,
            credential,
            registry,
            auth: Mutex::new(None),
        }
    }

    /// `GET url` with `accept` and a `Range: bytes=<from>-`; answers 2xx (and 206) or an error. A 401 is
    /// answered once with the scheme the server asks for.
    pub async fn get(
        &self,
        url: &str,
        accept: Option<&str>,
        range_from: Option<u64>,
    ) -> Result<Response<Incoming>, FetchErrorKind> {
        let mut url = url.to_owned();
        let mut authenticated = false;
        let mut same_host = true;
        for _ in 0..=MAX_ARTIFACT_REDIRECTS {
            let auth = if same_host {
                self.auth.lock().await.clone()
            } else {
                None
            };
            let mut request = hyper::Request::get(&url);
            if let Some(accept) = accept {
                request = request.header(ACCEPT, accept);
            }
            if let Some(from) = range_from {
                request = request.header(RANGE, format!("bytes={from}-"));
            }
            if let Some(auth) = auth {
                request = request.header(AUTHORIZATION, auth);
            }
            let request =
                request
                    .body(Full::new(Bytes::new()))
                    .map_err(|e| FetchErrorKind::Transport {
                        url: url.clone(),
                        reason: e.to_string(),
                        transient: false,
                    })?;
            let response = self.send(&url, request).await?;
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED && same_host && !authenticated {
                authenticated = true;
                let challenge = response
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let value = self.answer(&url, &challenge).await?;
                *self.auth.lock().await = Some(value);
                continue;
            }
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let Some(location) = location else {
                    return Err(status_error(&url, response, self).await);
                };
                let next = resolve(&url, &location);
                same_host = same_host && authority(&next) == authority(&url);
                url = next;
                continue;
            }
            if status.is_success() {
                return Ok(response);
            }
            return Err(status_error(&url, response, self).await);
        }
        Err(FetchErrorKind::Status {
            url,
            status: 310,
            message: format!("more than {MAX_ARTIFACT_REDIRECTS} redirects"),
            retry_after: None,
        })
    }

    /// `GET url` and its body, at most `limit` bytes.
    pub async fn get_bytes(
        &self,
        url: &str,
        accept: Option<&str>,
        limit: usize,
    ) -> Result<Bytes, FetchErrorKind> {
        let fetch = async {
            let response = self.get(url, accept, None).await?;
            Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| FetchErrorKind::Transport {
                    url: url.to_owned(),
                    reason: format!("{e} (at most {limit} bytes)"),
                    // A broken answer may come whole next time; one over the limit never does.
                    transient: !e.is::<http_body_util::LengthLimitError>(),
                })
        };
        tokio::time::timeout(ARTIFACT_REQUEST_TIMEOUT, fetch)
            .await
            .map_err(|_| timeout(url))?
    }

    async fn send(
        &self,
        url: &str,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, FetchErrorKind> {
        tokio::time::timeout(ARTIFACT_REQUEST_TIMEOUT, self.http.request(request))
            .await
            .map_err(|_| timeout(url))?
            .map_err(|e| FetchErrorKind::Transport {
                url: url.to_owned(),
                reason: error_chain(&e),
                transient: matches!(
                    transport_kind(&e),
                    TransportKind::Connect | TransportKind::HandshakeClosed | TransportKind::Other
                ),
            })
    }

    /// The `Authorization` for a 401's `challenge`: Basic from the credential, or a Bearer token from the
    /// realm (asked with the credential, if any).
    async fn answer(&self, url: &str, challenge: &str) -> Result<HeaderValue, FetchErrorKind> {
        let unauthorized = |hint: String| FetchErrorKind::Unauthorized {
            url: url.to_owned(),
            hint,
        };
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        let mut value = if scheme.eq_ignore_ascii_case("basic") {
            let credential = self.credential.ok_or_else(|| {
                unauthorized(format!(
                    "the registry asks for Basic auth and the credentials file has no entry for {}",
                    self.registry
                ))
            })?;
            HeaderValue::from_str(&credential.basic())
                .map_err(|_| unauthorized("the credential is not a valid header value".into()))?
        } else if scheme.eq_ignore_ascii_case("bearer") {
            let token = self.token(params).await?;
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                FetchErrorKind::Token {
                    realm: param(params, "realm").unwrap_or_default(),
                    reason: "the token is not a valid header value".into(),
                    transient: false,
                }
            })?
        } else {
            return Err(unauthorized(format!("unsupported challenge {scheme:?}")));
        };
        value.set_sensitive(true);
        Ok(value)
    }

    /// The Bearer token flow: `GET realm?service=…&scope=…` (Basic credentials if any) → `token`.
    async fn token(&self, params: &str) -> Result<String, FetchErrorKind> {
        let realm = param(params, "realm").unwrap_or_default();
        let err = |reason: String| FetchErrorKind::Token {
            realm: realm.clone(),
            reason,
            transient: false,
        };
        if !realm.starts_with("https://") {
            return Err(err("the realm is not an https:// URL".into()));
        }
        let mut query = Vec::new();
        for key in ["service", "scope"] {
            if let Some(v) = param(params, key) {
                query.push(format!("{key}={}", encode(&v)));
            }
        }
        let url = if query.is_empty() {
            realm.clone()
        } else {
            format!(
                "{realm}{}{}",
                if realm.contains('?') { '&' } else { '?' },
                query.join("&")
            )
        };
        let mut request = hyper::Request::get(&url);
        if let Some(credential) = self.credential {
            let mut value = HeaderValue::from_str(&credential.basic())
                .map_err(|_| err("the credential is not a valid header value".into()))?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| err(e.to_string()))?;
        let response = self.send(&url, request).await?;
        if !response.status().is_success() {
            let status = response.status();
            let hint = if status == StatusCode::UNAUTHORIZED {
                " (check the credentials file)"
            } else {
                ""
            };
            return Err(FetchErrorKind::Token {
                realm: realm.clone(),
                reason: format!("answered {status}{hint}"),
                transient: status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS,
            });
        }
        let body = tokio::time::timeout(
            ARTIFACT_REQUEST_TIMEOUT,
            Limited::new(response.into_body(), MAX_REGISTRY_ANSWER_BYTES).collect(),
        )
        .await
        .map_err(|_| timeout(&url))?
        .map_err(|e| err(e.to_string()))?
        .to_bytes();
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Token =
            serde_json::from_slice(&body).map_err(|e| err(format!("not a token answer: {e}")))?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| err("the answer has no token".into()))
    }
}

/// The error for a non-2xx `response`, with the start of its body.
async fn status_error(
    url: &str,
    response: Response<Incoming>,
    session: &Session<'_>,
) -> FetchErrorKind {
    let status = response.status();
    let retry_after = retry_after_seconds(&response);
    let body = tokio::time::timeout(
        ARTIFACT_REQUEST_TIMEOUT,
        Limited::new(response.into_body(), MAX_REGISTRY_ANSWER_BYTES).collect(),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .map(|b| b.to_bytes())
    .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let message: String = text.trim().chars().take(ERROR_TEXT_KEPT).collect();
    let url = url.to_owned();
    match status.as_u16() {
        401 => FetchErrorKind::Unauthorized {
            hint: match session.credential {
                Some(c) => format!(
                    "the registry refused the credentials of user {:?} for {}",
                    c.username, session.registry
                ),
                None => format!("the credentials file has no entry for {}", session.registry),
            },
            url,
        },
        404 => FetchErrorKind::NotFound { url, message },
        s @ 500..=599 => FetchErrorKind::Server {
            url,
            status: s,
            message,
            retry_after,
        },
        s => FetchErrorKind::Status {
            url,
            status: s,
            message,
            retry_after,
        },
    }
}

/// An answer's `Retry-After` in seconds. Only the delta-seconds form is read: registries and their proxies
/// send that; an HTTP date is left to the back-off.
fn retry_after_seconds(response: &Response<Incoming>) -> Option<u64> {
    response
        .headers()
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn timeout(url: &str) -> FetchErrorKind {
    FetchErrorKind::Timeout {
        what: url.to_owned(),
        seconds: ARTIFACT_REQUEST_TIMEOUT.as_secs(),
    }
}
