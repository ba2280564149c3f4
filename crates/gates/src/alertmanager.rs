//! Alertmanager gates: `GET /api/v2/alerts?active=true&silenced=false&inhibited=false&filter=…` must list no
//! alert. Each alert it lists that is active (or not yet processed) and neither silenced nor inhibited fails
//! the gate, quoted as `alertname{labels}`; the state is checked here too, so an Alertmanager that ignores a
//! filter parameter cannot make a silenced alert hold a change.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::quote;
use crate::result::Verdict;
use crate::vars::{Vars, check_template};

/// `alertmanager:` fields besides the endpoint's (`url`, `caFile`, `bearerTokenFile`, `timeoutSeconds`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AlertmanagerGate {
    /// Alertmanager filter matchers, all of which an alert must match (`severity="critical"`,
    /// `alertname=~"Storage.*"`, `node="{{node}}"`); `{{node}}`, `{{cluster}}`, `{{namespace}}` filled in.
    pub matchers: Vec<String>,
}

impl AlertmanagerGate {
    /// The field at fault and what is wrong with it.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.matchers.is_empty() {
            return Err((
                "matchers",
                "is empty: give at least one, e.g. severity=\"critical\" (every alert: alertname=~\".+\")"
                    .into(),
            ));
        }
        for matcher in &self.matchers {
            check_matcher(matcher)
                .and_then(|()| check_template(matcher))
                .map_err(|problem| ("matchers", format!("{matcher:?}: {problem}")))?;
        }
        Ok(())
    }

    /// Path and query string after the gate's URL.
    pub fn target(&self, vars: &Vars) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query
            .append_pair("active", "true")
            .append_pair("silenced", "false")
            .append_pair("inhibited", "false");
        for matcher in &self.matchers {
            query.append_pair("filter", &vars.fill(matcher));
        }
        format!("/api/v2/alerts?{}", query.finish())
    }
}

/// `label<op>value` with op one of `=`, `!=`, `=~`, `!~`; a quoted value is closed.
fn check_matcher(matcher: &str) -> Result<(), String> {
    let name_end = matcher
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(matcher.len());
    let (name, rest) = matcher.split_at(name_end);
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("must start with a label name, e.g. severity=\"critical\"".into());
    }
    let value = ["=~", "!~", "!=", "="]
        .iter()
        .find_map(|op| rest.strip_prefix(op))
        .ok_or("needs one of =, !=, =~, !~ after the label name")?;
    if value.starts_with('"') && (value.len() < 2 || !value.ends_with('"')) {
        return Err("has an unclosed quoted value".into());
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Alert {
    #[serde(default)]
    labels: BTreeMap<String, String>,
    status: Status,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    state: String,
    #[serde(default)]
    silenced_by: Vec<String>,
    #[serde(default)]
    inhibited_by: Vec<String>,
}

/// The verdict on an answer to `/api/v2/alerts` with HTTP status `status`.
pub fn judge(status: u16, body: &[u8]) -> Verdict {
    if !(200..300).contains(&status) {
        return unreachable(format!("answered HTTP {status}: {}", quote::snippet(body)));
    }
    let alerts: Vec<Alert> = match serde_json::from_slice(body) {
        Ok(alerts) => alerts,
        Err(err) => return unreachable(format!("not an Alertmanager alert list: {err}")),
    };
    let firing: Vec<String> = alerts
        .iter()
        .filter(|a| {
            matches!(a.status.state.as_str(), "active" | "unprocessed")
                && a.status.silenced_by.is_empty()
                && a.status.inhibited_by.is_empty()
        })
        .map(|a| {
            let name = a.labels.get("alertname").map_or("", String::as_str);
            let labels = a
                .labels
                .iter()
                .filter(|(key, _)| *key != "alertname")
                .map(|(key, value)| (key.as_str(), value.as_str()));
            quote::series(name, labels)
        })
        .collect();
    if firing.is_empty() {
        return Verdict::Pass;
    }
    let lead = match firing.len() {
        1 => "1 alert active".to_string(),
        n => format!("{n} alerts active"),
    };
    Verdict::Fail {
        quote: quote::list(&lead, &firing),
    }
}

fn unreachable(cause: String) -> Verdict {
    Verdict::Unreachable {
        cause: quote::cut(&cause),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert(state: &str, silenced: &str) -> String {
        format!(
            r#"{{"labels":{{"alertname":"StorageDegraded","severity":"critical","node":"edge-01"}},
               "annotations":{{}},"fingerprint":"ab","receivers":[{{"name":"null"}}],
               "startsAt":"2026-12-07T04:00:00Z","endsAt":"2026-12-07T05:00:00Z","updatedAt":"2026-12-07T04:00:00Z",
               "status":{{"state":"{state}","silencedBy":[{silenced}],"inhibitedBy":[]}}}}"#
        )
    }

    #[test]
    fn an_active_alert_fails_by_name_and_labels() {
        let body = format!("[{}]", alert("active", ""));
        assert_eq!(
            judge(200, body.as_bytes()),
            Verdict::Fail {
                quote: r#"1 alert active: StorageDegraded{node="edge-01",severity="critical"}"#
                    .into()
            }
        );
    }

    #[test]
    fn no_alert_and_silenced_or_suppressed_alerts_pass() {
        assert_eq!(judge(200, b"[]"), Verdict::Pass);
        let body = format!(
            "[{},{}]",
            alert("suppressed", r#""s1""#),
            alert("active", r#""s2""#)
        );
        assert_eq!(judge(200, body.as_bytes()), Verdict::Pass);
    }

    #[test]
    fn errors_are_unreachable() {
        assert!(
            matches!(judge(500, b"boom"), Verdict::Unreachable { cause } if cause == "answered HTTP 500: boom")
        );
        assert!(
            matches!(judge(200, b"{}"), Verdict::Unreachable { cause } if cause.starts_with("not an Alertmanager alert list"))
        );
    }

    #[test]
    fn matchers_are_checked_and_sent_as_filters() {
        let gate = |m: &[&str]| AlertmanagerGate {
            matchers: m.iter().map(|s| s.to_string()).collect(),
        };
        assert!(
            gate(&[
                r#"severity="critical""#,
                r#"alertname=~"Stor.*""#,
                "node!=x"
            ])
            .check()
            .is_ok()
        );
        for bad in [
            &[][..],
            &["=x"],
            &["severity"],
            &[r#"severity=""#],
            &[r#"node="{{host}}""#],
        ] {
            assert_eq!(gate(bad).check().unwrap_err().0, "matchers", "{bad:?}");
        }
        let vars = Vars {
            node: "edge-01".into(),
            ..Vars::default()
        };
        assert_eq!(
            gate(&[r#"node="{{node}}""#]).target(&vars),
            "/api/v2/alerts?active=true&silenced=false&inhibited=false&filter=node%3D%22edge-01%22"
        );
    }
}
