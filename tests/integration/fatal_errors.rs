//! Fatal start-up errors, from the real binary: one line, once, naming the flag and the fix, in the chosen log
//! format (a JSON object under `--log-format json`), exit code 1, no backtrace even with RUST_BACKTRACE=1, and
//! `listening` never logged before the failure. Also: the agent refuses to start without a usable --config.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use crate::common;

use std::net::TcpListener;
use std::process::{Command, Stdio};

use common::{binary, certs};
use serde_json::Value;

struct Failure {
    code: Option<i32>,
    lines: Vec<String>,
}

/// Runs the binary with `args` (after `--log-format FORMAT`) and collects its stderr.
fn run(format: &str, args: &[&str]) -> Failure {
    let output = Command::new(binary())
        .args(["--log-format", format])
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    Failure {
        code: output.status.code(),
        lines: stderr.lines().map(str::to_owned).collect(),
    }
}

/// Both formats: exit 1, exactly one error line that names `flag` and says how to fix it, nothing after it,
/// no backtrace, no `listening`.
fn check(args: &[&str], flag: &str, problem: &str) {
    let text = run("text", args);
    assert_eq!(text.code, Some(1), "{args:?}: {:#?}", text.lines);
    let errors: Vec<&String> = text.lines.iter().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error line: {:#?}", text.lines);
    let error = errors[0];
    assert_eq!(
        text.lines.last(),
        Some(error),
        "the error is the last word: {:#?}",
        text.lines
    );
    assert!(
        error.contains(flag) && error.contains(problem) && error.contains("fix="),
        "{error}"
    );
    assert_eq!(
        error.matches(problem).count(),
        1,
        "each cause once: {error}"
    );
    let all = text.lines.join("\n");
    for unwanted in ["listening", "backtrace", "Caused by", "panicked", "Error: "] {
        assert!(!all.contains(unwanted), "{unwanted:?} in {all}");
    }

    let json = run("json", args);
    assert_eq!(json.code, Some(1));
    let records: Vec<Value> = json
        .lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .collect();
    let errors: Vec<&Value> = records.iter().filter(|r| r["level"] == "ERROR").collect();
    assert_eq!(errors.len(), 1, "{records:#?}");
    let fields = &errors[0]["fields"];
    assert_eq!(fields["flag"], flag, "{fields}");
    assert!(
        fields["message"].as_str().unwrap().contains(problem),
        "{fields}"
    );
    assert!(
        !fields["fix"].as_str().unwrap_or_default().is_empty(),
        "{fields}"
    );
    assert!(
        records
            .iter()
            .all(|r| r["fields"]["message"] != "listening"),
        "{records:#?}"
    );
}

fn serve<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--health-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--store",
        "memory:",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_missing_certificate_names_tls_cert() {
    let certs = certs();
    let key = certs.paths.server_key.to_str().unwrap();
    check(
        &serve(&["--tls-cert", "/nonexistent/tls.crt", "--tls-key", key]),
        "--tls-cert",
        "cannot read /nonexistent/tls.crt",
    );
}

#[test]
fn a_port_in_use_names_its_flag() {
    let certs = certs();
    let (cert, key) = (
        certs.paths.server_cert.to_str().unwrap(),
        certs.paths.server_key.to_str().unwrap(),
    );
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let mut args = serve(&["--tls-cert", cert, "--tls-key", key]);
    let metrics = args.iter().position(|a| *a == "--metrics-listen").unwrap();
    args[metrics + 1] = &address;
    check(&args, "--metrics-listen", "cannot listen");
}

#[test]
fn a_bad_policy_file_names_policy() {
    let certs = certs();
    let policy = certs.dir.path().join("policy.yaml");
    std::fs::write(&policy, "rules: [this is: not a rule").unwrap();
    let args = serve(&[
        "--tls-cert",
        certs.paths.server_cert.to_str().unwrap(),
        "--tls-key",
        certs.paths.server_key.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
    ]);
    check(&args, "--policy", policy.to_str().unwrap());
}

/// A gates file with a mistake stops `serve` naming the gate and the field; a file's contents never reach the
/// log (here a token file given as the CA file). A good file, given by the environment twin, is loaded.
#[test]
fn a_bad_gates_file_names_the_gate_and_field() {
    let certs = certs();
    let (cert, key) = (
        certs.paths.server_cert.to_str().unwrap(),
        certs.paths.server_key.to_str().unwrap(),
    );
    let gates = certs.dir.path().join("gates.yaml");
    std::fs::write(
        &gates,
        "gates:\n  - name: storage\n    prometheus: {url: 'ftp://prometheus:9090', query: up}\n",
    )
    .unwrap();
    let path = gates.to_str().unwrap();
    let args = serve(&["--tls-cert", cert, "--tls-key", key, "--gates-file", path]);
    check(
        &args,
        "--gates-file",
        "gate storage: prometheus.url: \"ftp://prometheus:9090\" must start with http:// or https://",
    );

    std::fs::write(certs.dir.path().join("token"), "s3cret-bearer-token\n").unwrap();
    std::fs::write(
        &gates,
        "gates:\n  - name: storage\n    prometheus: {url: 'https://p:9090', query: up, caFile: token}\n",
    )
    .unwrap();
    check(
        &args,
        "--gates-file",
        "gate storage: prometheus.caFile: CA file",
    );
    let all = run("text", &args).lines.join("\n");
    assert!(!all.contains("s3cret"), "{all}");

    std::fs::write(
        &gates,
        "gates:\n  - name: storage\n    prometheus: {url: 'https://p:9090', query: up, bearerTokenFile: token}\n  \
         - name: critical\n    alertmanager: {url: 'http://a:9093', matchers: ['severity=\"critical\"']}\n",
    )
    .unwrap();
    let server = common::ServerProcess::start_env(
        &certs.paths,
        &[],
        &[("INPLACE_UPDATER_GATES_FILE", gates.as_path())],
    );
    let loaded = server.wait_for_log("\"loaded\"");
    assert!(loaded.contains("\"gates\":2"), "{loaded}");
    assert!(!server.logs().join("\n").contains("s3cret"));
}

/// A store another format version wrote is refused at start-up, untouched.
#[test]
fn a_store_of_another_format_version_names_store() {
    let certs = certs();
    let data = certs.dir.path().join("data");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        use inplace_store::Store as _;
        let store = inplace_store::file::FileStore::open(&data).await.unwrap();
        store
            .put(
                "meta/format",
                br#"{"version":2}"#.to_vec(),
                inplace_store::Precondition::Any,
            )
            .await
            .unwrap();
    });
    let url = format!("file:{}", data.display());
    let args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--health-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--tls-cert",
        certs.paths.server_cert.to_str().unwrap(),
        "--tls-key",
        certs.paths.server_key.to_str().unwrap(),
        "--store",
        &url,
    ];
    check(&args, "--store", "format version 2");
    let kept = runtime.block_on(async {
        use inplace_store::Store as _;
        let store = inplace_store::file::FileStore::open(&data).await.unwrap();
        store.get("meta/format").await.unwrap().unwrap().value
    });
    assert_eq!(kept, br#"{"version":2}"#, "the store is left as it was");
}

#[test]
fn a_bad_store_url_names_store() {
    check(
        &["serve", "--store", "postgres://db:5432/updates"],
        "--store",
        "postgres://db:5432/updates",
    );
}

#[test]
fn an_agent_without_config_refuses_to_start() {
    let certs = certs();
    let dir = certs.dir.path();
    let token = dir.join("token");
    std::fs::write(&token, "iu1_x").unwrap();
    let state = dir.join("state");
    let args = [
        "agent",
        "--server",
        "https://127.0.0.1:9",
        "--ca-file",
        certs.paths.ca_cert.to_str().unwrap(),
        "--token-file",
        token.to_str().unwrap(),
        "--machine",
        "default/m-1",
        "--state-dir",
        state.to_str().unwrap(),
        "--root",
        dir.to_str().unwrap(),
    ];
    let text = run("text", &args);
    assert_eq!(text.code, Some(1), "{:#?}", text.lines);
    let all = text.lines.join("\n");
    assert!(
        all.contains("--config is not given") && all.contains("--no-kubernetes-steps"),
        "{all}"
    );
    assert!(
        !all.contains("agent started"),
        "refused before it started: {all}"
    );
    assert_eq!(text.lines.len(), 1, "{all}");

    // A config without the Kubernetes step commands is refused too, naming what is missing.
    let config = dir.join("agent.yaml");
    std::fs::write(&config, "path: [/usr/bin, /bin]\n").unwrap();
    let mut with_config = args.to_vec();
    with_config.extend(["--config", config.to_str().unwrap()]);
    let json = run("json", &with_config);
    assert_eq!(json.code, Some(1));
    let record: Value = serde_json::from_str(json.lines.last().unwrap()).unwrap();
    assert_eq!(record["fields"]["flag"], "--config");
    let message = record["fields"]["message"].as_str().unwrap();
    assert!(
        message.contains("kubernetes.installKubeadm")
            && message.contains("kubernetes.kubeadmUpgradeNode")
            && message.contains("kubernetes.installKubelet"),
        "{message}"
    );

    // Told explicitly, it starts (and, with nothing listening on port 9, retries the network).
    let mut told = args.to_vec();
    told.push("--no-kubernetes-steps");
    let mut child = Command::new(binary())
        .args(&told)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let started = std::io::BufRead::lines(std::io::BufReader::new(stderr))
        .map_while(Result::ok)
        .find(|l| l.contains("agent started"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(started.is_some(), "--no-kubernetes-steps lets it start");
}
