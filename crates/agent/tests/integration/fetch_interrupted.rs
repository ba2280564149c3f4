//! A `fetch` interrupted inside its download, the blob stalled by a loopback proxy after 2 MiB of answers: a
//! clean shutdown stops it at once and keeps the `.partial`; the real `inplace-agent` process SIGKILLed
//! leaves a `.partial` that the next process resumes with one `Range` request.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use inplace_agent::api::*;

use crate::common::fixtures::LIMIT;
use crate::common::*;
use crate::fetch_command::{PREVIOUS, Run, TO, install_plan, oci_fetch, oci_source, pin, setup};
use crate::registry::{PASSWORD, Registry, StallingProxy, content, sha256};

/// The real `inplace-agent` binary on the run's sandbox (its log in `<node dir>/agent.log`); SIGKILLed on drop.
pub(crate) struct AgentProcess(std::process::Child);

impl AgentProcess {
    pub(crate) fn spawn(run: &Run) -> Self {
        let c = &run.config;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(run.node.dir.path().join("agent.log"))
            .unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_inplace-agent"))
            .arg("--server")
            .arg(&c.server)
            .arg("--ca-file")
            .arg(&c.ca_file)
            .arg("--token-file")
            .arg(&c.token_file)
            .args(["--machine", "default/cp-0", "--no-kubernetes-steps"])
            .arg("--config")
            .arg(c.driver_config.as_ref().unwrap())
            .arg("--state-dir")
            .arg(&c.state_dir)
            .arg("--root")
            .arg(&c.root)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Self(child)
    }

    /// SIGTERM (a clean shutdown), and how long the process took to exit (failing past `limit`).
    pub(crate) fn terminate(&mut self, limit: Duration) -> Duration {
        let asked = Instant::now();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM: {sent}");
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                assert!(status.success(), "{status}");
                return asked.elapsed();
            }
            assert!(
                asked.elapsed() < limit,
                "the agent did not stop within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, and the process reaped.
    pub(crate) fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A plan whose 8 MiB artifact comes through a [`StallingProxy`] that lets 2 MiB of answers pass.
struct Stalled {
    registry: Registry,
    proxy: StallingProxy,
    run: Run,
    big: Vec<u8>,
    hex: String,
}

impl Stalled {
    async fn start() -> Self {
        let registry = Registry::start().await;
        let arch = inplace_agent::api::go_arch(std::env::consts::ARCH);
        let big = content("big kubelet", 8 * 1024 * 1024);
        let index = registry.push("k8s/kubelet", &[(arch, &big)]);
        let hex = sha256(&big);
        let proxy = StallingProxy::start(registry.port, 2 * 1024 * 1024).await;
        let proxied = format!("127.0.0.1:{}", proxy.port);
        let run = setup(
            &registry,
            &[proxied, registry.host()],
            PASSWORD,
            oci_fetch(),
            &pin("v1.34.1", &oci_source("kubelet", &index)),
            "",
        )
        .await;
        run.server.offer(install_plan("kill", "v1.34.1"));
        Self {
            registry,
            proxy,
            run,
            big,
            hex,
        }
    }

    fn partial(&self) -> PathBuf {
        self.run
            .artifacts()
            .join(format!("sha256-{}.partial", self.hex))
    }

    fn partial_len(&self) -> u64 {
        std::fs::metadata(self.partial()).map_or(0, |m| m.len())
    }

    /// Part of the artifact is in the `.partial`, none of it anywhere else.
    fn assert_interrupted(&self) -> u64 {
        let kept = self.partial_len();
        assert!(kept > 0 && kept < self.big.len() as u64, "{kept}");
        assert!(
            !self
                .run
                .artifacts()
                .join(format!("sha256-{}", self.hex))
                .exists()
        );
        assert_eq!(
            std::fs::read_to_string(self.run.node.path(TO)).unwrap(),
            PREVIOUS
        );
        kept
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_inside_a_stalled_download_stops_it_at_once_and_keeps_the_partial() {
    let stalled = Stalled::start().await;
    let agent = spawn_agent(stalled.run.config.clone());
    wait_until("a .partial with bytes in it", LIMIT, || {
        stalled.partial_len() > 0
    })
    .await;
    let asked = Instant::now();
    // RunningAgent::shutdown fails the test past 30 s; a stalled download waits up to ARTIFACT_STALL_TIMEOUT (60 s).
    agent.shutdown().await;
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    let kept = stalled.assert_interrupted();
    eprintln!("shutdown inside the download took {took:?}; {kept} bytes kept in the .partial");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_inside_a_download_resumes_it_with_a_range_request() {
    let started = Instant::now();
    let stalled = Stalled::start().await;
    let Stalled {
        registry,
        proxy,
        run,
        big,
        hex,
    } = &stalled;
    let len = || stalled.partial_len();
    let mut first = AgentProcess::spawn(run);
    wait_until("a .partial with bytes in it", LIMIT, || len() > 0).await;
    first.kill();
    let kept = stalled.assert_interrupted();
    eprintln!("killed with {kept} of {} bytes in the .partial", big.len());

    // The next agent (the same state dir) resumes the step; the download resumes at the .partial's end.
    let ranges_before = registry.log().matches("\" 206 ").count();
    proxy.release();
    let mut second = AgentProcess::spawn(run);
    let report = run.wait_final("kill").await;
    second.kill();
    assert_eq!(report.status, StepStatus::Succeeded, "{:?}", report.message);
    assert_eq!(&run.installed(), big);
    assert!(!stalled.partial().exists());
    registry.wait_log("\" 206 ", ranges_before + 1).await;
    let resumed = registry
        .log()
        .lines()
        .filter(|l| l.contains(&format!("/blobs/sha256:{hex}")) && l.contains("\" 206 "))
        .count();
    assert_eq!(resumed, 1, "one Range request for the blob");
    eprintln!("kill and resume: {:?}", started.elapsed());
}
