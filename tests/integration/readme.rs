//! Every command in README.md runs as written: the server is started the way the README starts it
//! (`serve --dev`, certificates in ./certs) in a scratch copy of the repository's fixtures, and each
//! `curl` / `cargo run --release -- …` line is executed with `sh` (the latter through the built binary).
//! The one liberty: the server listens on free ports, and the README's fixed development ports in each command
//! are replaced by them, so a `./scripts/serve-dev` left running on the machine neither fails the test nor
//! answers in its place. A `# exit N` comment on a line states its expected exit code; otherwise it must
//! succeed.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::path::Path;
use std::process::Command;

fn readme_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in readme.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let line = line.trim_end();
        if let Some(start) = line.strip_suffix('\\') {
            pending.push_str(start.trim_end());
            pending.push(' ');
            continue;
        }
        pending.push_str(line.trim_start());
        commands.push(std::mem::take(&mut pending));
    }
    commands
}

fn expected_exit(command: &str) -> i32 {
    command
        .split_once("# exit ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn every_readme_command_runs_as_written() {
    let commands = readme_commands();
    assert!(
        commands.iter().any(|c| c.starts_with("curl")),
        "the README shows curl examples"
    );
    let scratch = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"),
        scratch.path().join("tests"),
    )
    .unwrap();
    let binary = common::binary();
    let server = common::ServerProcess::start_dev(scratch.path());
    // The development ports the README shows (`serve --dev`'s defaults), and the ones this server got.
    let ports = [
        ("127.0.0.1:9443", server.hooks),
        ("127.0.0.1:9440", server.health),
        ("127.0.0.1:8080", server.metrics),
    ];
    for (dev, _) in ports {
        assert!(
            commands.iter().any(|c| c.contains(dev)),
            "the README no longer shows {dev}: update the ports this test replaces"
        );
    }

    // Each `demo` starts servers and agents of its own on free ports and shares nothing with the rest, so the
    // demos run on threads of their own, beside the others (they are most of this test's time: about 45 s one
    // after another on two cores). Every other command runs in README order on this thread: the curl calls
    // follow CAPI's order (UpdateMachine only after its CanUpdateMachine).
    let mut demos = Vec::new();
    let mut ran = 0;
    for command in &commands {
        // The first command (`./scripts/serve-dev`) starts the server this test started above; it is run as
        // written by tests/deploy/test_readme_first_command.py.
        if command.contains("serve --dev")
            || command.starts_with("./scripts/serve-dev")
            || command.starts_with(".ci/run")
            || command.starts_with('#')
            || command.is_empty()
        {
            continue;
        }
        let mut shell = command.replace("cargo run --release --", &binary.display().to_string());
        for (dev, actual) in ports {
            shell = shell.replace(dev, &actual.to_string());
        }
        let dir = scratch.path().to_path_buf();
        let run = move || {
            Command::new("sh")
                .args(["-c", &shell])
                .current_dir(dir)
                .output()
                .unwrap()
        };
        if command.starts_with("cargo run --release -- demo") {
            demos.push((command, std::thread::spawn(run)));
        } else {
            check(command, run());
        }
        ran += 1;
    }
    for (command, demo) in demos {
        check(command, demo.join().unwrap());
    }
    drop(server);
    assert!(ran >= 10, "only {ran} README commands ran");
}

/// Asserts what `command` printed and how it ended: its `# exit N` code (0 when none), and a `Success` answer
/// for a hook call.
fn check(command: &str, output: std::process::Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(expected_exit(command)),
        "{command}\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    if command.contains("/hooks.runtime.cluster.x-k8s.io/") {
        let answer: serde_json::Value =
            serde_json::from_str(&stdout).unwrap_or_else(|_| panic!("{command}: {stdout}"));
        assert!(answer["status"] == "Success", "{command}: {answer}");
    }
}
