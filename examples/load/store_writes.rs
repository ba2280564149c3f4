//! What the store is written and read at steady state, as etcd itself counts it: `etcd_mvcc_put_total` +
//! `etcd_mvcc_delete_total` (every key a put or a transaction wrote or deleted) and `etcd_mvcc_range_total` (every
//! read: a get, a list page, a transaction's read) from its metrics endpoint at the start and the end of a window
//! ([`SteadyWrites`]), so the figures do not depend on what the servers say of themselves.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use inplace_store::testing::Etcd;

/// The writes and reads counted over a window that opens once the fleet has settled.
#[derive(Debug, Default)]
pub struct SteadyWrites {
    opened: Option<(Instant, Counts)>,
}

/// etcd's counts: writes (puts and deletes) and reads (ranges).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Counts {
    /// Keys put or deleted.
    pub writes: f64,
    /// Ranges served.
    pub reads: f64,
}

impl SteadyWrites {
    /// Opens the window (once) when `held` has reached `settle`.
    pub fn open_once_settled(
        &mut self,
        etcd: &Etcd,
        held: Duration,
        settle: Duration,
    ) -> anyhow::Result<()> {
        if self.opened.is_none() && held >= settle {
            self.opened = Some((Instant::now(), etcd_counts(etcd)?));
        }
        Ok(())
    }

    /// The writes and reads since the window opened, and how long it was open (zero when it never opened).
    pub fn close(self, etcd: &Etcd) -> anyhow::Result<(Counts, Duration)> {
        Ok(match self.opened {
            Some((from, at_open)) => {
                let now = etcd_counts(etcd)?;
                let counts = Counts {
                    writes: now.writes - at_open.writes,
                    reads: now.reads - at_open.reads,
                };
                (counts, from.elapsed())
            }
            None => (Counts::default(), Duration::ZERO),
        })
    }
}

/// etcd's own count of the writes it applied and the reads it served, from its metrics endpoint.
fn etcd_counts(etcd: &Etcd) -> anyhow::Result<Counts> {
    let (status, body) = crate::process::admin_get(etcd.metrics_addr(), "/metrics")?;
    anyhow::ensure!(status == 200, "etcd's /metrics answered {status}");
    let read = |name: &str| {
        body.lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .with_context(|| format!("no {name} in etcd's /metrics"))
    };
    Ok(Counts {
        writes: read("etcd_mvcc_put_total")? + read("etcd_mvcc_delete_total")?,
        reads: read("etcd_mvcc_range_total")?,
    })
}
