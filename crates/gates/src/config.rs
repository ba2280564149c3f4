//! The gates file (`serve --gates-file`): a list of named gates, each one kind with its endpoint. Checked
//! whole at start-up: unknown keys, a URL that is not http(s) or carries credentials, an unreadable CA or token
//! file, a placeholder that does not exist — each refused with the gate and field it is about.
//!
//! ```yaml
//! gates:
//!   - name: storage
//!     prometheus:
//!       url: https://prometheus.monitoring:9090
//!       query: 'site_storage_degraded{node="{{node}}"} > 0'
//!       caFile: prometheus-ca.crt        # relative to the gates file
//!       bearerTokenFile: /var/run/secrets/prometheus/token
//!       timeoutSeconds: 5
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

use crate::fetch::{client_tls, read_token};
use crate::kind::GateKind;
use crate::result::GateLabel;

/// A gate's timeout when its `timeoutSeconds` is not set: connect, ask, read the answer.
pub const DEFAULT_GATE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest `timeoutSeconds` a gate may set.
pub const MAX_GATE_TIMEOUT: Duration = Duration::from_secs(300);

/// Largest gates file read.
pub const MAX_GATES_FILE_BYTES: u64 = 1024 * 1024;

/// Most gates in one file (every one is asked, at once, before each Machine).
pub const MAX_GATES: usize = 64;

/// Longest gate name (a DNS label: it is a store key segment).
pub const MAX_GATE_NAME_BYTES: usize = 63;

/// Where and how to ask: fields every kind has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http://` or `https://` base URL, no trailing `/` (a path prefix is kept: `https://host/prometheus`).
    pub url: String,
    /// PEM CA bundle trusted for an `https` URL instead of the system CA store.
    pub ca_file: Option<PathBuf>,
    /// File holding a bearer token, read before every request.
    pub bearer_token_file: Option<PathBuf>,
    /// The whole exchange's timeout.
    pub timeout: Duration,
}

/// One gate of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// Its name (lower-case letters, digits and `-`, at most [`MAX_GATE_NAME_BYTES`]).
    pub name: String,
    /// Where it asks.
    pub endpoint: Endpoint,
    /// What it asks.
    pub kind: GateKind,
}

impl Gate {
    /// How messages name it.
    pub fn label(&self) -> GateLabel {
        GateLabel {
            name: self.name.clone(),
            kind: self.kind.key(),
            url: self.endpoint.url.clone(),
        }
    }
}

/// Every gate of the gates file; empty when the server has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gates {
    gates: Vec<Gate>,
}

/// Why a gates file was refused.
#[derive(Debug, thiserror::Error)]
pub enum GatesError {
    /// The file could not be read (or is larger than [`MAX_GATES_FILE_BYTES`]).
    #[error(transparent)]
    Read(#[from] inplace_bounded_read::ReadError),
    /// The file is not YAML of the expected shape (a top-level `gates:` list).
    #[error("not a gates file (a top-level `gates:` list): {0}")]
    Shape(#[source] serde_yaml_ng::Error),
    /// More gates than [`MAX_GATES`].
    #[error("{count} gates; at most {MAX_GATES}")]
    TooMany {
        /// How many the file has.
        count: usize,
    },
    /// One gate is wrong.
    #[error("gate {gate}: {field}: {problem}")]
    Gate {
        /// Its name, or `#N` (1-based) when it has none.
        gate: String,
        /// The field at fault, e.g. `prometheus.url`.
        field: String,
        /// What is wrong (never a file's contents).
        problem: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    gates: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EndpointFields {
    url: Option<String>,
    ca_file: Option<PathBuf>,
    bearer_token_file: Option<PathBuf>,
    timeout_seconds: Option<u64>,
}

const ENDPOINT_KEYS: [&str; 4] = ["url", "caFile", "bearerTokenFile", "timeoutSeconds"];

impl Gates {
    /// No gates: every evaluation of an empty list passes.
    pub fn none() -> Self {
        Self::default()
    }

    /// Reads and checks the gates file at `path`; relative `caFile` and `bearerTokenFile` paths are taken
    /// from the file's directory.
    pub fn load(path: &Path) -> Result<Self, GatesError> {
        let text = inplace_bounded_read::read_to_string(path, MAX_GATES_FILE_BYTES)?;
        Self::from_yaml(&text, path.parent().unwrap_or(Path::new(".")))
    }

    /// Parses and checks a gates file's text; relative paths are taken from `base`.
    pub fn from_yaml(text: &str, base: &Path) -> Result<Self, GatesError> {
        if text.trim().is_empty() {
            return Ok(Self::none());
        }
        let file: File = serde_yaml_ng::from_str(text).map_err(GatesError::Shape)?;
        if file.gates.len() > MAX_GATES {
            return Err(GatesError::TooMany {
                count: file.gates.len(),
            });
        }
        let mut gates: Vec<Gate> = Vec::with_capacity(file.gates.len());
        for (index, entry) in file.gates.into_iter().enumerate() {
            let gate = parse_gate(index, entry, base)?;
            if gates.iter().any(|other| other.name == gate.name) {
                return Err(fault(&gate.name, "name", "used by an earlier gate too"));
            }
            gates.push(gate);
        }
        Ok(Self { gates })
    }

    /// The gates, in file order.
    pub fn list(&self) -> &[Gate] {
        &self.gates
    }

    /// The gate called `name`.
    pub fn get(&self, name: &str) -> Option<&Gate> {
        self.gates.iter().find(|gate| gate.name == name)
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.gates.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.gates.is_empty()
    }
}

fn fault(gate: &str, field: impl Into<String>, problem: impl Into<String>) -> GatesError {
    GatesError::Gate {
        gate: gate.to_string(),
        field: field.into(),
        problem: problem.into(),
    }
}

fn parse_gate(index: usize, entry: Value, base: &Path) -> Result<Gate, GatesError> {
    let position = format!("#{}", index + 1);
    let Value::Mapping(mut entry) = entry else {
        return Err(fault(
            &position,
            "(gate)",
            "is not a mapping with `name` and a kind",
        ));
    };
    let name = match entry.remove("name") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(fault(&position, "name", "is not a string")),
        None => return Err(fault(&position, "name", "is missing")),
    };
    if !valid_name(&name) {
        return Err(fault(
            &position,
            "name",
            format!(
                "{name:?} is not a name: lower-case letters, digits and '-', at most {MAX_GATE_NAME_BYTES}"
            ),
        ));
    }
    let kinds = GateKind::KEYS.join(", ");
    let mut fields = entry.into_iter();
    let (key, value) = match (fields.next(), fields.next()) {
        (Some((Value::String(key), value)), None) => (key, value),
        (None, _) => {
            return Err(fault(
                &name,
                "(kind)",
                format!("is missing: give one of {kinds}"),
            ));
        }
        _ => {
            return Err(fault(
                &name,
                "(kind)",
                format!("a gate has `name` and exactly one of {kinds}"),
            ));
        }
    };
    let Value::Mapping(mut spec) = value else {
        return Err(fault(&name, &key, "is not a mapping"));
    };
    let mut endpoint_fields = Mapping::new();
    for field in ENDPOINT_KEYS {
        if let Some(value) = spec.remove(field) {
            endpoint_fields.insert(Value::String(field.into()), value);
        }
    }
    let endpoint: EndpointFields = serde_yaml_ng::from_value(Value::Mapping(endpoint_fields))
        .map_err(|err| fault(&name, &key, err.to_string()))?;
    let kind = match GateKind::parse(&key, Value::Mapping(spec)) {
        None => {
            return Err(fault(
                &name,
                &key,
                format!("unknown key: a gate has `name` and one of {kinds}"),
            ));
        }
        Some(parsed) => parsed.map_err(|err| fault(&name, &key, err.to_string()))?,
    };
    kind.check()
        .map_err(|(field, problem)| fault(&name, format!("{key}.{field}"), problem))?;
    let endpoint = check_endpoint(endpoint, base)
        .map_err(|(field, problem)| fault(&name, format!("{key}.{field}"), problem))?;
    Ok(Gate {
        name,
        endpoint,
        kind,
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_GATE_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn check_endpoint(fields: EndpointFields, base: &Path) -> Result<Endpoint, (&'static str, String)> {
    let url = fields.url.ok_or(("url", "is missing".to_string()))?;
    let url = check_url(&url).map_err(|problem| ("url", problem))?;
    let timeout = match fields.timeout_seconds {
        None => DEFAULT_GATE_TIMEOUT,
        Some(seconds) if (1..=MAX_GATE_TIMEOUT.as_secs()).contains(&seconds) => {
            Duration::from_secs(seconds)
        }
        Some(seconds) => {
            return Err((
                "timeoutSeconds",
                format!("{seconds} is out of range 1–{}", MAX_GATE_TIMEOUT.as_secs()),
            ));
        }
    };
    let ca_file = fields.ca_file.map(|path| base.join(path));
    if let Some(path) = &ca_file {
        client_tls(Some(path)).map_err(|problem| ("caFile", problem))?;
    }
    let bearer_token_file = fields.bearer_token_file.map(|path| base.join(path));
    if let Some(path) = &bearer_token_file {
        read_token(path).map_err(|problem| ("bearerTokenFile", problem))?;
    }
    Ok(Endpoint {
        url,
        ca_file,
        bearer_token_file,
        timeout,
    })
}

/// The URL without a trailing `/`, or what is wrong with it.
fn check_url(url: &str) -> Result<String, String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|err| format!("{url:?} is not a URL: {err}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!("{url:?} must start with http:// or https://"));
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("{url:?} has no host"));
    };
    if authority.as_str().contains('@') {
        return Err("must not carry credentials (user:password@); use bearerTokenFile".into());
    }
    if uri.query().is_some() {
        return Err(format!("{url:?} must not have a query string"));
    }
    Ok(url.trim_end_matches('/').to_string())
}
