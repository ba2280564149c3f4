"""deploy/components/monitoring: the PrometheusRule and the Grafana dashboard, validated offline (promtool and
Grafana are not available): their structure, that their PromQL is well formed as far as a bracket and
selector check can tell, and that every metric they name — and every label value they select on — is
exported by a real server's /metrics after a real hook call and a recorded update.
"""

from __future__ import annotations

import http.client
import json
import pathlib
import re
import ssl

import pytest

import deploylib as d
import procs

MONITORING = d.DEPLOY / "components" / "monitoring"
RULE_FILE = MONITORING / "prometheusrule.yaml"
DASHBOARD_FILE = MONITORING / "grafana-dashboard.json"
PRODUCTION = d.DEPLOY / "overlays" / "production"
UPDATE_MACHINE = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/updatemachine/update-machine"
CAN_UPDATE_MACHINE_SET = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachineset/can-update-machineset"
DISCOVERY = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery"
FIXTURES = d.REPO / "tests" / "fixtures"
# Bound on one HTTP call to the sandboxed server.
HTTP_TIMEOUT_S = 10

# What the alerts must cover (issue 16): a failed update, a stuck one, a missing agent, refused agents.
REQUIRED_ALERTS = {"InPlaceUpdateFailed", "InPlaceUpdateStuck", "InPlaceUpdaterAgentMissing", "InPlaceUpdaterAgentsRefused"}
SEVERITIES = {"info", "warning", "critical"}
PROM_DURATION = re.compile(r"^(0|([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?)$")
# Our metric names: everything under our prefix, plus the standard process metrics.
METRIC = re.compile(r"\b(inplace_updater_[a-z0-9_]+|process_[a-z0-9_]+)\b")
# `name{label="value", ...}`: equality matchers on a metric we export.
SELECTOR = re.compile(r"\b(inplace_updater_[a-z0-9_]+|process_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
# Labels Prometheus adds to every scraped series (not exported by the server).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}


def rule_doc() -> dict:
    return d.load_yaml_docs(RULE_FILE)[0]


def rules() -> list[dict]:
    return [r for g in rule_doc()["spec"]["groups"] for r in g["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD_FILE.read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def all_exprs() -> list[str]:
    return [str(r["expr"]) for r in rules()] + dashboard_exprs()


def promql_problems(expr: str) -> list[str]:
    """What a bracket-and-selector check finds wrong with a PromQL expression (empty: looks well formed)."""
    problems = []
    text = re.sub(r'"[^"\\]*(?:\\.[^"\\]*)*"', '""', expr)
    if text.count('"') % 2:
        problems.append("unbalanced quotes")
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for ch in text:
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                problems.append(f"unbalanced {ch}")
                break
    if stack:
        problems.append(f"unclosed {''.join(stack)}")
    for window in re.findall(r"\[([^\]]*)\]", text):
        if not PROM_DURATION.match(window) or window == "0":
            problems.append(f"bad range [{window}]")
    for _, matchers in SELECTOR.findall(expr):
        for part in filter(None, (m.strip() for m in matchers.split(","))):
            if not MATCHER.fullmatch(part):
                problems.append(f"bad matcher {part!r}")
    if not METRIC.search(expr):
        problems.append("names none of our metrics")
    return problems


# ---------------------------------------------------------------- the PrometheusRule


def test_the_rule_file_is_a_prometheus_rule_the_schema_accepts():
    doc = rule_doc()
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert not d.validation_errors(doc)


def test_every_alert_is_named_once_with_a_severity_a_wait_and_words_for_the_operator():
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)), names
    assert REQUIRED_ALERTS <= set(names), REQUIRED_ALERTS - set(names)
    for rule in rules():
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", rule["alert"]), rule["alert"]
        assert PROM_DURATION.match(rule["for"]) and rule["for"] != "0", rule
        assert rule["labels"]["severity"] in SEVERITIES, rule
        for key in ("summary", "description"):
            assert rule["annotations"][key].strip(), f"{rule['alert']}: no {key}"


@pytest.mark.parametrize("expr", [str(r["expr"]) for r in rules()], ids=[r["alert"] for r in rules()])
def test_every_alert_expression_is_well_formed(expr):
    assert not promql_problems(expr), promql_problems(expr)


def test_fleet_gauges_are_not_summed_over_replicas():
    """Every replica reports the same fleet-wide gauges: a sum would count each update once per replica."""
    for expr in all_exprs():
        for gauge in ("inplace_updater_updates", "inplace_updater_agent_last_seen_timestamp_seconds",
                      "inplace_updater_update_stalled_since_timestamp_seconds"):
            assert not re.search(rf"sum\s*(by\s*\([^)]*\)\s*)?\(\s*[^()]*\b{gauge}\b", expr), expr


# ---------------------------------------------------------------- the Grafana dashboard


def test_the_dashboard_is_a_grafana_dashboard():
    dash = dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "inplace_updater_build_info" in variables["job"]["definition"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], int] = {}
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps panel {cells[(x, y)]}"
                cells[(x, y)] = panel["id"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert not promql_problems(target["expr"]), (panel["title"], promql_problems(target["expr"]))
            assert 'job=~"$job"' in target["expr"], f"{panel['title']}: not filtered by the job variable"


def test_the_dashboard_configmap_is_the_file_and_labelled_for_the_sidecar():
    objs = d.render(PRODUCTION)
    cm = d.one(objs, "ConfigMap", "inplace-updater-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "inplace-updater-system"
    assert json.loads(cm["data"]["inplace-updater.json"]) == dashboard()
    rule = d.one(objs, "PrometheusRule", "inplace-updater")
    assert rule["spec"] == rule_doc()["spec"]


# ---------------------------------------------------------------- against a real server's /metrics


def exported(metrics_text: str) -> dict[str, list[dict[str, str]]]:
    """Every exported series name with the label sets it has."""
    series: dict[str, list[dict[str, str]]] = {}
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        assert m, f"not an exposition line: {line!r}"
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        series.setdefault(m.group(1), []).append(labels)
    return series


def unexported(exprs: list[str], series: dict[str, list[dict[str, str]]]) -> list[str]:
    """Metric names and label selections the expressions use that the server does not export."""
    missing = []
    for expr in exprs:
        for name in METRIC.findall(expr):
            if name not in series:
                missing.append(f"{name} (in {expr})")
        for name, matchers in SELECTOR.findall(expr):
            for label, op, value in MATCHER.findall(matchers):
                if label in TARGET_LABELS or op != "=" or name not in series:
                    continue
                if not any(labels.get(label) == value for labels in series[name]):
                    missing.append(f'{name}{{{label}="{value}"}} (in {expr})')
    return missing


def https_post(hooks: str, ca: pathlib.Path, path: str, body: bytes) -> int:
    host, port = hooks.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=HTTP_TIMEOUT_S)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def scrape(metrics: str) -> str:
    host, port = metrics.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=HTTP_TIMEOUT_S)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, list[dict[str, str]]]:
    """The series of a real server after one discovery call and one recorded (waiting) update."""
    certs = tmp_path_factory.mktemp("certs")
    made = d.run_binary("certs", "--out", str(certs))
    assert made.returncode == 0, made.stderr
    proc = procs.Proc(
        [str(d.binary()), "--log-format", "json", "serve", "--listen", "127.0.0.1:0", "--health-listen",
         "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--tls-cert", str(certs / "tls.crt"), "--tls-key",
         str(certs / "tls.key"), "--store", "memory:"],
        env={"PATH": "/usr/bin:/bin", "RUST_LOG": "info"},
    )
    try:
        listening = proc.wait_for_json("listening")["fields"]
        assert https_post(listening["hooks"], certs / "ca.crt", DISCOVERY,
                          (FIXTURES / "discovery-request.json").read_bytes()) == 200
        # As CAPI does: the MachineDeployment asks CanUpdateMachineSet first, and UpdateMachine is recorded only
        # for a desired state such an answer accepted.
        assert https_post(listening["hooks"], certs / "ca.crt", CAN_UPDATE_MACHINE_SET,
                          (FIXTURES / "can-update-machineset-md.json").read_bytes()) == 200
        assert https_post(listening["hooks"], certs / "ca.crt", UPDATE_MACHINE,
                          (FIXTURES / "update-machine-worker.json").read_bytes()) == 200
        text = ""

        def waiting_update_counted() -> bool:
            nonlocal text
            text = scrape(listening["metrics"])
            return 'inplace_updater_updates{state="recorded"} 1' in text

        procs.wait_until(waiting_update_counted, "the recorded update in /metrics")
        return exported(text)
    finally:
        assert proc.stop() == 0, proc.output()


def test_every_metric_the_rules_and_the_dashboard_use_is_exported(served):
    assert not unexported(all_exprs(), served), unexported(all_exprs(), served)


def test_the_export_check_can_fail(served):
    assert unexported(["inplace_updater_no_such_metric"], served)
    assert unexported(['max(inplace_updater_updates{state="exploded"})'], served)
    assert not unexported(['max(inplace_updater_updates{state="failed"})'], served)
    assert promql_problems("sum(rate(inplace_updater_hook_calls_total[5x])")
    assert promql_problems('inplace_updater_updates{state=failed}')


def metric_families(series: dict[str, list[dict[str, str]]]) -> dict[str, set[str]]:
    """Exported metric families (a histogram's _bucket/_sum/_count folded into its name) with their label names."""
    families: dict[str, set[str]] = {}
    for name, label_sets in series.items():
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        family = base if f"{base}_bucket" in series else name
        families.setdefault(family, set()).update(k for labels in label_sets for k in labels if k != "le")
    return families


def documented_metrics() -> dict[str, set[str]]:
    """docs/operations.md's Metrics table: each name with the labels it lists."""
    section = (d.REPO / "docs" / "operations.md").read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                table[name] = set(re.findall(r"`([a-z_]+)`", cells[2]))
    return table


def test_the_operations_metrics_table_is_what_the_server_exports(served):
    documented, families = documented_metrics(), metric_families(served)
    assert not set(families) - set(documented), f"exported, not documented: {sorted(set(families) - set(documented))}"
    # A labelled counter shows up only once counted (a TLS reload): then it must at least be registered.
    code = "\n".join(p.read_text() for p in (d.REPO / "src").rglob("*.rs"))
    unregistered = [n for n in set(documented) - set(families)
                    if f'"{re.sub(r"^inplace_updater_|_total$", "", n)}"' not in code]
    assert not unregistered, f"documented, but neither exported nor registered: {unregistered}"
    for name, labels in families.items():
        assert labels == documented[name] or (not labels and documented[name]), (name, labels, documented[name])


def test_the_metrics_table_check_can_fail():
    families = metric_families({"a_seconds_bucket": [{"le": "1", "x": "y"}], "a_seconds_sum": [{}], "b_total": [{}]})
    assert families == {"a_seconds": {"x"}, "b_total": set()}
    assert "inplace_updater_updates" in documented_metrics()
