//! CAPI's runtime client (internal/runtime/client/client.go): from an HTTP answer to a response
//! object or an error, including `failurePolicy`.

use crate::godecode::DecodeError;
use crate::wire::{ResponseObject, decode_body};

/// CAPI reads at most this much of a non-200 body (`maxExtensionResponseBodyBytes`).
pub const MAX_ERROR_BODY_BYTES: usize = 20 << 20;

/// CAPI logs at most this much of a non-200 body.
pub const LOGGED_ERROR_BODY_BYTES: usize = 512;

/// A handler's `failurePolicy` (discovery default: `Fail`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Call errors fail the caller's reconcile.
    #[default]
    Fail,
    /// Transport, non-200 and decode errors become an empty `Success`; an explicit `Failure` still fails.
    Ignore,
}

/// What came back from calling a hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookAnswer<'a> {
    /// An HTTP response.
    Http {
        /// HTTP status code; anything but 200 is an error for CAPI.
        status: u16,
        /// Response body.
        body: &'a [u8],
    },
    /// No HTTP response at all: connection refused, TLS failure, timeout.
    TransportError(&'a str),
}

impl<'a> HookAnswer<'a> {
    /// A `200 OK` with this body.
    pub fn ok(body: &'a [u8]) -> Self {
        HookAnswer::Http { status: 200, body }
    }
}

/// Why CAPI's runtime client reports a hook call as failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapiError {
    /// The extension answered `status: Failure`.
    #[error("got failure response with message: {message}")]
    Failure {
        /// The extension's `message`.
        message: String,
    },
    /// `status` was neither exactly `Success` nor exactly `Failure` (e.g. `success`, or missing).
    #[error("got unknown response status {status:?} with message: {message}")]
    UnknownStatus {
        /// The status found.
        status: String,
        /// The extension's `message`.
        message: String,
    },
    /// No usable HTTP answer: transport error or a status other than 200.
    #[error("http call failed: {0}")]
    Transport(String),
    /// A 200 body that Go's decoder rejects.
    #[error("http call failed: failed to decode response: {0}")]
    Decode(DecodeError),
    /// A discovery answer that CAPI's validation rejects (one entry per problem).
    #[error("failed to validate discovery response: [{}]", .0.join(", "))]
    InvalidDiscovery(Vec<String>),
}

/// `validateResponseStatus`: only exactly `Success` passes.
pub fn check_response_status(status: &str, message: &str) -> Result<(), CapiError> {
    match status {
        "Success" => Ok(()),
        "Failure" => Err(CapiError::Failure {
            message: message.to_string(),
        }),
        other => Err(CapiError::UnknownStatus {
            status: other.to_string(),
            message: message.to_string(),
        }),
    }
}

/// `CallExtension` for one handler: HTTP status, Go decoding, failure policy, status check.
pub(crate) fn call_extension<T: ResponseObject>(
    answer: HookAnswer<'_>,
    policy: FailurePolicy,
) -> Result<T, CapiError> {
    let (mut response, call_error) = match answer {
        HookAnswer::TransportError(e) => (T::default(), Some(CapiError::Transport(e.to_string()))),
        HookAnswer::Http { status: 200, body } => {
            let (response, error) = decode_body::<T>(body);
            (response, error.map(CapiError::Decode))
        }
        HookAnswer::Http { status, body } => (
            T::default(),
            Some(CapiError::Transport(non_200_message(status, body))),
        ),
    };
    if let Some(error) = call_error {
        if policy == FailurePolicy::Ignore {
            // Whatever a failed decode already filled in stays: only status and message are reset.
            response.set_default_success();
            return Ok(response);
        }
        return Err(error);
    }
    check_response_status(response.status(), response.message())?;
    Ok(response)
}

fn non_200_message(status: u16, body: &[u8]) -> String {
    if body.len() > MAX_ERROR_BODY_BYTES {
        return format!(
            "got response with status code {status} != 200: failed to read response body"
        );
    }
    let shown = &body[..body.len().min(LOGGED_ERROR_BODY_BYTES)];
    let ellipsis = if body.len() > LOGGED_ERROR_BODY_BYTES {
        "..."
    } else {
        ""
    };
    format!(
        "got response with status code {status} != 200: response : {:?}{ellipsis}",
        String::from_utf8_lossy(shown)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CanUpdateMachineResponse, UpdateMachineResponse};

    fn call(body: &str, policy: FailurePolicy) -> Result<UpdateMachineResponse, CapiError> {
        call_extension(HookAnswer::ok(body.as_bytes()), policy)
    }

    #[test]
    fn status_must_be_exactly_success_or_failure() {
        assert!(call(r#"{"status":"Success"}"#, FailurePolicy::Fail).is_ok());
        assert!(call(r#"{"Status":"Success"}"#, FailurePolicy::Fail).is_ok());
        assert!(matches!(
            call(r#"{"status":"success"}"#, FailurePolicy::Fail),
            Err(CapiError::UnknownStatus { .. })
        ));
        assert!(matches!(
            call("{}", FailurePolicy::Fail),
            Err(CapiError::UnknownStatus { .. })
        ));
        assert!(matches!(
            call("null", FailurePolicy::Fail),
            Err(CapiError::UnknownStatus { .. })
        ));
        let e = call(
            r#"{"status":"Failure","message":"disk full"}"#,
            FailurePolicy::Fail,
        )
        .unwrap_err();
        assert_eq!(
            e,
            CapiError::Failure {
                message: "disk full".into()
            }
        );
    }

    #[test]
    fn ignore_turns_call_errors_into_success_but_not_explicit_failure() {
        let ok = call("not json", FailurePolicy::Ignore).unwrap();
        assert_eq!((ok.status.as_str(), ok.retry_after_seconds), ("Success", 0));
        let r: UpdateMachineResponse = call_extension(
            HookAnswer::Http {
                status: 500,
                body: b"boom",
            },
            FailurePolicy::Ignore,
        )
        .unwrap();
        assert_eq!(r.status, "Success");
        let r: UpdateMachineResponse = call_extension(
            HookAnswer::TransportError("connection refused"),
            FailurePolicy::Ignore,
        )
        .unwrap();
        assert_eq!(r.message, "");
        assert!(matches!(
            call(r#"{"status":"Failure"}"#, FailurePolicy::Ignore),
            Err(CapiError::Failure { .. })
        ));
        // An unknown status is not a call error either: Ignore does not help.
        assert!(call(r#"{"status":"OK"}"#, FailurePolicy::Ignore).is_err());
    }

    #[test]
    fn ignore_keeps_what_a_failed_decode_filled_in() {
        let r = call(
            r#"{"status":"Failure","retryAfterSeconds":7,"message":5}"#,
            FailurePolicy::Ignore,
        )
        .unwrap();
        assert_eq!(
            (r.status.as_str(), r.retry_after_seconds, r.message.as_str()),
            ("Success", 7, "")
        );
        let body = br#"{"status":"Success","machinePatch":{"patchType":"JSONPatch","patch":"W10="},"bootstrapConfigPatch":{"patch":[{}]}}"#;
        let r: CanUpdateMachineResponse =
            call_extension(HookAnswer::ok(body), FailurePolicy::Ignore).unwrap();
        assert_eq!(r.machine_patch.bytes, b"[]");
        assert_eq!(r.bootstrap_config_patch.bytes, vec![0]);
    }

    #[test]
    fn non_200_is_an_error_with_a_truncated_body() {
        let long = "x".repeat(600);
        let e = call_extension::<UpdateMachineResponse>(
            HookAnswer::Http {
                status: 503,
                body: long.as_bytes(),
            },
            FailurePolicy::Fail,
        )
        .unwrap_err();
        let CapiError::Transport(msg) = e else {
            panic!("not a transport error")
        };
        assert!(
            msg.contains("503") && msg.ends_with("...") && msg.len() < 600,
            "{msg}"
        );
    }
}
