//! The load harness behind docs/performance.md runs as that page shows it, scaled down: every scenario
//! exits 0, prints its tables, and reports no request error and no starved agent. The figures themselves are
//! that page's (taken with the full-size commands); this only keeps the commands working.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/load`, built by `cargo test` next to the binary.
fn harness() -> PathBuf {
    let binary = common::binary();
    let path = binary.parent().unwrap().join("examples").join("load");
    assert!(
        path.exists(),
        "{} is missing: run the whole suite (`cargo test --release`), which builds the examples",
        path.display()
    );
    path
}

fn run(args: &[&str]) -> String {
    run_with_env(args, &[])
}

/// As [`run`], with `env` set for the harness and so for the servers it starts (their `INPLACE_UPDATER_*`
/// flags' env twins).
fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let output = Command::new(harness())
        .args(args)
        .envs(env.iter().copied())
        .arg("--server-bin")
        .arg(common::binary())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "load {args:?} failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The cell of `column` in each data row of the Markdown table whose header holds `column`.
fn column(stdout: &str, column: &str) -> Vec<String> {
    let mut lines = stdout
        .lines()
        .skip_while(|l| !(l.starts_with('|') && l.contains(column)));
    let header: Vec<&str> = lines.next().unwrap().split('|').map(str::trim).collect();
    let index = header.iter().position(|h| *h == column).unwrap();
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(str::trim).nth(index).unwrap().to_string())
        .collect()
}

/// Each `(label, value)`: the row whose label holds `label` says `value`.
fn assert_rows(stdout: &str, rows: &[(&str, &str)]) {
    for (label, value) in rows {
        assert_eq!(row_value(stdout, label), *value, "{label}\n{stdout}");
    }
}

fn row_value(stdout: &str, label: &str) -> String {
    let line = stdout
        .lines()
        .find(|l| l.starts_with('|') && l.contains(label))
        .unwrap_or_else(|| panic!("no row {label:?} in\n{stdout}"));
    line.split('|').map(str::trim).nth(2).unwrap().to_string()
}

#[test]
fn hooks_scenario_answers_every_request_kind_without_errors() {
    // `--server-bin` is the fleet scenarios' flag; hooks serves in-process, so it goes through run() only there.
    let output = Command::new(harness())
        .args([
            "hooks",
            "--seconds",
            "0.2",
            "--rounds",
            "1",
            "--connections",
            "2",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let kinds = column(&stdout, "request");
    assert_eq!(kinds.len(), 8, "{stdout}");
    // A hook that records is held against the durable ceiling, one that only reads against the parse ceiling.
    for (kind, ceiling) in kinds.iter().zip(column(&stdout, "ceiling")) {
        let records = kind.contains("new") || kind.starts_with("CanUpdate");
        let expected = if records { "durable" } else { "parse" };
        assert_eq!(ceiling, expected, "{kind}\n{stdout}");
    }
    for (kind, ours) in kinds.iter().zip(column(&stdout, "ours req/s")) {
        let ours: f64 = ours.parse().unwrap();
        assert!(ours > 0.0, "{kind}: no request answered\n{stdout}");
    }
    assert!(
        column(&stdout, "errors").iter().all(|e| e == "0"),
        "{stdout}"
    );
}

/// The instruction-count mode of CONTRIBUTING.md ("Counting instructions"): a fixed number of requests,
/// one side at a time.
#[test]
fn hooks_scenario_drives_a_fixed_number_of_requests_to_one_side() {
    for (side, driven, idle) in [
        ("--ours-only", "ours req/s", "ceiling req/s"),
        ("--ceiling-only", "ceiling req/s", "ours req/s"),
    ] {
        let output = Command::new(harness())
            .args(["hooks", "--only", "Discovery", side, "--requests", "20"])
            .args(["--rounds", "1", "--connections", "2"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}");
        let driven: f64 = column(&stdout, driven)[0].parse().unwrap();
        let idle: f64 = column(&stdout, idle)[0].parse().unwrap();
        assert!(driven > 0.0 && idle == 0.0, "{side}\n{stdout}");
        assert_eq!(column(&stdout, "errors"), ["0"], "{stdout}");
    }
}

#[test]
fn fleet_scenario_gives_every_target_its_plan_and_starves_no_agent() {
    let stdout = run(&[
        "fleet",
        "--agents",
        "60",
        "--targets",
        "20",
        "--idle-seconds",
        "1",
        "--retry-after-seconds",
        "1",
    ]);
    assert_eq!(row_value(&stdout, "connected"), "60", "{stdout}");
    assert_eq!(
        row_value(&stdout, "plans received / Machines given work"),
        "20 / 20"
    );
    assert_eq!(row_value(&stdout, "plans for Machines given no work"), "0");
    assert_eq!(row_value(&stdout, "request errors / reconnects"), "0 / 0");
    assert!(row_value(&stdout, "starved").starts_with('0'), "{stdout}");
    assert!(stdout.contains("peak RSS (VmHWM)"), "{stdout}");
}

/// The server closes a kept-alive connection idle for its `--header-read-timeout`; CAPI's Go client then sends
/// on a new connection, and so must the harness's CAPI workers, or each such call is counted an error
/// ("transport: channel closed": 1 to 13 per 100 000-agent run before).
#[test]
fn fleet_scenario_sends_again_when_the_server_closed_an_idle_capi_connection() {
    let stdout = run_with_env(
        &[
            "fleet",
            "--agents",
            "20",
            "--targets",
            "20",
            "--idle-seconds",
            "1",
            "--retry-after-seconds",
            "2",
        ],
        // Every Machine's next call comes 2 s after its last: its connection sat idle past 1 s.
        &[("INPLACE_UPDATER_HEADER_READ_TIMEOUT", "1s")],
    );
    let calls = row_value(&stdout, "UpdateMachine calls / Failure answers / errors");
    let counts: Vec<usize> = calls.split(" / ").map(|n| n.parse().unwrap()).collect();
    assert!(
        counts[0] > 20,
        "no Machine was called twice: {calls}\n{stdout}"
    );
    assert_eq!(
        counts[1..],
        [0, 0],
        "Failure answers / errors: {calls}\n{stdout}"
    );
    assert_eq!(
        row_value(&stdout, "plans received / Machines given work"),
        "20 / 20"
    );
}

#[test]
fn dispatch_scenario_hands_every_agent_its_plan() {
    let stdout = run(&["dispatch", "--agents", "40", "--retry-after-seconds", "1"]);
    assert!(stdout.contains("all 40 plans received: met"), "{stdout}");
}

/// `load replicas` on two replicas and two children, `agents` agents of which `targets` get work after a 1 s
/// hold, `extra` arguments added.
fn two_replicas(agents: &str, targets: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "replicas",
        "--replicas",
        "2",
        "--children",
        "2",
        "--agents",
        agents,
        "--targets",
        targets,
        "--idle-seconds",
        "1",
        "--retry-after-seconds",
        "1",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn replicas_scenario_wakes_agents_on_other_replicas_through_etcd() {
    // Two replicas on one real etcd, agents held by two child processes; UpdateMachine always goes to the
    // replica the agent does not poll, so each plan reaches its agent through etcd's watch.
    let stdout = two_replicas("200", "20", &[]);
    assert_rows(
        &stdout,
        &[
            ("connected and polling", "200"),
            ("connected at the first attempt", "200"),
            ("plans received / Machines given work", "20 / 20"),
            ("errors (all of the above)", "0"),
        ],
    );
    // Each replica saw its half of the fleet, answered UpdateMachine only for the other half's targets and
    // handed plans only to its own agents: 10 targets per replica.
    let processes: Vec<String> = column(&stdout, "process");
    assert_eq!(processes.len(), 3, "two replicas and etcd\n{stdout}");
    let gauges = column(&stdout, "agents_connected (its gauge)");
    let handed = column(&stdout, "plans handed (its log)");
    assert_eq!(&gauges[..2], ["100", "100"], "{stdout}");
    assert_eq!(&handed[..2], ["10", "10"], "{stdout}");
    // Woken through etcd's watch, not by the 25 s long-poll running out.
    assert!(stdout.contains("dispatch p99 < 1s: met"), "{stdout}");
    assert!(
        stdout.contains("every target got its plan: met") && stdout.contains("0 errors: met (0)"),
        "{stdout}"
    );
}

#[test]
fn replicas_scenario_hands_a_killed_replicas_agents_to_the_live_one() {
    // Two replicas on one real etcd, 300 agents; after the hold replica 0 is SIGKILLed. Its 150 agents' polls
    // fail, each backs off as the real agent does (at most BACKOFF_INITIAL, 0.5 s) and connects to replica 1,
    // which answers its inventory report: every one must be served again within TAKEOVER_TARGET (that back-off
    // plus TAKEOVER_ANSWER_ALLOWANCE, 4 s, for one handshake and one answer on a loaded machine: 4.5 s), listed
    // by replica 1's presence in the store, and the 15 of them given work afterwards (UpdateMachine through
    // replica 1) must get their plans; the failures to the dead replica are counted apart, no other error.
    let stdout = two_replicas("300", "30", &["--kill-replica", "0"]);
    assert_rows(
        &stdout,
        &[
            (
                "its agents answered by another replica",
                "150 / 150 (replica 1: 150)",
            ),
            ("listed by the live replicas' presence", "150 / 150"),
            ("plans to its agents, dispatched after the kill", "15 / 15"),
            ("plans received / Machines given work", "30 / 30"),
            ("errors (all of the above)", "0"),
        ],
    );
    assert!(
        stdout.contains("killed replica's 150 agents served again within 4.5s: met"),
        "{stdout}"
    );
    // Every one of its agents lost its poll at the kill: at least one failure each, all to the dead replica.
    let expected: u64 = row_value(
        &stdout,
        "connection failures to the killed replica (expected",
    )
    .parse()
    .unwrap();
    assert!(expected >= 150, "{stdout}");
    assert!(stdout.contains("0 errors: met (0)"), "{stdout}");
}

#[test]
fn replicas_scenario_refuses_a_fleet_the_open_file_limit_cannot_hold_before_starting_anything() {
    // 4 000 agents on two replicas are 2 000 connections in each replica; under a limit of 1 024 open files,
    // soft and hard (so the harness cannot raise it), the run must stop before etcd or a replica starts, naming
    // the limit, the figure each replica needs and the replica count that would fit, instead of failing after
    // minutes of connecting.
    let output = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 1024 && exec \"$0\" \"$@\"")
        .arg(harness())
        .args(["replicas", "--replicas", "2", "--agents", "4000"])
        .arg("--server-bin")
        .arg(common::binary())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stdout}");
    // 2 000 connections + 10 CAPI workers + 100 of the replica's own; (1 024 − 110) per replica → 5 replicas.
    for expected in [
        "need about 2110 open files in each replica",
        "the open-file limit (RLIMIT_NOFILE) is 1024 (hard limit 1024",
        "--replicas 5 would fit",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in\n{stderr}");
    }
    assert!(
        !stdout.contains("long-polling"),
        "the fleet was started:\n{stdout}"
    );
}

#[test]
fn agent_footprint_scenario_measures_a_connected_idle_agent() {
    // One second idle: enough to show the scenario starts both processes and reads the agent's /proc.
    let stdout = run(&["agent-footprint", "--idle-seconds", "1"]);
    let rss: f64 = row_value(&stdout, "RSS at the end").parse().unwrap();
    let threads: u32 = row_value(&stdout, "threads").parse().unwrap();
    assert!(rss > 0.0 && threads >= 1, "{stdout}");
    assert!(
        row_value(&stdout, "CPU per idle hour")
            .parse::<f64>()
            .is_ok(),
        "{stdout}"
    );
}

#[test]
fn agent_drain_scenario_measures_an_agent_that_evicts_every_pod() {
    // Five pods instead of 110: the scenario runs the same update, drain and readings.
    let stdout = run(&["agent-drain", "--pods", "5"]);
    assert_eq!(row_value(&stdout, "pods evicted"), "5", "{stdout}");
    let peak: f64 = row_value(&stdout, "RSS peak during the update")
        .parse()
        .unwrap();
    let idle: f64 = row_value(&stdout, "RSS before the update").parse().unwrap();
    assert!(peak >= idle && idle > 0.0, "{stdout}");
}

/// `load replicas` at `agents` agents on two replicas, polling every second, with no work, its hold long
/// enough to count etcd's writes over three heartbeat intervals after the fleet's membership is published (and
/// over the 30–60 s at which the old per-agent write fell due again for half the fleet): the steady-state
/// writes and reads per second.
fn steady_rates(agents: usize) -> (f64, f64) {
    let agents = agents.to_string();
    let stdout = run(&[
        "replicas",
        "--replicas",
        "2",
        "--children",
        "1",
        "--agents",
        &agents,
        "--targets",
        "2",
        "--wait-seconds",
        "1",
        "--idle-seconds",
        "45",
        "--settle-seconds",
        "13",
        "--retry-after-seconds",
        "1",
    ]);
    assert_eq!(
        row_value(&stdout, "connected and polling"),
        agents,
        "{stdout}"
    );
    assert_eq!(
        row_value(&stdout, "errors (all of the above)"),
        "0",
        "{stdout}"
    );
    let rate = |row: &str| {
        let cell = row_value(&stdout, row);
        cell.split_whitespace()
            .next()
            .and_then(|rate| rate.parse().ok())
            .unwrap_or_else(|| panic!("no rate in {cell:?}\n{stdout}"))
    };
    (
        rate("store writes/s at steady state"),
        rate("store reads/s at steady state"),
    )
}

#[test]
fn replicas_store_writes_and_reads_at_steady_state_do_not_grow_with_the_fleet() {
    // Two fleet sizes at once, each on its own etcd; etcd counts the writes (puts and deletes it applied) and
    // the reads (ranges it served).
    let ((small, small_reads), (large, large_reads)) = std::thread::scope(|s| {
        let small = s.spawn(|| steady_rates(100));
        let large = s.spawn(|| steady_rates(400));
        (small.join().unwrap(), large.join().unwrap())
    });
    // Two replicas, one heartbeat each per 10 s: 0.2 writes/s; a window of 32 s sees 6 to 8 of them. The old
    // per-agent write (every 30–60 s, so half the fleet in this window) was about 1.6 and 6.3 writes/s.
    let heartbeats = 2.0 / 10.0;
    assert!(
        (large - small).abs() <= 0.1,
        "100 agents: {small:.2} writes/s, 400 agents: {large:.2} writes/s"
    );
    for (agents, rate) in [(100.0, small), (400.0, large)] {
        assert!(
            rate <= heartbeats * 1.5 && rate < agents / 60.0 / 5.0,
            "{agents} agents: {rate:.2} writes/s"
        );
    }
    // Every agent polls once a second with nothing to do: a store read per poll would be 100 and 400 reads/s.
    // Its replica answers from the look it kept, so what etcd serves is the replicas' own reads (presence).
    assert!(
        (large_reads - small_reads).abs() <= 2.0,
        "100 agents: {small_reads:.2} reads/s, 400 agents: {large_reads:.2} reads/s"
    );
    for (agents, reads) in [(100.0, small_reads), (400.0, large_reads)] {
        assert!(
            reads < agents / 20.0,
            "{agents} agents polling every second: {reads:.2} reads/s"
        );
    }
}
