//! Every file the server binary reads, fed more than its bound from a source with no size: `/dev/zero`, a
//! pipe as `/dev/stdin`, a process substitution `<(…)`, a FIFO. The CLI runs as a real process under a 1 GiB
//! address-space limit (`ulimit -v`), so an unbounded read would die instead of answering; library readers
//! run in process and check the peak memory. Each refusal names the file and its bound; a reload that meets
//! such a file keeps what it had.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

use std::process::{Command, Output};
use std::sync::Arc;

use inplace_bounded_read::testing::{assert_refused, fifo_with, zero_at};
use inplace_updater::cmd::commands::{MAX_POLICY_BYTES, load_policy};
use inplace_updater::cmd::diff::{EXIT_BAD_INPUT, MAX_INPUT_BYTES};
use inplace_updater::dispatch::upkeep::tokens::{AgentTokens, MAX_TOKEN_FILE_BYTES};
use inplace_updater::server::tls::{
    MAX_PEM_FILE_BYTES, ReloadingCert, TlsFiles, provider, server_config,
};

const BIN: &str = env!("CARGO_BIN_EXE_inplace-updater");

/// Runs `script` in bash with `$BIN` set and the address space capped at 1 GiB.
fn capped(script: &str) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("ulimit -v 1048576; {script}"))
        .env("BIN", BIN)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn refused(output: &Output, shown: &str, limit: u64) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(EXIT_BAD_INPUT),
        "a clear refusal, not a crash: {stderr}"
    );
    assert!(
        stderr.contains(shown) && stderr.contains(&limit.to_string()),
        "the error names {shown} and {limit}: {stderr}"
    );
}

#[test]
fn diff_reads_no_further_than_its_bound_from_devices_pipes_and_process_substitution() {
    let over = MAX_INPUT_BYTES + 5 * 1024 * 1024;
    refused(
        &capped(r#""$BIN" diff /dev/zero /dev/null"#),
        "/dev/zero",
        MAX_INPUT_BYTES,
    );
    refused(
        &capped(&format!(
            r#"head -c {over} /dev/zero | tr '\0' x | "$BIN" diff /dev/stdin /dev/null"#
        )),
        "/dev/stdin",
        MAX_INPUT_BYTES,
    );
    refused(
        &capped(&format!(
            r#""$BIN" diff <(head -c {over} /dev/zero | tr '\0' x) /dev/null"#
        )),
        "/dev/fd/",
        MAX_INPUT_BYTES,
    );
    // Under the bound a pipe is read whole: a request body on stdin is decided as from a file.
    let body = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/can-update-machine-kcp-version.json"),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["diff", "/dev/stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &body).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_policy_file_is_bounded_in_the_cli_and_the_server() {
    refused(
        &capped(r#""$BIN" policy check /dev/zero"#),
        "/dev/zero",
        MAX_POLICY_BYTES,
    );
    let dir = tempfile::tempdir().unwrap();
    let fifo = fifo_with(&dir.path().join("policy.yaml"), 2 * MAX_POLICY_BYTES);
    let err = load_policy(Some(&fifo)).unwrap_err();
    assert_refused(
        &format!("{err:#}"),
        &fifo.display().to_string(),
        MAX_POLICY_BYTES,
    );
}

#[test]
fn the_token_file_is_bounded_and_a_reload_past_the_bound_keeps_the_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = fifo_with(&dir.path().join("fifo"), MAX_TOKEN_FILE_BYTES + 1024 * 1024);
    let err = AgentTokens::load(&fifo).unwrap_err();
    assert_refused(
        &err.to_string(),
        &fifo.display().to_string(),
        MAX_TOKEN_FILE_BYTES,
    );

    let path = dir.path().join("tokens");
    let scope = inplace_updater::dispatch::AgentScope::Cluster {
        namespace: "default".into(),
        cluster: "edge-01".into(),
    };
    let token = inplace_updater::dispatch::upkeep::tokens::create_token(&scope, None).unwrap();
    std::fs::write(&path, format!("{}\n", token.line)).unwrap();
    let tokens = AgentTokens::load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    zero_at(&path);
    let err = tokens.reload_if_changed().unwrap_err();
    assert_refused(
        &err.to_string(),
        &path.display().to_string(),
        MAX_TOKEN_FILE_BYTES,
    );
    assert_eq!(
        tokens.authenticate(&token.token),
        Ok(scope),
        "the tokens read before stay in force"
    );
}

#[test]
fn certificates_keys_and_the_client_ca_are_bounded_at_start_and_on_reload() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = inplace_updater::cmd::certs::write_dev_certs(
        &inplace_updater::cmd::certs::DevCertsSpec::with_defaults(
            certs_dir.path().to_owned(),
            vec![],
            vec![],
        ),
    )
    .unwrap();
    let files = |cert: &std::path::Path, key: &std::path::Path| TlsFiles {
        cert: cert.to_owned(),
        key: key.to_owned(),
    };
    let zero = std::path::Path::new("/dev/zero");
    for (cert, key) in [
        (zero, certs.server_key.as_path()),
        (certs.server_cert.as_path(), zero),
    ] {
        let Err(err) = ReloadingCert::load(files(cert, key), provider()) else {
            panic!("/dev/zero was read as a certificate or key");
        };
        assert_refused(&err.to_string(), "/dev/zero", MAX_PEM_FILE_BYTES);
    }

    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("tls.crt");
    std::fs::copy(&certs.server_cert, &cert).unwrap();
    let served =
        Arc::new(ReloadingCert::load(files(&cert, &certs.server_key), provider()).unwrap());
    std::fs::remove_file(&cert).unwrap();
    zero_at(&cert);
    let err = served.reload_if_changed().unwrap_err();
    assert_refused(
        &err.to_string(),
        &cert.display().to_string(),
        MAX_PEM_FILE_BYTES,
    );

    let client_ca = fifo_with(&dir.path().join("client-ca.crt"), 2 * MAX_PEM_FILE_BYTES);
    let err = server_config(served, Some(&client_ca), provider()).unwrap_err();
    assert_refused(
        &err.to_string(),
        &client_ca.display().to_string(),
        MAX_PEM_FILE_BYTES,
    );
}
