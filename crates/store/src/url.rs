//! `--store` URLs (`memory:`, `file:DIR`, `etcd://HOST:PORT[,…]`) and the etcd connection options
//! that go with them.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::StoreError;

/// The port an etcd endpoint without one gets (etcd's registered client port).
pub const DEFAULT_ETCD_PORT: u16 = 2379;

/// The key namespace in etcd unless `--etcd-prefix` says otherwise: everything we store lives under
/// it, so one etcd can serve other tenants (or a second updater with another prefix).
pub const DEFAULT_ETCD_PREFIX: &str = "/inplace-updater/";

/// How long connecting to etcd at startup may take before [`crate::open`] gives up.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one etcd request may take before it fails as [`StoreError::Unavailable`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the state lives, parsed from a `--store` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory:` — nothing survives the process; for tests.
    Memory,
    /// `file:DIR` (`file:./data`, `file:/var/lib/x`, `file:///var/lib/x`) — embedded redb in DIR.
    File(PathBuf),
    /// `etcd://h1:2379,h2:2379` — the endpoints as `host:port`.
    Etcd(Vec<String>),
}

impl FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<StoreUrl, StoreError> {
        let bad = |msg: String| StoreError::InvalidUrl(msg);
        let Some((scheme, rest)) = s.split_once(':') else {
            return Err(bad(format!(
                "`{}` has no scheme; expected memory:, file:DIR or etcd://HOST:PORT[,HOST:PORT…]",
                s.escape_debug()
            )));
        };
        match scheme {
            "memory" if rest.is_empty() || rest == "//" => Ok(StoreUrl::Memory),
            "memory" => Err(bad("memory: takes nothing after the colon".into())),
            "file" => parse_file(rest).map(StoreUrl::File),
            "etcd" => parse_etcd(rest).map(StoreUrl::Etcd),
            other => Err(bad(format!(
                "unknown scheme `{}`; expected memory:, file:DIR or etcd://HOST:PORT[,HOST:PORT…]",
                other.escape_debug()
            ))),
        }
    }
}

fn parse_file(rest: &str) -> Result<PathBuf, StoreError> {
    let path = match rest.strip_prefix("//") {
        // file:///abs/path — the URL form; a host part (file://host/x) means nothing to us.
        Some(after) if after.starts_with('/') => after,
        Some(_) => {
            return Err(StoreError::InvalidUrl(
                "file:// URLs need an absolute path (file:///var/lib/x) — or write file:./relative"
                    .into(),
            ));
        }
        None => rest,
    };
    if path.is_empty() {
        return Err(StoreError::InvalidUrl(
            "file: needs a directory, e.g. file:./data".into(),
        ));
    }
    Ok(PathBuf::from(path))
}

fn parse_etcd(rest: &str) -> Result<Vec<String>, StoreError> {
    let bad = |msg: String| Err(StoreError::InvalidUrl(msg));
    let Some(list) = rest.strip_prefix("//") else {
        return bad("etcd URLs look like etcd://HOST:PORT[,HOST:PORT…]".into());
    };
    if list.contains('@') {
        // Never echo this part back: it may hold a password.
        return bad(
            "credentials do not belong in the etcd URL; use the etcd user/password options".into(),
        );
    }
    if list.contains('/') || list.contains('?') {
        return bad(format!(
            "`etcd://{}` has a path or query; the key namespace is the etcd prefix option",
            list.escape_debug()
        ));
    }
    let endpoints = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(parse_endpoint)
        .collect::<Result<Vec<_>, _>>()?;
    if endpoints.is_empty() {
        return bad("etcd URL names no endpoint: etcd://HOST:PORT[,HOST:PORT…]".into());
    }
    Ok(endpoints)
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` → `host:port`.
fn parse_endpoint(e: &str) -> Result<String, StoreError> {
    let bad = |why: &str| {
        Err(StoreError::InvalidUrl(format!(
            "etcd endpoint `{}`: {why}",
            e.escape_debug()
        )))
    };
    let (host, port) = if let Some(v6) = e.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return bad("missing `]` after the IPv6 address");
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return bad("not an IPv6 address inside [ ]");
        }
        match after {
            "" => (format!("[{addr}]"), None),
            p => match p.strip_prefix(':') {
                Some(p) => (format!("[{addr}]"), Some(p)),
                None => return bad("expected `:PORT` after `]`"),
            },
        }
    } else {
        match e.split_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (e.to_owned(), None),
        }
    };
    if host.is_empty() {
        return bad("no host");
    }
    if !host.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    {
        return bad("the host may only hold letters, digits, `-`, `_` and `.`");
    }
    let port = match port {
        None => DEFAULT_ETCD_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) => return bad("port 0"),
            Ok(p) => p,
            Err(_) => return bad("the port is not a number from 1 to 65535"),
        },
    };
    Ok(format!("{host}:{port}"))
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::File(dir) => write!(f, "file:{}", dir.display()),
            StoreUrl::Etcd(endpoints) => write!(f, "etcd://{}", endpoints.join(",")),
        }
    }
}

/// How to reach etcd: TLS files, credentials, key namespace and timeouts. Ignored by the other
/// backends. TLS is on when any of `ca`, `cert`, `key` is set.
#[derive(Clone)]
pub struct EtcdOptions {
    /// CA bundle (PEM) that signed etcd's server certificate.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's `--client-cert-auth`; needs `key`.
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of `cert`.
    pub key: Option<PathBuf>,
    /// etcd user (etcd auth enabled); needs `password`.
    pub user: Option<String>,
    /// Password of `user`. Never printed by `Debug`.
    pub password: Option<String>,
    /// Key namespace: every key is stored as `prefix + key`. Default [`DEFAULT_ETCD_PREFIX`].
    pub prefix: String,
    /// Startup connection deadline. Default [`DEFAULT_DIAL_TIMEOUT`].
    pub dial_timeout: Duration,
    /// Per-request deadline. Default [`DEFAULT_REQUEST_TIMEOUT`].
    pub request_timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> EtcdOptions {
        EtcdOptions {
            ca: None,
            cert: None,
            key: None,
            user: None,
            password: None,
            prefix: DEFAULT_ETCD_PREFIX.to_owned(),
            dial_timeout: DEFAULT_DIAL_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

impl fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("prefix", &self.prefix)
            .field("dial_timeout", &self.dial_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<StoreUrl, String> {
        s.parse::<StoreUrl>().map_err(|e| e.to_string())
    }

    #[test]
    fn good_urls() {
        assert_eq!(parse("memory:"), Ok(StoreUrl::Memory));
        assert_eq!(parse("file:./data"), Ok(StoreUrl::File("./data".into())));
        assert_eq!(
            parse("file:/var/lib/x"),
            Ok(StoreUrl::File("/var/lib/x".into()))
        );
        assert_eq!(
            parse("file:///var/lib/x"),
            Ok(StoreUrl::File("/var/lib/x".into()))
        );
        assert_eq!(
            parse("etcd://h1:2379,h2:2380"),
            Ok(StoreUrl::Etcd(vec!["h1:2379".into(), "h2:2380".into()]))
        );
        assert_eq!(
            parse("etcd://etcd.kube-system.svc, [::1]:3000 ,[fe80::1]"),
            Ok(StoreUrl::Etcd(vec![
                "etcd.kube-system.svc:2379".into(),
                "[::1]:3000".into(),
                "[fe80::1]:2379".into()
            ]))
        );
    }

    #[test]
    fn display_round_trips() {
        for s in ["memory:", "file:./data", "etcd://a:1,b:2"] {
            assert_eq!(parse(s).unwrap().to_string(), s);
            assert_eq!(parse(&parse(s).unwrap().to_string()), parse(s));
        }
    }

    #[test]
    fn bad_urls_name_the_problem() {
        for (url, needle) in [
            ("", "no scheme"),
            ("./data", "no scheme"),
            ("redis://x", "unknown scheme `redis`"),
            ("memory:x", "nothing after"),
            ("file:", "needs a directory"),
            ("file://host/x", "absolute path"),
            ("etcd:h1", "etcd://HOST:PORT"),
            ("etcd://", "no endpoint"),
            ("etcd://,", "no endpoint"),
            ("etcd://h1:abc", "`h1:abc`: the port is not a number"),
            ("etcd://h1:0", "port 0"),
            ("etcd://h1:70000", "not a number from 1 to 65535"),
            ("etcd://:2379", "no host"),
            ("etcd://h1:2379/ns", "path or query"),
            ("etcd://[::1", "missing `]`"),
            ("etcd://[zz]:1", "not an IPv6"),
            ("etcd://h$t:1", "host may only"),
        ] {
            let err = parse(url).expect_err(url);
            assert!(err.contains(needle), "{url:?}: {err}");
        }
    }

    #[test]
    fn credentials_in_url_are_refused_without_echo() {
        let err = parse("etcd://root:hunter2@h1:2379").unwrap_err();
        assert!(err.contains("credentials"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn debug_hides_the_password() {
        let options = EtcdOptions {
            user: Some("root".into()),
            password: Some("hunter2".into()),
            ..EtcdOptions::default()
        };
        let shown = format!("{options:?}");
        assert!(
            shown.contains("root") && shown.contains("<redacted>"),
            "{shown}"
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(options.prefix, DEFAULT_ETCD_PREFIX);
    }
}
