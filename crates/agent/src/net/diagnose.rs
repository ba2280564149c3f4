//! Why the agent cannot work with its server, in words an operator can act on. Each failed exchange is put in
//! one class — `tls` (the server's certificate: unknown CA, wrong name, expired), `auth` (the server refused the
//! token, with its reason), `protocol` (the URL does not lead to the agent API: the health or metrics port,
//! another plain-HTTP service, a 404), `config` (the token file), `server` (5xx) or `network` (nothing
//! answered) — and logged as one line with the fix. Configuration the agent can never recover from by itself
//! is an ERROR; network and server trouble is a WARN. Either way the agent keeps retrying with back-off: the
//! operator may fix the server side (a token line, a certificate) without touching the node.
//!
//! A TLS handshake that fails because the peer does not speak TLS is followed by one plain-HTTP probe of the
//! same address, to tell our own health or metrics port from any other plain-HTTP service.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::net::client::{ClientError, TransportKind};

/// Longest the plain-HTTP probe of a non-TLS peer may take (connect, request and answer).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Most bytes of a probe answer read.
const PROBE_MAX_BYTES: usize = 64 * 1024;

/// How bad a failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    /// The node's or the server's configuration is wrong: nothing changes until someone fixes it.
    Error,
    /// It may pass by itself (network, server restarting).
    Warn,
}

/// One failure, explained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Diagnosis {
    /// `tls`, `auth`, `protocol`, `config`, `server` or `network`.
    pub class: &'static str,
    /// The log line's message: one distinct sentence per kind of failure.
    pub summary: &'static str,
    /// What to do about it.
    pub fix: &'static str,
    /// How loud.
    pub severity: Severity,
}

const fn diagnosis(
    class: &'static str,
    summary: &'static str,
    fix: &'static str,
    severity: Severity,
) -> Diagnosis {
    Diagnosis {
        class,
        summary,
        fix,
        severity,
    }
}

/// What answered a plain-HTTP probe of the server's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// The inplace-updater health port (`/healthz` answers `ok`).
    HealthPort,
    /// The inplace-updater metrics port (`/metrics` shows `inplace_updater_` series).
    MetricsPort,
    /// Some other plain-HTTP service.
    PlainHttp,
    /// No HTTP answer.
    Nothing,
}

/// Explains a failed exchange with the server at `server` (the `--server` URL).
pub(crate) async fn diagnose(error: &ClientError, server: &str) -> Diagnosis {
    use Severity::Error;
    match error {
        ClientError::Setup(_) => diagnosis(
            "config",
            "the agent's server settings are unusable",
            "correct --server, --ca-file or --tls-server-name",
            Error,
        ),
        ClientError::Token { .. } => diagnosis(
            "config",
            "the token file is unusable",
            "put the token printed by `inplace-updater token create` into --token-file",
            Error,
        ),
        ClientError::Transport { kind, .. } => match kind {
            TransportKind::UnknownCa => diagnosis(
                "tls",
                "tls: the server's certificate is not signed by the CA in --ca-file",
                "give --ca-file the CA that signed the server's serving certificate (the ca.crt of its certificate Secret), or correct --server if it points at another HTTPS service",
                Error,
            ),
            TransportKind::NameMismatch => diagnosis(
                "tls",
                "tls: the server's certificate is not valid for the name in --server",
                "use a --server host name that is among the serving certificate's DNS names (or IPs), or set --tls-server-name to one of them",
                Error,
            ),
            TransportKind::CertificateExpired => diagnosis(
                "tls",
                "tls: the server's certificate has expired or is not valid yet",
                "renew the server's serving certificate (cert-manager renews it when it runs), and check this node's clock",
                Error,
            ),
            TransportKind::Certificate => diagnosis(
                "tls",
                "tls: the server's certificate was refused",
                "check the serving certificate and --ca-file (the error names the problem)",
                Error,
            ),
            TransportKind::NotTls | TransportKind::HandshakeClosed => match probe(server).await {
                Probe::HealthPort => diagnosis(
                    "protocol",
                    "protocol: --server points at the inplace-updater health port, not the hook port",
                    "use the server's hook port (HTTPS, --listen, 9443 by default; the Service's 443)",
                    Error,
                ),
                Probe::MetricsPort => diagnosis(
                    "protocol",
                    "protocol: --server points at the inplace-updater metrics port, not the hook port",
                    "use the server's hook port (HTTPS, --listen, 9443 by default; the Service's 443)",
                    Error,
                ),
                Probe::PlainHttp => diagnosis(
                    "protocol",
                    "protocol: --server points at a plain-HTTP port; the agent API is HTTPS only",
                    "use the https:// URL of the server's hook port (--listen, 9443 by default)",
                    Error,
                ),
                Probe::Nothing if *kind == TransportKind::NotTls => diagnosis(
                    "protocol",
                    "protocol: the server does not speak TLS",
                    "point --server at the server's hook port (HTTPS, 9443 by default)",
                    Error,
                ),
                Probe::Nothing => network(),
            },
            TransportKind::Connect | TransportKind::Other => network(),
        },
        ClientError::Timeout(_) => network(),
        ClientError::Status {
            status, message, ..
        } => status_diagnosis(*status, message),
        ClientError::Decode { .. } => diagnosis(
            "protocol",
            "protocol: the server's answer is not the agent protocol",
            "point --server at the inplace-updater hook port, and run agent and server of the same release",
            Error,
        ),
    }
}

fn network() -> Diagnosis {
    diagnosis(
        "network",
        "network: server unreachable; retrying",
        "nothing, if the server is restarting or the network is down for a moment; otherwise check that --server's host and port are reachable from this node",
        Severity::Warn,
    )
}

fn status_diagnosis(status: u16, message: &str) -> Diagnosis {
    use Severity::{Error, Warn};
    match status {
        401 if message.contains("expired") => diagnosis(
            "auth",
            "auth: the server refused the token: it has expired",
            "create a new token (`inplace-updater token create`), replace its line in the server's --agent-tokens file and put it in --token-file",
            Error,
        ),
        401 if message.starts_with("token revoked") => diagnosis(
            "auth",
            "auth: the server refused the token: it was revoked",
            "put a current token in --token-file (`inplace-updater token create` prints one and its line for --agent-tokens)",
            Error,
        ),
        401 if message.contains("missing") => diagnosis(
            "auth",
            "auth: the server received no token",
            "put the token printed by `inplace-updater token create` into --token-file",
            Error,
        ),
        401 => diagnosis(
            "auth",
            "auth: the server refused the token: it is not in the server's token file",
            "add the token's line to the server's --agent-tokens file, or put a token that is there into --token-file (a token removed from the file before the server started also shows as unknown)",
            Error,
        ),
        403 => diagnosis(
            "auth",
            "auth: the token does not cover this Machine",
            "give this node a token of its own cluster or Machine, or correct --machine / --provider-id",
            Error,
        ),
        404 => diagnosis(
            "protocol",
            "protocol: the server has no agent API at this URL (404)",
            "point --server at the inplace-updater hook port with no path (or the path prefix of a proxy in front of it)",
            Error,
        ),
        500..=599 => diagnosis(
            "server",
            "server: the server could not answer; retrying",
            "nothing if it passes; otherwise see the server's log (store unavailable?)",
            Warn,
        ),
        _ => diagnosis(
            "protocol",
            "protocol: the server refused the request",
            "run agent and server of the same release; the server's message says what it refused",
            Warn,
        ),
    }
}

/// `host:port` of an `https://` URL (443 when the URL names none).
fn authority(server: &str) -> Option<String> {
    let uri: hyper::Uri = server.parse().ok()?;
    let authority = uri.authority()?;
    Some(format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(443)
    ))
}

/// One plain-HTTP GET; the status and body of whatever HTTP answer came back.
async fn plain_get(address: &str, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        while answer.len() < PROBE_MAX_BYTES {
            let read = stream.read(&mut chunk).await.ok()?;
            if read == 0 {
                break;
            }
            answer.extend_from_slice(&chunk[..read]);
        }
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text
            .strip_prefix("HTTP/1.")?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default();
        Some((status, body))
    };
    tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .ok()
        .flatten()
}

async fn probe(server: &str) -> Probe {
    let Some(address) = authority(server) else {
        return Probe::Nothing;
    };
    let health = plain_get(&address, "/healthz").await;
    if let Some((200, body)) = &health
        && body.trim() == "ok"
    {
        return Probe::HealthPort;
    }
    let metrics = plain_get(&address, "/metrics").await;
    if let Some((200, body)) = &metrics
        && body.contains("inplace_updater_")
    {
        return Probe::MetricsPort;
    }
    if health.is_some() || metrics.is_some() {
        Probe::PlainHttp
    } else {
        Probe::Nothing
    }
}

/// One line per failed attempt: what kind of failure, the error, the fix, and when the next try is.
pub(crate) async fn log_failure(error: &ClientError, server: &str, delay: Duration) {
    let diagnosis = diagnose(error, server).await;
    let delay_ms = delay.as_millis() as u64;
    macro_rules! line {
        ($level:ident) => {
            tracing::$level!(
                class = diagnosis.class,
                error = %error,
                fix = diagnosis.fix,
                retry_in_ms = delay_ms,
                "{}",
                diagnosis.summary
            )
        };
    }
    match diagnosis.severity {
        Severity::Error => line!(error),
        Severity::Warn => line!(warn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_the_server_gives_has_its_own_line() {
        let messages = [
            (401, "token expired at 2026-01-01T00:00:00Z"),
            (
                401,
                "token revoked: its line was removed from the server's token file",
            ),
            (401, "unknown or revoked token"),
            (401, "missing `Authorization: Bearer <token>` header"),
            (
                403,
                "this token is scoped to cluster a/b; it does not cover machine a/c",
            ),
            (404, "no such endpoint: /agent/v1/poll"),
            (503, "store: unavailable"),
        ];
        let summaries: std::collections::BTreeSet<_> = messages
            .iter()
            .map(|(status, message)| status_diagnosis(*status, message).summary)
            .collect();
        assert_eq!(summaries.len(), messages.len(), "{summaries:?}");
        assert_eq!(status_diagnosis(503, "x").severity, Severity::Warn);
        assert_eq!(status_diagnosis(401, "x").severity, Severity::Error);
    }

    #[test]
    fn the_probe_address_comes_from_the_url() {
        assert_eq!(
            authority("https://updater.example:9443/prefix").as_deref(),
            Some("updater.example:9443")
        );
        assert_eq!(
            authority("https://updater.example").as_deref(),
            Some("updater.example:443")
        );
        assert_eq!(
            authority("https://[::1]:9443").as_deref(),
            Some("[::1]:9443")
        );
    }
}
