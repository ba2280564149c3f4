//! What the fleet scenarios print: the server process table, dispatch latencies, the agents' view, and the
//! targets met or missed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use inplace_agent_api::POLL_GRACE_SECONDS;

use super::{FleetOutcome, TARGET_P99, TARGET_RSS_MIB};
use crate::agents::Shared;
use crate::stats::{Table, cpu_percent, ms, summarize};

impl FleetOutcome {
    fn latencies(
        &self,
        to: impl Fn(&Shared, usize) -> &std::sync::atomic::AtomicU64,
    ) -> Vec<Duration> {
        self.target_indices
            .iter()
            .filter_map(|&i| Shared::between(&self.shared.update_sent[i], to(&self.shared, i)))
            .collect()
    }

    fn print_process(&self) {
        println!(
            "\nserver process (pid {}, the real binary, --store {}):\n",
            self.pid, self.store
        );
        let mut table = Table::new(&[
            "phase",
            "wall",
            "server CPU",
            "CPU (% of one core)",
            "RSS after",
        ]);
        table.row(vec![
            "started, no agent".into(),
            "-".into(),
            format!("{:.2} s", self.baseline.cpu.as_secs_f64()),
            "-".into(),
            format!("{:.1} MiB", self.baseline.rss_mib()),
        ]);
        for phase in &self.phases {
            table.row(vec![
                phase.name.clone(),
                format!("{:.1} s", phase.wall.as_secs_f64()),
                format!(
                    "{:.2} s",
                    phase
                        .after
                        .cpu
                        .saturating_sub(phase.before.cpu)
                        .as_secs_f64()
                ),
                format!(
                    "{:.0} %",
                    cpu_percent(&phase.before, &phase.after, phase.wall)
                ),
                format!("{:.1} MiB", phase.after.rss_mib()),
            ]);
        }
        table.print();
        let per_agent = self.per_agent_kib();
        println!(
            "\npeak RSS (VmHWM) {:.1} MiB; {:.1} KiB per connected agent; {} threads; harness peak RSS {:.0} MiB",
            self.peak.hwm_mib(),
            per_agent,
            self.peak.threads,
            self.harness_peak.hwm_mib(),
        );
    }

    fn print_latencies(&self) -> Duration {
        let plans = summarize(self.latencies(|s, i| &s.plan_received[i]));
        let steps = summarize(self.latencies(|s, i| &s.step_started[i]));
        let calls = summarize(self.capi.first_calls.clone());
        let done = summarize(self.capi.done_after.clone());
        let late = summarize(self.capi.done_delays.clone());
        let mut table = Table::new(&["measure", "n", "p50", "p99", "max"]);
        for (name, s) in [
            ("UpdateMachine call (first call per Machine)", calls),
            ("UpdateMachine sent → agent's poll returns its plan", plans),
            (
                "UpdateMachine sent → agent's first step started (report acked)",
                steps,
            ),
            ("UpdateMachine first call → CAPI sees Done", done),
            ("agent's last step report acked → CAPI sees Done", late),
        ] {
            table.row(vec![
                name.into(),
                s.count.to_string(),
                ms(s.p50),
                ms(s.p99),
                ms(s.max),
            ]);
        }
        println!();
        table.print();
        let per_update = &self.capi.calls_per_update;
        if !per_update.is_empty() {
            println!(
                "\nUpdateMachine calls per update (to Done): mean {:.2}, max {} over {} updates",
                per_update.iter().sum::<usize>() as f64 / per_update.len() as f64,
                per_update.iter().max().copied().unwrap_or_default(),
                per_update.len()
            );
        }
        plans.p99.max(if plans.count < self.targets {
            Duration::MAX
        } else {
            Duration::ZERO
        })
    }

    fn starved(&self) -> usize {
        let no_plan = self.targets.saturating_sub(
            self.target_indices
                .iter()
                .filter(|&&i| self.shared.plan_received[i].load(Ordering::Acquire) != 0)
                .count(),
        );
        let limit = Duration::from_secs(u64::from(self.wait_seconds + POLL_GRACE_SECONDS));
        no_plan + usize::from(self.oldest_poll_seen > limit)
    }

    fn print_agents(&self) {
        let s = &self.shared;
        let mut table = Table::new(&["agents", "value"]);
        let rows = [
            ("connected", s.connected.load(Ordering::Relaxed).to_string()),
            (
                "idle polls answered (nothing to do)",
                s.idle_polls.load(Ordering::Relaxed).to_string(),
            ),
            (
                "longest idle poll (waitSeconds is the bound)",
                ms(Duration::from_nanos(
                    s.longest_idle_poll_ns.load(Ordering::Relaxed),
                )),
            ),
            ("oldest outstanding poll seen", ms(self.oldest_poll_seen)),
            (
                "request errors / reconnects",
                format!(
                    "{} / {}",
                    s.errors.load(Ordering::Relaxed),
                    s.reconnects.load(Ordering::Relaxed)
                ),
            ),
            (
                "plans received / Machines given work",
                format!(
                    "{} / {}",
                    self.latencies(|s, i| &s.plan_received[i]).len(),
                    self.targets
                ),
            ),
            (
                "plans for Machines given no work",
                s.plans_without_work.load(Ordering::Relaxed).to_string(),
            ),
            (
                "'plan handed to agent' lines in the server log",
                self.plans_logged.to_string(),
            ),
            (
                "UpdateMachine calls / Failure answers / errors",
                format!(
                    "{} / {} / {}",
                    self.capi.calls, self.capi.failures, self.capi.errors
                ),
            ),
            (
                "starved (no plan, or a poll unanswered past waitSeconds + grace)",
                self.starved().to_string(),
            ),
        ];
        for (name, value) in rows {
            table.row(vec![name.into(), value]);
        }
        println!();
        table.print();
    }

    fn per_agent_kib(&self) -> f64 {
        self.connected.rss_kib.saturating_sub(self.baseline.rss_kib) as f64 / self.agents as f64
    }

    pub(super) fn print_fleet(&self, ceiling: Option<&FleetOutcome>) {
        self.print_process();
        if let Some(ceiling) = ceiling {
            let mut table = Table::new(&[
                "same fleet held by",
                "RSS idle",
                "RSS, fleet connected",
                "per agent",
                "peak RSS",
            ]);
            for (name, o) in [
                ("ours (real binary)", self),
                ("ceiling (bare axum + rustls, own process)", ceiling),
            ] {
                table.row(vec![
                    name.into(),
                    format!("{:.1} MiB", o.baseline.rss_mib()),
                    format!("{:.1} MiB", o.connected.rss_mib()),
                    format!("{:.1} KiB", o.per_agent_kib()),
                    format!("{:.1} MiB", o.peak.hwm_mib()),
                ]);
            }
            println!();
            table.print();
            println!(
                "\nper-agent memory, ours / ceiling: {:.2}×",
                self.per_agent_kib() / ceiling.per_agent_kib().max(1e-9)
            );
        }
        let p99 = self.print_latencies();
        self.print_agents();
        let rss = self.peak.hwm_mib();
        println!(
            "\ntargets: RSS ≤ {TARGET_RSS_MIB} MiB: {} ({rss:.1} MiB peak); dispatch p99 < {:?}: {}; no agent starved: {}",
            verdict(rss <= TARGET_RSS_MIB),
            TARGET_P99,
            verdict(p99 < TARGET_P99),
            verdict(self.starved() == 0),
        );
    }

    pub(super) fn print_dispatch(&self) {
        println!(
            "\n{} agents connected to pid {} (--store {}); every one gets work",
            self.agents, self.pid, self.store
        );
        let p99 = self.print_latencies();
        println!(
            "\ntarget: UpdateMachine → plan p99 < {:?}: {}; all {} plans received: {}",
            TARGET_P99,
            verdict(p99 < TARGET_P99),
            self.targets,
            verdict(self.starved() == 0)
        );
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "missed" }
}
