//! The `fetch` sequence command run by the real agent (pull loop, installKubelet step, fake server) against
//! the real registry (Debian's `docker-registry`, TLS + htpasswd): through a mirror rewrite with the
//! credentials file and the CA it installs the verified file at its node path; every bad input fails the
//! step with a message naming the artifact and the cause and leaves the previous file byte-unchanged.
//! Interrupted downloads: `fetch_interrupted.rs`.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use inplace_agent::api::*;

use crate::common::fixtures::{LIMIT, TOKEN};
use crate::common::*;
use crate::registry::{PASSWORD, Registry, USER, content, sha256};

/// The node path every case installs to, with a previous binary there.
pub(crate) const TO: &str = "/usr/local/bin/kubelet";
pub(crate) const PREVIOUS: &str = "previous kubelet binary\n";
/// The registry the sources name; the mirror rewrite sends it to the test registry.
const CONFIGURED: &str = "registry.example.com/k8s";

/// One agent run of a one-step plan (installKubelet `version`) whose sequence is `fetch` + a restart.
pub(crate) struct Run {
    pub node: Node,
    pub server: TestServer,
    pub config: inplace_agent::AgentConfig,
}

/// Writes the credentials file (a Docker config.json for `hosts`), the sandbox and the agent config.
pub(crate) async fn setup(
    registry: &Registry,
    hosts: &[String],
    password: &str,
    fetch: &str,
    pins: &str,
    artifacts_extra: &str,
) -> Run {
    let server = TestServer::start(TOKEN).await;
    server.with(|s| s.on_failure = Some(OnFailure::Hold));
    let node = Node::new();
    node.write(TO, PREVIOUS);
    node.fake("systemctl", "exit 0");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{password}"));
    let auths: Vec<String> = hosts
        .iter()
        .map(|h| format!("\"{h}\": {{\"auth\": \"{auth}\"}}"))
        .collect();
    // The node's copy of the registry's CA (a case replaces it with another CA).
    let ca = node.dir.path().join("registry-ca.pem");
    std::fs::copy(registry.ca_file(), &ca).unwrap();
    let credentials = node.dir.path().join("registry-auth.json");
    std::fs::write(
        &credentials,
        format!("{{\"auths\": {{{}}}}}", auths.join(", ")),
    )
    .unwrap();
    let yaml = format!(
        "artifacts:\n  mirrors: [{{prefix: {CONFIGURED}, replacement: \"{}/k8s\"}}]\n  \
         credentialsFile: {}\n  caFile: {}\n{artifacts_extra}\
         {pins}\
         kubernetes:\n  installKubelet:\n    commands:\n      - fetch: {fetch}\n      \
         - run: [systemctl, restart, kubelet]\n",
        hosts[0],
        credentials.display(),
        ca.display(),
    );
    let config = node.agent_config(&server, TOKEN, &yaml);
    Run {
        node,
        server,
        config,
    }
}

pub(crate) fn install_plan(id: &str, version: &str) -> Plan {
    plan(
        id,
        vec![step(
            0,
            "install kubelet",
            StepAction::InstallKubelet {
                version: version.into(),
            },
        )],
    )
}

impl Run {
    /// Starts an agent, offers the plan, waits for the step's final report, and stops the agent.
    async fn final_report(&self, id: &str, version: &str) -> StepReport {
        let agent = spawn_agent(self.config.clone());
        let report = self.plan_report(id, version).await;
        agent.shutdown().await;
        report
    }

    /// Offers the plan (to the agent running) and waits for the step's final report.
    async fn plan_report(&self, id: &str, version: &str) -> StepReport {
        self.server.offer(install_plan(id, version));
        self.wait_final(id).await
    }

    pub async fn wait_final(&self, id: &str) -> StepReport {
        let done = |r: &StepReport| {
            r.plan_id == id && matches!(r.status, StepStatus::Succeeded | StepStatus::Failed)
        };
        wait_until("the fetch step's end", LIMIT, || {
            self.server.reports_for(0).iter().any(done)
        })
        .await;
        self.server.reports_for(0).into_iter().find(done).unwrap()
    }

    pub fn installed(&self) -> Vec<u8> {
        std::fs::read(self.node.path(TO)).unwrap()
    }

    pub fn artifacts(&self) -> PathBuf {
        self.node.state.join(inplace_agent::ARTIFACT_DIR)
    }
}

pub(crate) fn oci_source(repository: &str, hex: &str) -> String {
    format!("oci://{CONFIGURED}/{repository}@sha256:{hex}")
}

pub(crate) fn oci_fetch() -> &'static str {
    "{source: \"{{pin.kubeletSource}}\", to: /usr/local/bin/kubelet, mode: \"0755\"}"
}

pub(crate) fn pin(version: &str, source: &str) -> String {
    format!("pins:\n  {version}: {{kubeletSource: \"{source}\"}}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_installs_through_a_mirror_reuses_the_download_and_rereads_the_credentials() {
    let started = Instant::now();
    let registry = Registry::start().await;
    let arch = inplace_agent::api::go_arch(std::env::consts::ARCH);
    let other = if arch == "amd64" { "arm64" } else { "amd64" };
    let kubelet = content("kubelet v1.34.1", 300_000);
    let index = registry.push(
        "k8s/kubelet",
        &[(other, &content("other arch", 1000)), (arch, &kubelet)],
    );
    let source = oci_source("kubelet", &index);
    let next = content("kubelet v1.34.3", 2000);
    let next_source = oci_source("kubelet", &registry.push("k8s/kubelet", &[(arch, &next)]));
    let pins = format!(
        "pins:\n  v1.34.1: {{kubeletSource: \"{source}\"}}\n  v1.34.2: {{kubeletSource: \"{source}\"}}\n  \
         v1.34.3: {{kubeletSource: \"{next_source}\"}}\n  v1.34.4: {{kubeletSource: \"{next_source}\"}}\n"
    );
    let run = setup(
        &registry,
        &[registry.host()],
        PASSWORD,
        oci_fetch(),
        &pins,
        "",
    )
    .await;
    // A download left from long ago: pruned when the agent starts.
    std::fs::create_dir_all(run.artifacts()).unwrap();
    let stale = run
        .artifacts()
        .join(format!("sha256-{}.partial", sha256(b"old")));
    let old = std::fs::File::create(&stale).unwrap();
    old.set_modified(
        std::time::SystemTime::now() - inplace_agent::ARTIFACT_RETENTION - Duration::from_secs(60),
    )
    .unwrap();
    // One agent runs every plan of this test.
    let agent = spawn_agent(run.config.clone());
    let report = run.plan_report("fetch-1", "v1.34.1").await;
    assert!(!stale.exists(), "an expired .partial was kept");
    assert_eq!(report.status, StepStatus::Succeeded, "{:?}", report.message);
    assert_eq!(run.installed(), kubelet);
    let path = run.node.path(TO);
    assert_eq!(mode_of(&path), 0o755);
    let hex = sha256(&kubelet);
    let stored = run.artifacts().join(format!("sha256-{hex}"));
    assert_eq!(std::fs::read(&stored).unwrap(), kubelet);
    let blob_get = format!("/v2/k8s/kubelet/blobs/sha256:{hex}");
    let gets = registry.wait_log(&blob_get, 1).await;

    // Another plan with the same artifact: the verified download is reused, nothing is downloaded again.
    std::fs::write(&path, PREVIOUS).unwrap();
    let report = run.plan_report("fetch-2", "v1.34.2").await;
    assert_eq!(report.status, StepStatus::Succeeded, "{:?}", report.message);
    assert_eq!(run.installed(), kubelet);
    assert_eq!(registry.log().matches(&blob_get).count(), gets);

    // The credentials file is read at each fetch: a rotated (here: wrong) password shows at once, and so
    // does the right one again — the same running agent.
    let credentials = run.node.dir.path().join("registry-auth.json");
    let right = std::fs::read_to_string(&credentials).unwrap();
    let auth = |password: &str| {
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{password}"))
    };
    std::fs::write(
        &credentials,
        right.replace(&auth(PASSWORD), &auth("rotated-away")),
    )
    .unwrap();
    let report = run.plan_report("fetch-3", "v1.34.3").await;
    let message = report.message.unwrap_or_default();
    assert_eq!(report.status, StepStatus::Failed, "{message}");
    assert!(message.contains("401 Unauthorized"), "{message}");
    assert_eq!(run.installed(), kubelet);
    std::fs::write(&credentials, right).unwrap();
    let report = run.plan_report("fetch-4", "v1.34.4").await;
    assert_eq!(report.status, StepStatus::Succeeded, "{:?}", report.message);
    assert_eq!(run.installed(), next);
    agent.shutdown().await;
    eprintln!(
        "fetch through a mirror, then reuse: {:?}",
        started.elapsed()
    );
}

fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// One bad input: the agent config's fetch and pins, and what the message must contain.
struct Bad {
    input: &'static str,
    fetch: String,
    source: String,
    password: &'static str,
    artifacts_extra: &'static str,
    /// The node trusts another CA than the registry's.
    other_ca: bool,
    wanted: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_fails_the_step_naming_the_artifact_and_keeps_the_previous_file() {
    let started = Instant::now();
    let registry = Registry::start().await;
    let arch = inplace_agent::api::go_arch(std::env::consts::ARCH);
    let other = if arch == "amd64" { "arm64" } else { "amd64" };
    let good = content("good", 20_000);
    let good_index = registry.push("k8s/good", &[(arch, &good)]);
    let foreign_index = registry.push("k8s/foreign", &[(other, &content("foreign", 500))]);
    let broken = content("broken", 20_000);
    let broken_index = registry.push("k8s/broken", &[(arch, &broken)]);
    std::fs::write(
        registry.layer_link("k8s/broken", &sha256(&broken)),
        "garbage",
    )
    .unwrap();
    let short = content("short", 20_000);
    let short_index = registry.push("k8s/short", &[(arch, &short)]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(registry.blob_data(&sha256(&short)))
        .unwrap()
        .set_len(5000)
        .unwrap();
    let swapped = content("swapped", 20_000);
    let swapped_index = registry.push("k8s/swapped", &[(arch, &swapped)]);
    std::fs::write(
        registry.blob_data(&sha256(&swapped)),
        content("other bytes", 20_000),
    )
    .unwrap();
    let missing = sha256(b"never pushed");
    let blob_url = format!(
        "https://{}/v2/k8s/good/blobs/sha256:{}",
        registry.host(),
        sha256(&good)
    );
    let other_hex = sha256(b"content B");
    let oci = |input, repository: &str, hex: &str, wanted: Vec<String>| Bad {
        input,
        fetch: oci_fetch().to_owned(),
        source: oci_source(repository, hex),
        password: PASSWORD,
        artifacts_extra: "",
        other_ca: false,
        wanted,
    };
    let mirror = |repository: &str| format!("{}/k8s/{repository}", registry.host());
    let tagged = format!("oci://{CONFIGURED}/kubelet:v1.34.1");
    let cases = vec![
        Bad {
            source: tagged.clone(),
            ..oci(
                "a tag instead of a digest (in a pin: fails when the step prepares)",
                "kubelet",
                &missing,
                vec![format!("{tagged:?} names a tag; give a digest (@sha256:…)")],
            )
        },
        Bad {
            input: "digest mismatch (https:// source, sha256 of other content)",
            fetch: "{source: \"{{pin.kubeletSource}}\", sha256: \"{{pin.kubeletSha256}}\", to: /usr/local/bin/kubelet}".into(),
            source: blob_url.clone(),
            password: PASSWORD,
            artifacts_extra: "",
            other_ca: false,
            wanted: vec![
                format!("artifact {blob_url}: digest mismatch: expected sha256:{other_hex}, got sha256:{}", sha256(&good)),
            ],
        },
        oci(
            "digest mismatch (the registry serves other bytes for the layer)",
            "swapped",
            &swapped_index,
            vec![format!("digest mismatch: expected sha256:{}", sha256(&swapped))],
        ),
        oci(
            "an index with another architecture only",
            "foreign",
            &foreign_index,
            vec![format!(
                "no manifest for linux/{arch} in index sha256:{foreign_index}; it offers: linux/{other}"
            )],
        ),
        Bad {
            password: "wrong-password",
            ..oci(
                "401 (wrong password in the credentials file)",
                "good",
                &good_index,
                vec![
                    "answered 401 Unauthorized: the registry refused the credentials of user \"agent\"".into(),
                ],
            )
        },
        oci(
            "404 (digest not in the registry)",
            "good",
            &missing,
            vec!["answered 404 Not Found".into(), "MANIFEST_UNKNOWN".into()],
        ),
        oci(
            "500 (the repository's layer link is garbage; tried again, then given up)",
            "broken",
            &broken_index,
            vec![
                "answered 500 (a server error)".into(),
                "(attempt 2/2; no attempts left)".into(),
            ],
        ),
        oci(
            "a truncated blob (data file cut to 5000 bytes; tried again, then given up)",
            "short",
            &short_index,
            vec![
                "truncated: got 5000 of 20000 bytes".into(),
                "(attempt 2/2; no attempts left)".into(),
            ],
        ),
        Bad {
            other_ca: true,
            ..oci(
                "the registry's certificate is not signed by caFile",
                "good",
                &good_index,
                vec!["failed: ".into(), "UnknownIssuer".into()],
            )
        },
        Bad {
            artifacts_extra: "  maxBytes: 10000\n",
            ..oci(
                "over maxBytes (20000-byte layer, maxBytes 10000)",
                "good",
                &good_index,
                vec!["20000 bytes is over the limit of 10000 bytes".into()],
            )
        },
    ];
    let mut table = vec![
        "| bad input | the step's message |".to_owned(),
        "|---|---|".to_owned(),
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let source = case.source.clone();
        let pins = format!(
            "pins:\n  v1.34.1: {{kubeletSource: \"{source}\", kubeletSha256: \"{other_hex}\"}}\n"
        );
        // Two attempts, the second at once: a transient cause is tried again, no other is.
        let extra = format!(
            "{}  retry: {{attempts: 2, initialDelaySeconds: 0, maxDelaySeconds: 0}}\n",
            case.artifacts_extra
        );
        let run = setup(
            &registry,
            &[registry.host()],
            case.password,
            &case.fetch,
            &pins,
            &extra,
        )
        .await;
        if case.other_ca {
            let other = crate::common::test_pki("another CA").ca.pem();
            std::fs::write(run.node.dir.path().join("registry-ca.pem"), other).unwrap();
        }
        let report = run.final_report(&format!("bad-{i}"), "v1.34.1").await;
        let message = report.message.clone().unwrap_or_default();
        assert_eq!(
            report.status,
            StepStatus::Failed,
            "{}: {message}",
            case.input
        );
        assert!(
            message.starts_with("kubernetes.installKubelet.commands[0]: "),
            "{}: {message}",
            case.input
        );
        assert!(
            message.contains(&source),
            "{}: names the artifact: {message}",
            case.input
        );
        if source.starts_with("oci://") && source != tagged {
            let repository = source.split('/').nth(4).unwrap().split('@').next().unwrap();
            assert!(
                message.contains(&format!("(through the mirror {}): ", mirror(repository))),
                "{}: names the mirror: {message}",
                case.input
            );
        }
        for wanted in &case.wanted {
            assert!(
                message.contains(wanted),
                "{}: {wanted:?} in {message}",
                case.input
            );
        }
        if !case.input.contains("tried again") {
            assert!(!message.contains("attempt"), "{}: {message}", case.input);
        }
        assert!(
            !message.contains(PASSWORD) && !message.contains("wrong-password"),
            "{message}"
        );
        assert_eq!(
            std::fs::read_to_string(run.node.path(TO)).unwrap(),
            PREVIOUS,
            "{}: the previous file changed",
            case.input
        );
        assert_eq!(run.node.calls("systemctl"), 0, "{}", case.input);
        table.push(format!("| {} | `{message}` |", case.input));
    }

    // A tag written in the config itself: the agent refuses to start, naming the key and the source.
    let run = setup(
        &registry,
        &[registry.host()],
        PASSWORD,
        &format!("{{source: \"{tagged}\", to: /usr/local/bin/kubelet}}"),
        "",
        "",
    )
    .await;
    let err = inplace_agent::run(run.config.clone(), std::future::pending())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "kubernetes.installKubelet: commands[0]: fetch.source: \"{tagged}\" names a tag"
        )),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(run.node.path(TO)).unwrap(),
        PREVIOUS
    );
    table.push(format!(
        "| a tag instead of a digest (literal in the config: the agent does not start) | `{err}` |"
    ));
    eprintln!("{}", table.join("\n"));
    eprintln!("bad inputs: {:?}", started.elapsed());
}
