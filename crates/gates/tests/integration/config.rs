//! The gates file: what `serve --gates-file` accepts, and each mistake refused naming the gate and field.

use std::path::Path;
use std::time::Duration;

use inplace_gates::{DEFAULT_GATE_TIMEOUT, GateKind, Gates, GatesError};

fn refused(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    match Gates::from_yaml(text, dir.path()) {
        Ok(gates) => panic!("accepted: {gates:?}"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn a_full_file_loads_with_paths_from_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.path().join("ca.crt"), ca.cert.pem()).unwrap();
    std::fs::write(dir.path().join("token"), "s3cret-token\n").unwrap();
    let file = dir.path().join("gates.yaml");
    std::fs::write(
        &file,
        r#"
gates:
  - name: storage
    prometheus:
      url: https://prometheus.monitoring:9090/prom/
      query: 'site_storage_degraded{node="{{node}}"} > 0'
      caFile: ca.crt
      bearerTokenFile: token
      timeoutSeconds: 5
  - name: critical-alerts
    alertmanager:
      url: http://alertmanager:9093
      matchers: ['severity="critical"', 'cluster="{{cluster}}"']
"#,
    )
    .unwrap();
    let gates = Gates::load(&file).unwrap();
    assert_eq!(gates.len(), 2);
    let storage = gates.get("storage").unwrap();
    assert_eq!(
        storage.endpoint.url,
        "https://prometheus.monitoring:9090/prom"
    );
    assert_eq!(
        storage.endpoint.ca_file.as_deref(),
        Some(dir.path().join("ca.crt").as_path())
    );
    assert_eq!(storage.endpoint.timeout, Duration::from_secs(5));
    assert!(matches!(storage.kind, GateKind::Prometheus(_)));
    let alerts = gates.get("critical-alerts").unwrap();
    assert_eq!(alerts.endpoint.timeout, DEFAULT_GATE_TIMEOUT);
    assert_eq!(
        alerts.label().to_string(),
        "gate critical-alerts (alertmanager http://alertmanager:9093)"
    );
}

#[test]
fn an_empty_file_or_list_is_no_gates() {
    assert!(Gates::from_yaml("", Path::new(".")).unwrap().is_empty());
    assert!(
        Gates::from_yaml("gates: []\n", Path::new("."))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn each_mistake_names_the_gate_and_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "gates:\n  - name: s\n    prometheus: {url: http://p:9090, qurey: up}\n",
            "gate s: prometheus: unknown field `qurey`",
        ),
        (
            "gates:\n  - name: s\n    prometheus: {url: ftp://p, query: up}\n",
            "gate s: prometheus.url: \"ftp://p\" must start with http:// or https://",
        ),
        (
            "gates:\n  - name: s\n    prometheus: {url: 'http://u:pw@p:9090', query: up}\n",
            "gate s: prometheus.url: must not carry credentials",
        ),
        (
            "gates:\n  - name: s\n    prometheus: {query: up}\n",
            "gate s: prometheus.url: is missing",
        ),
        (
            "gates:\n  - name: s\n    prometheus: {url: 'http://p', query: 'up{node=\"{{host}}\"}'}\n",
            "gate s: prometheus.query: unknown placeholder {{host}}",
        ),
        (
            "gates:\n  - name: s\n    prometheus: {url: 'http://p', query: up, timeoutSeconds: 0}\n",
            "gate s: prometheus.timeoutSeconds: 0 is out of range 1–300",
        ),
        (
            "gates:\n  - name: s\n    prometheus: {url: 'http://p', query: up, bearerTokenFile: /nonexistent/token}\n",
            "gate s: prometheus.bearerTokenFile: bearer token file: cannot read /nonexistent/token",
        ),
        (
            "gates:\n  - name: s\n    prometheus: {url: 'http://p', query: up, caFile: /nonexistent/ca.crt}\n",
            "gate s: prometheus.caFile: CA file: cannot read /nonexistent/ca.crt",
        ),
        (
            "gates:\n  - name: s\n    alertmanager: {url: 'http://a', matchers: []}\n",
            "gate s: alertmanager.matchers: is empty",
        ),
        (
            "gates:\n  - name: s\n    grafana: {url: 'http://g'}\n",
            "gate s: grafana: unknown key: a gate has `name` and one of prometheus, alertmanager",
        ),
        (
            "gates:\n  - name: s\n    prometheus: {url: 'http://p', query: up}\n    alertmanager: {url: 'http://a', matchers: [a=b]}\n",
            "gate s: (kind): a gate has `name` and exactly one of prometheus, alertmanager",
        ),
        (
            "gates:\n  - prometheus: {url: 'http://p', query: up}\n",
            "gate #1: name: is missing",
        ),
        (
            "gates:\n  - name: Storage_1\n    prometheus: {url: 'http://p', query: up}\n",
            "gate #1: name: \"Storage_1\" is not a name",
        ),
        (
            "gates:\n  - name: s\n    prometheus: {url: 'http://p', query: up}\n  - name: s\n    prometheus: {url: 'http://q', query: up}\n",
            "gate s: name: used by an earlier gate too",
        ),
        (
            "gate: []\n",
            "not a gates file (a top-level `gates:` list): unknown field `gate`",
        ),
    ];
    for (text, expected) in cases {
        let message = refused(text);
        assert!(
            message.starts_with(expected),
            "{text}\n  said: {message}\n  want: {expected}"
        );
    }
}

#[test]
fn a_token_file_is_checked_but_never_quoted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "  \n").unwrap();
    std::fs::write(dir.path().join("ca.crt"), "s3cret-not-a-cert").unwrap();
    let text = "gates:\n  - name: s\n    prometheus: {url: 'https://p', query: up, bearerTokenFile: token}\n";
    let err = Gates::from_yaml(text, dir.path()).unwrap_err();
    assert!(
        matches!(err, GatesError::Gate { ref field, .. } if field == "prometheus.bearerTokenFile")
    );
    assert!(err.to_string().ends_with("token is empty"), "{err}");
    let text =
        "gates:\n  - name: s\n    prometheus: {url: 'https://p', query: up, caFile: ca.crt}\n";
    let err = Gates::from_yaml(text, dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("no PEM certificate") && !err.contains("s3cret"),
        "{err}"
    );
}
