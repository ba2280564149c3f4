//! What the store is written at steady state, as etcd itself counts it: `etcd_mvcc_put_total` +
//! `etcd_mvcc_delete_total` (every key a put or a transaction wrote or deleted) read from its metrics endpoint at
//! the start and the end of a window ([`SteadyWrites`]), so the figure does not depend on what the servers say of
//! themselves.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use inplace_store::testing::Etcd;

/// The writes counted over a window that opens once the fleet has settled.
#[derive(Debug, Default)]
pub struct SteadyWrites {
    opened: Option<(Instant, f64)>,
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
            self.opened = Some((Instant::now(), etcd_writes(etcd)?));
        }
        Ok(())
    }

    /// The writes since the window opened, and how long it was open (zero when it never opened).
    pub fn close(self, etcd: &Etcd) -> anyhow::Result<(f64, Duration)> {
        Ok(match self.opened {
            Some((from, writes)) => (etcd_writes(etcd)? - writes, from.elapsed()),
            None => (0.0, Duration::ZERO),
        })
    }
}

/// etcd's own count of the writes it applied, from its metrics endpoint.
fn etcd_writes(etcd: &Etcd) -> anyhow::Result<f64> {
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
    Ok(read("etcd_mvcc_put_total")? + read("etcd_mvcc_delete_total")?)
}
