//! Prometheus gates: an instant query (`GET /api/v1/query`) that must return nothing. A vector or matrix
//! result fails when it has any series (each quoted as `name{labels} = value`); a scalar fails unless it is
//! exactly 0; a string result is not an answer a gate can judge (unreachable).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::quote;
use crate::result::Verdict;
use crate::vars::{Vars, check_template};

/// `prometheus:` fields besides the endpoint's (`url`, `caFile`, `bearerTokenFile`, `timeoutSeconds`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusGate {
    /// The PromQL instant query, with `{{node}}`, `{{cluster}}`, `{{namespace}}` filled in per Machine.
    pub query: String,
}

impl PrometheusGate {
    /// The field at fault and what is wrong with it.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.query.trim().is_empty() {
            return Err(("query", "is empty".into()));
        }
        check_template(&self.query).map_err(|problem| ("query", problem))
    }

    /// Path and query string after the gate's URL. Prometheus is told the timeout too, so it stops
    /// evaluating when the gate stops waiting.
    pub fn target(&self, vars: &Vars, timeout: Duration) -> String {
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", &vars.fill(&self.query))
            .append_pair("timeout", &format!("{}s", timeout.as_secs().max(1)))
            .finish();
        format!("/api/v1/query?{query}")
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    status: String,
    data: Option<Data>,
    error_type: Option<String>,
    error: Option<String>,
}

/// A sample: `[unix time, "value"]`.
type Point = (Value, String);

#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum Data {
    Vector(Vec<Sample>),
    Matrix(Vec<Range>),
    Scalar(Point),
    String(serde::de::IgnoredAny),
}

#[derive(Deserialize)]
struct Sample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: Option<Point>,
}

#[derive(Deserialize)]
struct Range {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<Point>,
}

/// The verdict on an answer to `/api/v1/query` with HTTP status `status`.
pub fn judge(status: u16, body: &[u8]) -> Verdict {
    let ok = (200..300).contains(&status);
    let answer = match serde_json::from_slice::<Answer>(body) {
        Ok(answer) => answer,
        Err(_) if !ok => {
            return unreachable(format!("answered HTTP {status}: {}", quote::snippet(body)));
        }
        Err(err) => return unreachable(format!("not a Prometheus query answer: {err}")),
    };
    if answer.status == "error" {
        return unreachable(format!(
            "query failed ({}): {}",
            answer.error_type.as_deref().unwrap_or("error"),
            answer.error.as_deref().unwrap_or("no error text")
        ));
    }
    if !ok || answer.status != "success" {
        return unreachable(format!("answered HTTP {status}: {}", quote::snippet(body)));
    }
    match answer.data {
        None => unreachable("not a Prometheus query answer: no data".into()),
        Some(Data::Vector(samples)) => failing_series(
            samples
                .iter()
                .map(|s| render(&s.metric, s.value.as_ref().map_or("(histogram)", |p| &p.1)))
                .collect(),
        ),
        Some(Data::Matrix(ranges)) => failing_series(
            ranges
                .iter()
                .map(|r| render(&r.metric, r.values.last().map_or("(histogram)", |p| &p.1)))
                .collect(),
        ),
        Some(Data::Scalar((_, value))) => match value.trim().parse::<f64>() {
            Ok(0.0) => Verdict::Pass,
            Ok(_) => Verdict::Fail {
                quote: quote::cut(&format!("query returned scalar {value} (not 0)")),
            },
            Err(_) => unreachable(format!("query returned scalar {value:?}, not a number")),
        },
        Some(Data::String(_)) => {
            unreachable("query returned a string; a gate needs a vector or a scalar".into())
        }
    }
}

fn failing_series(series: Vec<String>) -> Verdict {
    if series.is_empty() {
        return Verdict::Pass;
    }
    Verdict::Fail {
        quote: quote::list(&format!("query returned {} series", series.len()), &series),
    }
}

/// `ALERTS{alertname="StorageDegraded",severity="critical"} = 1`.
fn render(metric: &BTreeMap<String, String>, value: &str) -> String {
    let name = metric.get("__name__").map_or("", String::as_str);
    let labels = metric
        .iter()
        .filter(|(key, _)| *key != "__name__")
        .map(|(key, value)| (key.as_str(), value.as_str()));
    let series = quote::series(name, labels);
    let series = if series.is_empty() {
        "{}".into()
    } else {
        series
    };
    format!("{series} = {value}")
}

fn unreachable(cause: String) -> Verdict {
    Verdict::Unreachable {
        cause: quote::cut(&cause),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail_quote(verdict: Verdict) -> String {
        match verdict {
            Verdict::Fail { quote } => quote,
            other => panic!("not a failure: {other:?}"),
        }
    }

    fn cause(verdict: Verdict) -> String {
        match verdict {
            Verdict::Unreachable { cause } => cause,
            other => panic!("not unreachable: {other:?}"),
        }
    }

    #[test]
    fn an_empty_vector_passes() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(judge(200, body), Verdict::Pass);
    }

    #[test]
    fn a_series_fails_quoted_like_prometheus() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"severity":"critical","__name__":"ALERTS","alertname":"StorageDegraded"},"value":[1765000000.1,"1"]}]}}"#;
        assert_eq!(
            fail_quote(judge(200, body)),
            r#"query returned 1 series: ALERTS{alertname="StorageDegraded",severity="critical"} = 1"#
        );
    }

    #[test]
    fn many_series_are_quoted_first_few_and_counted() {
        let result: Vec<String> = (0..7)
            .map(|i| format!(r#"{{"metric":{{"node":"n{i}"}},"value":[1,"{i}"]}}"#))
            .collect();
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
            result.join(",")
        );
        assert_eq!(
            fail_quote(judge(200, body.as_bytes())),
            r#"query returned 7 series: {node="n0"} = 0; {node="n1"} = 1; {node="n2"} = 2 and 4 more"#
        );
    }

    #[test]
    fn a_scalar_passes_only_at_zero() {
        let scalar = |v: &str| {
            format!(r#"{{"status":"success","data":{{"resultType":"scalar","result":[1,"{v}"]}}}}"#)
        };
        assert_eq!(judge(200, scalar("0").as_bytes()), Verdict::Pass);
        assert_eq!(
            fail_quote(judge(200, scalar("2").as_bytes())),
            "query returned scalar 2 (not 0)"
        );
        assert!(!matches!(
            judge(200, scalar("NaN").as_bytes()),
            Verdict::Pass
        ));
    }

    #[test]
    fn a_matrix_with_series_fails_on_its_last_value() {
        let body = br#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"__name__":"up"},"values":[[1,"1"],[2,"0"]]}]}}"#;
        assert_eq!(
            fail_quote(judge(200, body)),
            "query returned 1 series: up = 0"
        );
    }

    #[test]
    fn errors_and_garbage_are_unreachable_with_the_reason() {
        let error =
            br#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected"}"#;
        assert_eq!(
            cause(judge(400, error)),
            "query failed (bad_data): 1:5: parse error: unexpected"
        );
        assert_eq!(
            cause(judge(503, b"Service Unavailable\n")),
            "answered HTTP 503: Service Unavailable"
        );
        assert!(cause(judge(200, b"<html>")).starts_with("not a Prometheus query answer"));
        let string = br#"{"status":"success","data":{"resultType":"string","result":[1,"x"]}}"#;
        assert!(cause(judge(200, string)).contains("a string"));
    }

    #[test]
    fn the_target_encodes_the_filled_query() {
        let gate = PrometheusGate {
            query: r#"degraded{node="{{node}}"} > 0"#.into(),
        };
        let vars = Vars {
            node: "edge-01".into(),
            ..Vars::default()
        };
        assert_eq!(
            gate.target(&vars, Duration::from_secs(10)),
            "/api/v1/query?query=degraded%7Bnode%3D%22edge-01%22%7D+%3E+0&timeout=10s"
        );
    }
}
