//! Alertmanager gates against a real Alertmanager: alerts posted to its v2 API, a silence created through it.

use inplace_gates::{GateResult, Vars, Verdict, evaluate};

use crate::daemons::{HttpClient, start};
use crate::prometheus::{gate, until};

const CONFIG: &str = "route: {receiver: blackhole}\nreceivers: [{name: blackhole}]\n";

fn alert(name: &str, severity: &str, node: &str) -> String {
    format!(r#"{{"labels":{{"alertname":"{name}","severity":"{severity}","node":"{node}"}}}}"#)
}

#[tokio::test]
async fn a_matching_active_alert_fails_the_gate_and_a_silenced_one_passes() {
    let client = HttpClient::plain();
    let alertmanager = start(
        "prometheus-alertmanager",
        "prometheus-alertmanager",
        &[("alertmanager.yml", CONFIG.to_string())],
        &[
            "--config.file={dir}/alertmanager.yml",
            "--storage.path={dir}/data",
            "--web.listen-address={addr}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        &client,
        "http",
    )
    .await;
    let url = alertmanager.url();
    let critical = gate(
        &format!(
            "gates:\n  - name: critical\n    alertmanager: {{url: '{url}', matchers: ['severity=\"critical\"', 'node=\"{{{{node}}}}\"']}}\n"
        ),
        std::path::Path::new("."),
    );
    let vars = Vars {
        node: "edge-01".into(),
        ..Vars::default()
    };
    assert!(evaluate(&critical, &vars).await.passes(), "no alert yet");

    let alerts = format!(
        "[{},{},{}]",
        alert("StorageDegraded", "critical", "edge-01"),
        alert("DiskFilling", "warning", "edge-01"),
        alert("StorageDegraded", "critical", "edge-02"),
    );
    let (status, body) = client
        .post_json(&format!("{url}/api/v2/alerts"), alerts)
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let failing = until(&critical, &vars, |r| !r.passes()).await;
    assert_eq!(
        failing.message(),
        format!(
            r#"gate critical (alertmanager {url}): 1 alert active: StorageDegraded{{node="edge-01",severity="critical"}}"#
        )
    );

    let silence = r#"{"matchers":[{"name":"alertname","value":"StorageDegraded","isRegex":false,"isEqual":true},
        {"name":"node","value":"edge-01","isRegex":false,"isEqual":true}],
        "startsAt":"2020-01-01T00:00:00Z","endsAt":"2099-01-01T00:00:00Z","createdBy":"test","comment":"storage work"}"#;
    let (status, body) = client
        .post_json(&format!("{url}/api/v2/silences"), silence.to_string())
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let silenced = until(&critical, &vars, GateResult::passes).await;
    assert_eq!(silenced.verdict, Verdict::Pass);

    // edge-02's alert is not silenced: its per-node gate still fails.
    let other = Vars {
        node: "edge-02".into(),
        ..Vars::default()
    };
    assert!(!evaluate(&critical, &other).await.passes());
}
