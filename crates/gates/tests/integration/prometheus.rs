//! Prometheus gates against a real Prometheus that scrapes the test's exporter every second and fires
//! `StorageDegraded` (severity critical) from it.

use std::time::Duration;

use inplace_gates::{Gate, GateResult, Gates, Vars, Verdict, evaluate, evaluate_all};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};

use crate::daemons::{Daemon, HttpClient, POLL, SETTLE_WITHIN, free_port, start};
use crate::exporter::Exporter;

const FIRING_CRITICAL: &str = r#"ALERTS{alertstate="firing",severity="critical"}"#;

fn config(exporter: &Exporter) -> String {
    format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: [rules.yml]\n\
         scrape_configs:\n  - job_name: site\n    static_configs: [{{targets: ['{}']}}]\n",
        exporter.addr
    )
}

const RULES: &str = "groups:\n  - name: site\n    rules:\n      - alert: StorageDegraded\n        \
                     expr: site_storage_degraded > 0\n        for: 0s\n        labels: {severity: critical}\n";

const ARGS: [&str; 4] = [
    "--config.file={dir}/prometheus.yml",
    "--storage.tsdb.path={dir}/data",
    "--web.listen-address={addr}",
    "--log.level=warn",
];

async fn prometheus(exporter: &Exporter) -> Daemon {
    let files = [
        ("prometheus.yml", config(exporter)),
        ("rules.yml", RULES.to_string()),
    ];
    start(
        "prometheus",
        "prometheus",
        &files,
        &ARGS,
        &HttpClient::plain(),
        "http",
    )
    .await
}

/// The one gate of a gates file's text.
pub fn gate(text: &str, base: &std::path::Path) -> Gate {
    Gates::from_yaml(text, base).unwrap().list()[0].clone()
}

fn prometheus_gate(name: &str, url: &str, query: &str) -> Gate {
    gate(
        &format!("gates:\n  - name: {name}\n    prometheus: {{url: '{url}', query: '{query}'}}\n"),
        std::path::Path::new("."),
    )
}

fn vars(node: &str) -> Vars {
    Vars {
        node: node.into(),
        cluster: "site-a".into(),
        namespace: "default".into(),
    }
}

/// Evaluates `gate` until `wanted` holds (Prometheus scrapes and evaluates once a second).
pub async fn until(gate: &Gate, vars: &Vars, wanted: impl Fn(&GateResult) -> bool) -> GateResult {
    let deadline = tokio::time::Instant::now() + SETTLE_WITHIN;
    loop {
        let result = evaluate(gate, vars).await;
        if wanted(&result) {
            return result;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {SETTLE_WITHIN:?}; last: {}",
            result.message()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Until the exporter's series is in Prometheus (so a pass means "no alert", not "nothing scraped yet").
async fn scraped(url: &str) {
    let seen = prometheus_gate("scraped", url, "absent(site_storage_degraded)");
    until(&seen, &vars("any"), GateResult::passes).await;
}

#[tokio::test]
async fn a_firing_alert_fails_the_gate_with_its_series_and_passes_once_resolved() {
    let exporter = Exporter::start().await;
    exporter.set("edge-01", false);
    let prometheus = prometheus(&exporter).await;
    scraped(&prometheus.url()).await;
    let storage = prometheus_gate("storage", &prometheus.url(), FIRING_CRITICAL);
    assert!(evaluate(&storage, &vars("edge-01")).await.passes());

    exporter.set("edge-01", true);
    let firing = until(&storage, &vars("edge-01"), |r| !r.passes()).await;
    assert_eq!(
        firing.message(),
        format!(
            r#"gate storage (prometheus {}): query returned 1 series: ALERTS{{alertname="StorageDegraded",alertstate="firing",instance="{}",job="site",node="edge-01",severity="critical"}} = 1"#,
            prometheus.url(),
            exporter.addr
        )
    );

    exporter.set("edge-01", false);
    let resolved = until(&storage, &vars("edge-01"), GateResult::passes).await;
    assert_eq!(resolved.verdict, Verdict::Pass);

    // A query Prometheus refuses is a failing gate that says why.
    let broken = prometheus_gate("broken", &prometheus.url(), "sum(");
    let result = evaluate(&broken, &vars("edge-01")).await;
    assert!(!result.passes());
    assert!(
        result
            .message()
            .contains("unreachable: query failed (bad_data): "),
        "{}",
        result.message()
    );
}

#[tokio::test]
async fn a_per_node_query_fails_only_for_that_node() {
    let exporter = Exporter::start().await;
    exporter.set("edge-01", true);
    exporter.set("edge-02", false);
    let prometheus = prometheus(&exporter).await;
    let per_node = prometheus_gate(
        "node-storage",
        &prometheus.url(),
        r#"ALERTS{alertstate="firing",node="{{node}}"}"#,
    );
    let failing = until(&per_node, &vars("edge-01"), |r| !r.passes()).await;
    assert!(
        failing.message().contains(r#"node="edge-01""#),
        "{}",
        failing.message()
    );

    // While edge-01's alert fires: edge-02's per-node gate passes, the fleet-wide one does not.
    let fleet = prometheus_gate("fleet", &prometheus.url(), FIRING_CRITICAL);
    let results = evaluate_all(&[per_node, fleet], &vars("edge-02")).await;
    let summary: Vec<(&str, bool)> = results
        .iter()
        .map(|(name, result)| (name.as_str(), result.passes()))
        .collect();
    assert_eq!(summary, [("node-storage", true), ("fleet", false)]);
}

#[tokio::test]
async fn an_unreachable_prometheus_fails_the_gate_naming_the_cause() {
    let closed = free_port();
    let down = prometheus_gate("storage", &format!("http://{closed}"), FIRING_CRITICAL);
    let result = evaluate(&down, &vars("edge-01")).await;
    assert!(!result.passes());
    assert_eq!(
        result.message(),
        format!("gate storage (prometheus http://{closed}): unreachable: connection refused")
    );

    // A server that accepts and never answers: the gate's timeout ends the wait.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let slow = gate(
        &format!(
            "gates:\n  - name: slow\n    prometheus: {{url: 'http://{addr}', query: up, timeoutSeconds: 1}}\n"
        ),
        std::path::Path::new("."),
    );
    let started = tokio::time::Instant::now();
    let result = evaluate(&slow, &vars("edge-01")).await;
    assert_eq!(
        result.verdict,
        Verdict::Unreachable {
            cause: "no answer within 1 s (timeoutSeconds)".into()
        }
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    held.abort();
}

#[tokio::test]
async fn an_https_prometheus_is_trusted_through_the_ca_file_only() {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut server = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = server.signed_by(&key, &ca).unwrap();

    let exporter = Exporter::start().await;
    let web = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n".to_string();
    let files = [
        ("prometheus.yml", config(&exporter)),
        ("rules.yml", RULES.to_string()),
        ("web.yml", web),
        ("tls.crt", cert.pem()),
        ("tls.key", key.serialize_pem()),
    ];
    let mut args = ARGS.to_vec();
    args.push("--web.config.file={dir}/web.yml");
    let trusting = {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth()
    };
    let prometheus = start(
        "prometheus",
        "prometheus",
        &files,
        &args,
        &HttpClient::new(trusting),
        "https",
    )
    .await;
    let gates_dir = tempfile::tempdir().unwrap();
    std::fs::write(gates_dir.path().join("ca.crt"), ca.pem()).unwrap();
    let url = format!("https://localhost:{}", prometheus.addr.port());

    let with_ca = gate(
        &format!(
            "gates:\n  - name: tls\n    prometheus: {{url: '{url}', query: 'up{{job=\"none\"}}', caFile: ca.crt}}\n"
        ),
        gates_dir.path(),
    );
    let result = evaluate(&with_ca, &vars("edge-01")).await;
    assert!(result.passes(), "{}", result.message());

    let system_roots = prometheus_gate("tls", &url, r#"up{job="none"}"#);
    let result = evaluate(&system_roots, &vars("edge-01")).await;
    assert!(!result.passes());
    assert!(
        result.message().contains("unreachable: ") && result.message().contains("UnknownIssuer"),
        "{}",
        result.message()
    );
}
