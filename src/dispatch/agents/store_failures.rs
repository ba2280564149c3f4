//! The agent requests' failed store calls, logged: a poll answers 503 when one of its store calls fails (its
//! reads, the progress it folds into its run, the upgrade it notes), and the log says which call and key failed
//! with the store's error; a step or inventory report, or a token check, that
//! fails on the store says its route and error. At most [`POLL_STORE_FAILURE_LOG_LINES_PER_MINUTE`] lines a
//! minute per replica for all of them (a fleet connecting at once against a slow store would otherwise log one
//! line per agent), then one line with the count left out.

use std::sync::{Mutex, PoisonError};

use super::refusal_book::Window;
use crate::dispatch::floor::DispatchError;

/// Most `warn` lines a replica logs per minute for failed store calls of agent requests (polls, reports, token
/// checks).
pub const POLL_STORE_FAILURE_LOG_LINES_PER_MINUTE: u32 = 60;

/// This replica's budget of log lines for failed poll store calls.
#[derive(Debug, Default)]
pub struct StoreFailures {
    lines: Mutex<Window>,
}

impl StoreFailures {
    /// Passes `result` through, logging its error (naming `call` and `key`) within the budget when the store is
    /// to blame ([`DispatchError::is_the_stores`]: the poll is answered 503); `now` in Unix ms.
    pub fn noted<T>(
        &self,
        call: &'static str,
        key: &str,
        now: u64,
        result: Result<T, DispatchError>,
    ) -> Result<T, DispatchError> {
        if let Err(err) = &result
            && err.is_the_stores()
            && self.within_budget(now)
        {
            tracing::warn!(call, key, error = %err, "an agent poll's store call failed; the poll is answered 503");
        }
        result
    }

    /// Logs, within the budget, that an agent request on `route` is answered 503 for `err` (a store failure
    /// outside the poll's own calls: a report's write, a token check); `now` in Unix ms.
    pub fn answered_unavailable(&self, route: &'static str, now: u64, err: &DispatchError) {
        if self.within_budget(now) {
            tracing::warn!(route, error = %err, "an agent request failed on the store; it is answered 503");
        }
    }

    /// Whether one more line fits this minute's budget (logging the count left out once a minute passed).
    fn within_budget(&self, now: u64) -> bool {
        let (log, unlogged) = self
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(now, POLL_STORE_FAILURE_LOG_LINES_PER_MINUTE);
        if let Some(count) = unlogged {
            tracing::warn!(
                count,
                "more agent requests failed on a store call in the last minute than were logged"
            );
        }
        log
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget's window as `Debug` prints it (`used`, `refused`).
    fn window(failures: &StoreFailures) -> String {
        let window = failures
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        format!("{window:?}")
    }

    #[test]
    fn passes_results_through_and_logs_within_the_budget() {
        let failures = StoreFailures::default();
        let failed = || Err::<(), _>(DispatchError::Contention("machines/default/m".into()));
        for i in 0..(POLL_STORE_FAILURE_LOG_LINES_PER_MINUTE + 5) {
            assert!(
                failures
                    .noted("machine record", "k", 1_000 + u64::from(i), failed())
                    .is_err()
            );
        }
        assert_eq!(
            failures.noted("machine record", "k", 1_000, Ok(7)).ok(),
            Some(7)
        );
        let window = window(&failures);
        assert!(window.contains("refused: 5"), "{window}");
    }

    #[test]
    fn reports_and_token_checks_share_the_polls_budget() {
        let failures = StoreFailures::default();
        let err = DispatchError::Contention("agents/default/m".into());
        for i in 0..POLL_STORE_FAILURE_LOG_LINES_PER_MINUTE {
            failures.answered_unavailable("step report", 1_000 + u64::from(i), &err);
        }
        assert!(
            failures
                .noted("machine record", "k", 2_000, Err::<(), _>(err))
                .is_err()
        );
        let window = window(&failures);
        assert!(window.contains("refused: 1"), "{window}");
    }

    #[test]
    fn an_error_that_is_not_the_stores_is_passed_through_unlogged() {
        let failures = StoreFailures::default();
        for i in 0..(POLL_STORE_FAILURE_LOG_LINES_PER_MINUTE + 5) {
            let refused = Err::<(), _>(DispatchError::Forbidden("out of scope".into()));
            assert!(matches!(
                failures.noted("run progress", "k", 1_000 + u64::from(i), refused),
                Err(DispatchError::Forbidden(_))
            ));
        }
        let window = window(&failures);
        assert!(window.contains("used: 0,"), "{window}");
    }
}
