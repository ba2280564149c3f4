//! The floor every wing of dispatch stands on: the store with typed records ([`db`]), the keys ([`keys`]), the
//! records and a run's pure transitions ([`records`], [`run`]), the hold on a run ([`hold`]), the remediation guard's record ([`guard`]), store-backed
//! counting semaphores ([`slots`]), what the retention sweep deletes ([`retention`]), the outbox of Kubernetes Events ([`outbox`]), the clock, the tunables, the error type and the stored format. No wing is
//! imported here.

pub mod clock;
pub mod config;
pub mod db;
pub mod error;
pub mod format;
pub mod guard;
pub mod hold;
pub mod keys;
pub mod outbox;
pub mod records;
pub mod retention;
pub mod rollback;
pub mod run;
pub mod run_events;
pub mod run_view;
pub mod slots;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use clock::Clock;
pub use config::DispatchConfig;
pub use db::Db;
pub use error::DispatchError;

/// What every wing holds: the store, the clock, the tunables and the shutdown signal.
#[derive(Clone)]
pub struct Floor {
    /// The store, typed.
    pub db: Db,
    /// The clock every wing judges by.
    pub clock: Arc<Clock>,
    /// The tunables.
    pub config: DispatchConfig,
    /// Cancelled at shutdown.
    pub shutdown: CancellationToken,
    /// Where the wings post what an operator should see as Events on the Machine.
    pub outbox: outbox::Outbox,
}

impl Floor {
    /// Now, in Unix ms, by the dispatcher's clock.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
}
