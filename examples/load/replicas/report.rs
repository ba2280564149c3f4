//! What scenario `replicas` prints: each replica's agents, memory and CPU next to etcd's, the children holding
//! the agents, dispatch latencies, the agents' and CAPI's errors, and the targets met or missed (computed).

use std::sync::atomic::Ordering;
use std::time::Duration;

use inplace_agent_api::POLL_GRACE_SECONDS;

use super::takeover::TAKEOVER_TARGET;
use super::{ReplicasOutcome, Samples, TARGET_P99};
use crate::agents::Shared;
use crate::stats::{ProcSample, Summary, Table, ms, summarize};

fn mib(sample: &ProcSample) -> String {
    format!("{:.1} MiB", sample.rss_mib())
}

fn cpu(from: &ProcSample, to: &ProcSample) -> String {
    format!("{:.2} s", to.cpu.saturating_sub(from.cpu).as_secs_f64())
}

fn process_cells(s: &Samples) -> Vec<String> {
    vec![
        mib(&s.started),
        mib(&s.connected),
        mib(&s.held),
        mib(&s.updated),
        format!("{:.1} MiB", s.updated.hwm_mib()),
        cpu(&s.started, &s.connected),
        cpu(&s.connected, &s.held),
        cpu(&s.held, &s.updated),
    ]
}

impl ReplicasOutcome {
    fn latencies(&self, to: impl Fn(&Shared, usize) -> &std::sync::atomic::AtomicU64) -> Summary {
        summarize(
            self.target_indices
                .iter()
                .filter_map(|&i| Shared::between(&self.shared.update_sent[i], to(&self.shared, i)))
                .collect(),
        )
    }

    fn plans_received(&self) -> usize {
        self.target_indices
            .iter()
            .filter(|&&i| self.shared.plan_received[i].load(Ordering::Acquire) != 0)
            .count()
    }

    fn plans_without_work(&self) -> usize {
        let all = self
            .shared
            .plan_received
            .iter()
            .filter(|slot| slot.load(Ordering::Acquire) != 0)
            .count();
        all - self.plans_received()
    }

    /// Agents connected at their first attempt (the rest connected on a later one: see `reconnects`).
    fn connected(&self) -> usize {
        self.children.iter().map(|(_, _, c)| c.connected).sum()
    }

    /// Agents that connected (at any attempt) and sent their first poll.
    fn polling(&self) -> usize {
        self.children.iter().map(|(_, _, c)| c.first_polls).sum()
    }

    fn agent_errors(&self) -> (u64, u64) {
        self.children
            .iter()
            .fold((0, 0), |(e, r), (_, _, c)| (e + c.errors, r + c.reconnects))
    }

    /// Every error of the run: failed agent requests and connects (a reconnect always follows one), failed or
    /// refused UpdateMachine and CanUpdateMachineSet calls, and plans for Machines nobody gave work.
    fn errors(&self) -> u64 {
        let (errors, _) = self.agent_errors();
        (errors - self.expected_errors())
            + (self.capi.errors
                + self.capi.failures
                + self.judged.failures
                + self.plans_without_work()) as u64
    }

    /// The agents' connection failures to a replica the run killed (counted apart from the errors).
    fn expected_errors(&self) -> u64 {
        self.takeover.as_ref().map_or(0, |t| {
            t.expected_errors(self.children.iter().map(|(_, _, c)| c))
        })
    }

    /// Of the killed replica's agents given work (after the kill), how many got their plan, of how many.
    fn plans_after_kill(&self, killed: usize, replicas: usize) -> (usize, usize) {
        let mine: Vec<usize> = self
            .target_indices
            .iter()
            .copied()
            .filter(|i| i % replicas == killed)
            .collect();
        let planned = mine
            .iter()
            .filter(|&&i| self.shared.plan_received[i].load(Ordering::Acquire) != 0)
            .count();
        (planned, mine.len())
    }

    fn oldest_poll_seen(&self) -> Duration {
        Duration::from_nanos(
            self.children
                .iter()
                .map(|(_, _, c)| c.oldest_poll_seen_ns)
                .max()
                .unwrap_or(0),
        )
    }

    fn starved(&self) -> usize {
        let limit = Duration::from_secs(u64::from(self.wait_seconds + POLL_GRACE_SECONDS));
        self.targets - self.plans_received() + usize::from(self.oldest_poll_seen() > limit)
    }

    fn print_processes(&self) {
        println!(
            "\nprocesses (connect {:.1} s, hold {:.1} s, takeover {:.1} s, UpdateMachine until all Done {:.1} s):\n",
            self.walls.connect.as_secs_f64(),
            self.walls.hold.as_secs_f64(),
            self.walls.takeover.as_secs_f64(),
            self.walls.update.as_secs_f64()
        );
        let mut table = Table::new(&[
            "process",
            "agents assigned",
            "agents_connected (its gauge)",
            "UpdateMachine calls answered (its counter)",
            "plans handed (its log)",
            "etcd writes (mean)",
            "RSS started",
            "RSS fleet connected",
            "RSS after the hold",
            "RSS after updates",
            "peak RSS",
            "CPU connect",
            "CPU hold",
            "CPU updates",
        ]);
        for (i, replica) in self.replicas.iter().enumerate() {
            let mut row = vec![
                format!("replica {i} (pid {})", replica.pid),
                replica.assigned.to_string(),
                format!("{:.0}", replica.agents_gauge),
                format!("{:.0}", replica.update_calls),
                replica.plans_logged.to_string(),
                format!(
                    "{:.0} ({})",
                    replica.puts.0,
                    ms(Duration::from_secs_f64(
                        replica.puts.1 / replica.puts.0.max(1.0)
                    ))
                ),
            ];
            row.extend(process_cells(&replica.samples));
            table.row(row);
        }
        // The replica-only columns are empty for etcd.
        let mut row = vec!["etcd".to_string()];
        row.extend(std::iter::repeat_n("-".to_string(), 5));
        row.extend(process_cells(&self.etcd));
        table.row(row);
        table.print();
        let children: Vec<String> = self
            .children
            .iter()
            .map(|(pid, count, c)| {
                format!(
                    "pid {pid}: {count} agents, peak RSS {:.0} MiB",
                    c.peak_rss_kib as f64 / 1024.0
                )
            })
            .collect();
        println!(
            "\nagents held by {} harness children ({})",
            self.children.len(),
            children.join("; ")
        );
    }

    fn print_latencies(&self) -> Summary {
        let plans = self.latencies(|s, i| &s.plan_received[i]);
        let steps = self.latencies(|s, i| &s.step_started[i]);
        let calls = summarize(self.capi.first_calls.clone());
        let done = summarize(self.capi.done_after.clone());
        let judge = summarize(self.judged.calls.clone());
        let mut table = Table::new(&["measure", "n", "p50", "p99", "max"]);
        for (name, s) in [
            ("CanUpdateMachineSet call (once per cluster)", judge),
            ("UpdateMachine call (first call per Machine)", calls),
            (
                "dispatch: UpdateMachine sent (one replica) → agent's poll returns its plan (another)",
                plans,
            ),
            (
                "UpdateMachine sent → agent's first step started (report acked)",
                steps,
            ),
            ("UpdateMachine first call → CAPI sees Done", done),
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
        plans
    }

    fn print_agents(&self) {
        let (errors, reconnects) = self.agent_errors();
        let idle: u64 = self.children.iter().map(|(_, _, c)| c.idle_polls).sum();
        let longest = self
            .children
            .iter()
            .map(|(_, _, c)| c.longest_idle_poll_ns)
            .max()
            .unwrap_or(0);
        let mut table = Table::new(&["agents", "value"]);
        let (counts, window) = self.steady;
        let rate = |count: f64| {
            format!(
                "{:.2} ({count:.0} in {:.1} s)",
                count / window.as_secs_f64().max(1e-3),
                window.as_secs_f64()
            )
        };
        let rows = [
            (
                "store writes/s at steady state (etcd's count)",
                rate(counts.writes),
            ),
            (
                "store reads/s at steady state (etcd's count)",
                rate(counts.reads),
            ),
            ("connected and polling", self.polling().to_string()),
            (
                "connected at the first attempt",
                self.connected().to_string(),
            ),
            ("idle polls answered (nothing to do)", idle.to_string()),
            (
                "longest idle poll (waitSeconds is the bound)",
                ms(Duration::from_nanos(longest)),
            ),
            ("oldest outstanding poll seen", ms(self.oldest_poll_seen())),
            (
                "connection failures to a killed replica (not errors)",
                self.expected_errors().to_string(),
            ),
            (
                "request errors / reconnects (a failed connect counts in both)",
                format!("{errors} / {reconnects}"),
            ),
            ("polls refused, by HTTP status (part of the errors)", {
                let mut by_status = std::collections::BTreeMap::<u16, u64>::new();
                for (_, _, c) in &self.children {
                    for &(status, n) in &c.refusals {
                        *by_status.entry(status).or_default() += n;
                    }
                }
                let text: Vec<String> =
                    by_status.iter().map(|(s, n)| format!("{s}: {n}")).collect();
                if text.is_empty() {
                    "none".into()
                } else {
                    text.join(", ")
                }
            }),
            (
                "CanUpdateMachineSet Failure answers (asked again)",
                self.judged.failures.to_string(),
            ),
            (
                "plans received / Machines given work",
                format!("{} / {}", self.plans_received(), self.targets),
            ),
            (
                "plans for Machines given no work",
                self.plans_without_work().to_string(),
            ),
            (
                "UpdateMachine calls / Failure answers / errors / Done",
                format!(
                    "{} / {} / {} / {}",
                    self.capi.calls,
                    self.capi.failures,
                    self.capi.errors,
                    self.capi.done_after.len()
                ),
            ),
            ("UpdateMachine errors, by kind", {
                let kinds: Vec<String> = self
                    .capi
                    .error_kinds
                    .iter()
                    .map(|(kind, count)| format!("{count} × {kind}"))
                    .collect();
                if kinds.is_empty() {
                    "none".to_string()
                } else {
                    kinds.join("; ")
                }
            }),
            ("errors (all of the above)", self.errors().to_string()),
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

    pub(super) fn print(&self) {
        self.print_processes();
        let plans = self.print_latencies();
        self.print_agents();
        let replicas = self.replicas.len();
        let takeover = self.takeover.as_ref().map_or(String::new(), |t| {
            let planned = self.plans_after_kill(t.replica, replicas);
            t.print(self.expected_errors(), planned);
            let times = t.times();
            format!(
                "; killed replica's {} agents served again within {:?}: {} (p50 {}, p99 {}, max {}); \
                 their plans after the kill: {}",
                t.agents.len(),
                TAKEOVER_TARGET,
                verdict(t.met()),
                ms(times.p50),
                ms(times.p99),
                ms(times.max),
                verdict(planned.0 == planned.1),
            )
        });
        let all_planned = plans.count == self.targets;
        let p99_met = all_planned && plans.p99 < TARGET_P99;
        println!(
            "\ntargets: {} agents connected: {}; {} updated (Done): {}; every target got its plan: {}; \
             dispatch p99 < {:?}: {} ({}); 0 errors: {} ({}){takeover}",
            self.agents,
            verdict(self.polling() == self.agents),
            self.targets,
            verdict(self.capi.done_after.len() == self.targets),
            verdict(all_planned),
            TARGET_P99,
            verdict(p99_met),
            ms(plans.p99),
            verdict(self.errors() == 0),
            self.errors(),
        );
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "missed" }
}
