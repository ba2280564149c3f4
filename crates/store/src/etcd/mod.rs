//! `etcd://HOST:PORT[,…]` — etcd v3 (the store Kubernetes itself runs on), so 2+ server replicas
//! share state.
//!
//! Every key is stored as `prefix + key`. A [`Revision`] is etcd's `mod_revision`; conditional
//! writes are one etcd transaction comparing `mod_revision` (or `create_revision == 0` for
//! [`Precondition::Absent`]), whose failure branch reads the key so a conflict returns the current
//! entry in the same round trip; a multi-key [`Store::commit`] is one such transaction over all its
//! keys ([`txn`]). `list` pages through a range pinned to one revision. The change
//! feed is one etcd watch on the prefix ([`watch`]), so a write by any replica reaches every
//! replica's subscribers.

mod txn;
mod watch;

use txn::guarded;

pub use watch::{RECONNECT_BACKOFF_MAX, RECONNECT_BACKOFF_MIN};

use std::path::Path;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KvClient,
    ResponseHeader, TlsOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::sync::broadcast;

use crate::txn::check_txn;
use crate::{
    BoxFuture, CHANGE_FEED_CAPACITY, Change, Entry, EtcdOptions, Precondition, Revision, Store,
    StoreError, Write, check_key, check_put,
};

/// Keys per `list` page. With values of at most [`crate::MAX_VALUE_BYTES`] a page stays under
/// [`MAX_RESPONSE_BYTES`].
pub const LIST_PAGE_KEYS: i64 = 100;

/// Largest gRPC answer we accept from etcd (tonic's default of 4 MiB is too small for a full list
/// page of large values).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// HTTP/2 ping interval on the etcd connection: finds a dead peer (or a silent network partition)
/// even while the only traffic is an idle watch.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a keep-alive ping may go unanswered before the connection is dropped and redialled.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest etcd CA, client certificate or client key file read (`--etcd-ca`, `--etcd-cert`, `--etcd-key`).
pub const MAX_TLS_FILE_BYTES: u64 = 1024 * 1024;

/// The etcd store.
pub struct EtcdStore {
    kv: KvClient,
    prefix: String,
    /// "etcd h1:2379,h2:2379" — used in errors and `describe`.
    target: String,
    details: String,
    request_timeout: Duration,
    changes: broadcast::Sender<Change>,
    /// Aborts the watch task when the store is dropped.
    _watch: watch::WatchTask,
}

impl EtcdStore {
    /// Connects to `endpoints` (`host:port`), checks that etcd answers within
    /// `options.dial_timeout` and starts the watch behind [`Store::subscribe`].
    pub async fn connect(
        endpoints: &[String],
        options: &EtcdOptions,
    ) -> Result<EtcdStore, StoreError> {
        // The trailing `/` keeps `/app/` from also covering another tenant's `/app2/…`.
        if !options.prefix.ends_with('/') || options.prefix.chars().any(char::is_control) {
            return Err(StoreError::InvalidOptions(format!(
                "the etcd prefix `{}` must end with `/` and hold no control characters",
                options.prefix.escape_debug()
            )));
        }
        let target = format!("etcd {}", endpoints.join(","));
        let tls = tls_options(options)?;
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.dial_timeout)
            .with_timeout(options.request_timeout)
            .with_keep_alive(KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
            .with_keep_alive_while_idle(true)
            // A member cut off from its leader fails requests and cancels watches instead of
            // serving stale reads or going silent.
            .with_require_leader(true)
            // etcd auth tokens expire (5 minutes by default); a server runs for weeks.
            .with_auto_token_refresh(true);
        match (&options.user, &options.password) {
            (Some(user), Some(password)) => connect = connect.with_user(user, password),
            (None, None) => {}
            _ => {
                return Err(StoreError::InvalidOptions(
                    "etcd user and password go together".into(),
                ));
            }
        }
        let tls_on = tls.is_some();
        if let Some(tls) = tls {
            connect = connect.with_tls(tls);
        }
        let unavailable = |reason: String| StoreError::Unavailable {
            target: target.clone(),
            reason,
        };
        let deadline = options.dial_timeout;
        let client = tokio::time::timeout(deadline, Client::connect(endpoints, Some(connect)))
            .await
            .map_err(|_| unavailable(format!("no connection within {deadline:?}")))?
            .map_err(|e| classify(&target, e))?;
        let mut kv = client
            .kv_client()
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        // Reachability check, and the revision the watch starts after: a write by another
        // replica after this point reaches our feed.
        let probe = tokio::time::timeout(
            deadline,
            kv.get(
                options.prefix.as_bytes(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        )
        .await
        .map_err(|_| unavailable(format!("no answer within {deadline:?}")))?
        .map_err(|e| match classify(&target, e) {
            // A refused TLS handshake surfaces as a bare "canceled"/"unavailable".
            StoreError::Unavailable { target, reason } if tls_on => StoreError::Unavailable {
                target,
                reason: format!(
                    "{reason} (TLS is on: check the CA file and the client certificate and key)"
                ),
            },
            other => other,
        })?;
        let revision = header_revision(&target, probe.header())?;
        let changes = broadcast::channel(CHANGE_FEED_CAPACITY).0;
        let watch = watch::WatchTask::start(
            client,
            options.prefix.clone(),
            changes.clone(),
            revision + 1,
            target.clone(),
            deadline,
        )
        .await?;
        let details = format!(
            "{target} (prefix {}, {}{})",
            options.prefix,
            if tls_on { "TLS" } else { "plaintext" },
            match &options.user {
                Some(user) => format!(", user {user}"),
                None => String::new(),
            }
        );
        Ok(EtcdStore {
            kv,
            prefix: options.prefix.clone(),
            target,
            details,
            request_timeout: options.request_timeout,
            changes,
            _watch: watch,
        })
    }

    fn full_key(&self, key: &str) -> Vec<u8> {
        format!("{}{key}", self.prefix).into_bytes()
    }

    /// Runs one request with the request deadline.
    async fn call<T>(
        &self,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.request_timeout, f).await {
            Ok(result) => result.map_err(|e| classify(&self.target, e)),
            Err(_) => Err(StoreError::Unavailable {
                target: self.target.clone(),
                reason: format!("no answer within {:?}", self.request_timeout),
            }),
        }
    }

    fn entry(&self, kv: &etcd_client::KeyValue) -> Result<Entry, StoreError> {
        let key = strip_prefix(&self.prefix, kv.key()).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "{}: key {:?} is not UTF-8 under prefix {}",
                self.target,
                String::from_utf8_lossy(kv.key()),
                self.prefix
            ))
        })?;
        Ok(Entry {
            key,
            value: kv.value().to_vec(),
            revision: Revision(to_u64(&self.target, kv.mod_revision())?),
        })
    }

    /// The entry a failed transaction's `or_else` read returned.
    fn conflict(&self, resp: &TxnResponse) -> Result<Write, StoreError> {
        for op in resp.op_responses() {
            if let TxnOpResponse::Get(get) = op {
                return Ok(Write::Conflict(match get.kvs().first() {
                    Some(kv) => Some(self.entry(kv)?),
                    None => None,
                }));
            }
        }
        Err(StoreError::Backend(format!(
            "{}: failed transaction without the read of the current entry",
            self.target
        )))
    }

    /// Runs a conditional transaction built by [`guarded`].
    async fn write(
        &self,
        key: &str,
        op: TxnOp,
        precondition: Precondition,
    ) -> Result<Write, StoreError> {
        let full = self.full_key(key);
        let Some(txn) = guarded(&full, op, precondition) else {
            // A revision etcd never hands out (0, or over i64::MAX) cannot match.
            return Ok(Write::Conflict(self.get_entry(key).await?));
        };
        let resp = self.call(self.kv.clone().txn(txn)).await?;
        if resp.succeeded() {
            let revision = header_revision(&self.target, resp.header())?;
            Ok(Write::Done(Revision(to_u64(&self.target, revision)?)))
        } else {
            self.conflict(&resp)
        }
    }

    async fn get_entry(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let resp = self
            .call(self.kv.clone().get(self.full_key(key), None))
            .await?;
        resp.kvs().first().map(|kv| self.entry(kv)).transpose()
    }

    async fn list_all(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        let start = self.full_key(prefix);
        let end = prefix_end(&start);
        let mut from = start;
        let mut pinned = None;
        let mut out = Vec::new();
        loop {
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(LIST_PAGE_KEYS);
            if let Some(revision) = pinned {
                options = options.with_revision(revision);
            }
            let resp = self.call(self.kv.clone().get(from, Some(options))).await?;
            if pinned.is_none() {
                pinned = Some(header_revision(&self.target, resp.header())?);
            }
            for kv in resp.kvs() {
                out.push(self.entry(kv)?);
            }
            match resp.kvs().last() {
                Some(last) if resp.more() => {
                    // The smallest key after `last`.
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(out),
            }
        }
    }
}

/// The end of the range of keys starting with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): every key from `prefix` on.
    vec![0]
}

/// `key` without `prefix`, if it has it and the rest is UTF-8.
fn strip_prefix(prefix: &str, key: &[u8]) -> Option<String> {
    let rest = key.strip_prefix(prefix.as_bytes())?;
    String::from_utf8(rest.to_vec()).ok()
}

fn header_revision(target: &str, header: Option<&ResponseHeader>) -> Result<i64, StoreError> {
    header
        .map(ResponseHeader::revision)
        .ok_or_else(|| StoreError::Backend(format!("{target}: answer without a header")))
}

fn to_u64(target: &str, revision: i64) -> Result<u64, StoreError> {
    u64::try_from(revision)
        .map_err(|_| StoreError::Corrupt(format!("{target}: negative revision {revision}")))
}

/// Reads the TLS files named in `options`; `None` when TLS is off.
fn tls_options(options: &EtcdOptions) -> Result<Option<TlsOptions>, StoreError> {
    if options.ca.is_none() && options.cert.is_none() && options.key.is_none() {
        return Ok(None);
    }
    let read = |what: &str, path: &Path| {
        inplace_bounded_read::read(path, MAX_TLS_FILE_BYTES)
            .map_err(|e| StoreError::InvalidOptions(format!("etcd {what}: {e}")))
    };
    let mut tls = TlsOptions::new();
    if let Some(ca) = &options.ca {
        tls = tls.ca_certificate(Certificate::from_pem(read("CA file", ca)?));
    }
    match (&options.cert, &options.key) {
        (Some(cert), Some(key)) => {
            let identity =
                Identity::from_pem(read("client certificate", cert)?, read("client key", key)?);
            tls = tls.identity(identity);
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::InvalidOptions(
                "etcd client certificate and key go together".into(),
            ));
        }
    }
    Ok(Some(tls))
}

/// Sorts an etcd client error: outages are retryable, refused credentials and bad setup are not.
pub(crate) fn classify(target: &str, e: etcd_client::Error) -> StoreError {
    use tonic::Code;
    let unavailable = |reason: String| StoreError::Unavailable {
        target: target.to_owned(),
        reason,
    };
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message().to_owned();
            match status.code() {
                Code::Unauthenticated | Code::PermissionDenied => {
                    StoreError::Auth(format!("{target}: {message}"))
                }
                Code::InvalidArgument if message.contains("authentication failed") => {
                    StoreError::Auth(format!("{target}: {message}"))
                }
                // OutOfRange: a paged list hit a compaction; the whole call can be retried.
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Aborted
                | Code::Cancelled
                | Code::ResourceExhausted
                | Code::OutOfRange
                | Code::Unknown => unavailable(format!("{:?}: {message}", status.code())),
                code => StoreError::Backend(format!("{target}: {code:?}: {message}")),
            }
        }
        etcd_client::Error::TransportError(e) => unavailable(format!("transport: {e}")),
        etcd_client::Error::IoError(e) => unavailable(format!("I/O: {e}")),
        etcd_client::Error::InvalidArgs(m) => StoreError::InvalidOptions(format!("{target}: {m}")),
        etcd_client::Error::InvalidUri(e) => StoreError::InvalidOptions(format!("{target}: {e}")),
        other => StoreError::Backend(format!("{target}: {other}")),
    }
}

impl Store for EtcdStore {
    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>> {
        Box::pin(async move {
            check_key(key)?;
            self.get_entry(key).await
        })
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Vec<u8>,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>> {
        Box::pin(async move {
            check_put(key, &value)?;
            let op = TxnOp::put(self.full_key(key), value, None);
            self.write(key, op, precondition).await
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a str,
        precondition: Precondition,
    ) -> BoxFuture<'a, Result<Write, StoreError>> {
        Box::pin(async move {
            check_key(key)?;
            let op = TxnOp::delete(self.full_key(key), None);
            match precondition {
                // "Delete if absent" deletes nothing: the transaction only checks.
                Precondition::Absent => {
                    let full = self.full_key(key);
                    let txn = Txn::new()
                        .when([Compare::create_revision(full.clone(), CompareOp::Equal, 0)])
                        .or_else([TxnOp::get(full, None)]);
                    let resp = self.call(self.kv.clone().txn(txn)).await?;
                    if resp.succeeded() {
                        let revision = header_revision(&self.target, resp.header())?;
                        Ok(Write::Done(Revision(to_u64(&self.target, revision)?)))
                    } else {
                        self.conflict(&resp)
                    }
                }
                _ => self.write(key, op, precondition).await,
            }
        })
    }

    fn commit<'a>(
        &'a self,
        ops: Vec<crate::TxnOp>,
    ) -> BoxFuture<'a, Result<crate::TxnOutcome, StoreError>> {
        Box::pin(async move {
            check_txn(&ops)?;
            self.commit_ops(ops).await
        })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Entry>, StoreError>> {
        Box::pin(self.list_all(prefix))
    }

    fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    fn describe(&self) -> String {
        self.details.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn keys_outside_the_prefix_or_not_utf8_are_not_ours() {
        assert_eq!(strip_prefix("/p/", b"/p/a/b"), Some("a/b".to_owned()));
        assert_eq!(strip_prefix("/p/", b"/q/a"), None);
        assert_eq!(strip_prefix("/p/", b"/p/\xff"), None);
    }

    #[test]
    fn tls_files_without_a_size_are_read_no_further_than_the_limit() {
        use inplace_bounded_read::testing::{assert_refused, fifo_with};
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo_with(&dir.path().join("client.key"), 2 * MAX_TLS_FILE_BYTES);
        for (options, shown) in [
            (
                EtcdOptions {
                    ca: Some("/dev/zero".into()),
                    ..EtcdOptions::default()
                },
                "/dev/zero".to_owned(),
            ),
            (
                EtcdOptions {
                    cert: Some("/dev/null".into()),
                    key: Some(fifo.clone()),
                    ..EtcdOptions::default()
                },
                fifo.display().to_string(),
            ),
        ] {
            let Err(err) = tls_options(&options) else {
                panic!("{shown} was accepted");
            };
            assert!(matches!(err, StoreError::InvalidOptions(_)), "{err}");
            assert_refused(&err.to_string(), &shown, MAX_TLS_FILE_BYTES);
        }
    }
}
