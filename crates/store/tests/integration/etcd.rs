//! etcd-only behaviour, against a real etcd: replicas sharing one etcd (the HA case), key
//! namespaces, an etcd outage and restart, unreachable endpoints, TLS with client certificates and
//! etcd user/password auth.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns unwrap too: a failure is the test failing

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{FEED_DEADLINE, change_of, next_change, open_etcd, start_etcd};
use inplace_store::testing::{Etcd, ServerTls};
use inplace_store::{EtcdOptions, Precondition, Revision, StoreError, StoreUrl, Write};

fn done(w: Write) -> Revision {
    match w {
        Write::Done(r) => r,
        Write::Conflict(e) => panic!("expected Done, got Conflict({e:?})"),
    }
}

#[tokio::test]
async fn replicas_on_one_etcd_see_each_others_writes_and_changes() {
    let etcd = start_etcd();
    let a = open_etcd(&etcd, "/ha/").await;
    let b = open_etcd(&etcd, "/ha/").await;
    let mut feed_a = a.subscribe();
    let mut feed_b = b.subscribe();

    // Replica A records work; replica B's feed fires and B reads it.
    let r1 = done(
        a.put("updates/ns/m1", b"pending".to_vec(), Precondition::Absent)
            .await
            .unwrap(),
    );
    let seen = next_change(&mut feed_b).await;
    assert_eq!(
        (seen.key.as_str(), seen.revision, seen.deleted),
        ("updates/ns/m1", r1, false)
    );
    assert_eq!(
        b.get("updates/ns/m1").await.unwrap().unwrap().value,
        b"pending"
    );
    // A's own feed carries its write too (it comes from the same etcd watch).
    assert_eq!(next_change(&mut feed_a).await.revision, r1);

    // B advances it with CAS on A's revision; A sees the change and the new value.
    let r2 = done(
        b.put(
            "updates/ns/m1",
            b"running".to_vec(),
            Precondition::Revision(r1),
        )
        .await
        .unwrap(),
    );
    assert_eq!(next_change(&mut feed_a).await.revision, r2);
    assert_eq!(next_change(&mut feed_b).await.revision, r2);
    assert_eq!(
        a.get("updates/ns/m1").await.unwrap().unwrap().value,
        b"running"
    );
    // A, still holding r1, loses the race and is told the current state.
    match a
        .put(
            "updates/ns/m1",
            b"stale".to_vec(),
            Precondition::Revision(r1),
        )
        .await
        .unwrap()
    {
        Write::Conflict(Some(now)) => assert_eq!(now.revision, r2),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // Deletes travel too.
    done(
        a.delete("updates/ns/m1", Precondition::Revision(r2))
            .await
            .unwrap(),
    );
    let gone = change_of(&mut feed_b, "updates/ns/m1").await;
    assert!(gone.deleted);
    assert_eq!(b.get("updates/ns/m1").await.unwrap(), None);
}

#[tokio::test]
async fn replicas_racing_cas_count_every_increment_once() {
    let etcd = start_etcd();
    let replicas = [
        open_etcd(&etcd, "/race/").await,
        open_etcd(&etcd, "/race/").await,
    ];
    const PER_TASK: u64 = 20;
    let mut tasks = Vec::new();
    for store in replicas.iter().chain(replicas.iter()) {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..PER_TASK {
                loop {
                    let current = store.get("n").await.unwrap();
                    let (n, pre) = match &current {
                        None => (0u64, Precondition::Absent),
                        Some(e) => (
                            String::from_utf8(e.value.clone()).unwrap().parse().unwrap(),
                            Precondition::Revision(e.revision),
                        ),
                    };
                    if let Write::Done(_) = store
                        .put("n", (n + 1).to_string().into_bytes(), pre)
                        .await
                        .unwrap()
                    {
                        break;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let value = replicas[1].get("n").await.unwrap().unwrap().value;
    assert_eq!(
        String::from_utf8(value).unwrap(),
        (4 * PER_TASK).to_string()
    );
}

#[tokio::test]
async fn prefixes_keep_tenants_apart() {
    let etcd = start_etcd();
    let one = open_etcd(&etcd, "/tenant/").await;
    let other = open_etcd(&etcd, "/tenant-b/").await;
    let mut feed = one.subscribe();
    done(
        other
            .put("k", b"theirs".to_vec(), Precondition::Any)
            .await
            .unwrap(),
    );
    let mine = done(
        one.put("mine", b"ours".to_vec(), Precondition::Any)
            .await
            .unwrap(),
    );
    // The other tenant's write never reaches our feed: the first change is ours.
    assert_eq!(next_change(&mut feed).await.revision, mine);
    assert_eq!(one.get("k").await.unwrap(), None);
    let keys: Vec<String> = one
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, ["mine"]);
    assert_eq!(other.get("k").await.unwrap().unwrap().value, b"theirs");
    assert!(
        one.describe().contains("prefix /tenant/"),
        "{}",
        one.describe()
    );
    // A prefix without the trailing `/` would overlap `/tenant-b/`: refused.
    let options = EtcdOptions {
        prefix: "/tenant".into(),
        ..EtcdOptions::default()
    };
    let err = match inplace_store::open(&etcd.url(), &options).await {
        Ok(store) => panic!("opened {}", store.describe()),
        Err(e) => e,
    };
    assert!(matches!(err, StoreError::InvalidOptions(_)), "{err}");
    assert!(err.to_string().contains("must end with `/`"), "{err}");
}

#[tokio::test]
async fn an_etcd_outage_is_retryable_and_the_feed_recovers() {
    let mut etcd = start_etcd();
    let options = EtcdOptions {
        prefix: "/outage/".into(),
        request_timeout: Duration::from_secs(2),
        ..EtcdOptions::default()
    };
    let a = inplace_store::open(&etcd.url(), &options).await.unwrap();
    let b = inplace_store::open(&etcd.url(), &options).await.unwrap();
    let mut feed_b = b.subscribe();
    let before = done(
        a.put("k", b"before".to_vec(), Precondition::Any)
            .await
            .unwrap(),
    );
    assert_eq!(next_change(&mut feed_b).await.revision, before);

    etcd.kill();
    let err = a.get("k").await.unwrap_err();
    assert!(err.is_retryable(), "an outage must be retryable: {err}");
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");

    etcd.restart().unwrap();
    // B's watch comes back and says "re-read everything"; the RECONNECT_BACKOFF_MAX (5 s) bounds
    // how long that takes, hence the longer deadline.
    let deadline = tokio::time::Instant::now() + FEED_DEADLINE * 3;
    match tokio::time::timeout_at(deadline, feed_b.recv()).await {
        Ok(Ok(change)) => assert!(
            change.is_resync(),
            "expected the resync marker first, got {change:?}"
        ),
        Ok(Err(e)) => panic!("feed failed: {e}"),
        Err(_) => panic!("no resync marker after the etcd restart"),
    }
    // Data survived (etcd's own durability) and new writes by A reach B again.
    let value = retry(|| a.get("k")).await.unwrap();
    assert_eq!(value.value, b"before");
    let after = done(
        a.put("k", b"after".to_vec(), Precondition::Revision(before))
            .await
            .unwrap(),
    );
    assert_eq!(change_of(&mut feed_b, "k").await.revision, after);
}

/// Retries a retryable failure for a few seconds (the client redials after an outage).
async fn retry<'a, T>(
    mut op: impl FnMut() -> inplace_store::BoxFuture<'a, Result<Option<T>, StoreError>>,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + FEED_DEADLINE;
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                // Back-off between attempts, not a wait for an event.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn unreachable_etcd_fails_open_with_a_retryable_error_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url: StoreUrl = format!("etcd://127.0.0.1:{port}").parse().unwrap();
    let options = EtcdOptions {
        dial_timeout: Duration::from_millis(500),
        ..EtcdOptions::default()
    };
    let started = std::time::Instant::now();
    let err = match inplace_store::open(&url, &options).await {
        Ok(store) => panic!("opened {}", store.describe()),
        Err(e) => e,
    };
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "dial timeout ignored"
    );
    assert!(err.is_retryable(), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "store test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let write = |name: &str, pem: String| std::fs::write(dir.path().join(name), pem).unwrap();
        write("ca.pem", ca.pem());
        for (name, sans) in [("server", vec!["localhost".to_owned()]), ("client", vec![])] {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(sans).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            if name == "server" {
                params
                    .subject_alt_names
                    .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
            }
            let cert = params.signed_by(&key, &issuer).unwrap();
            write(&format!("{name}.pem"), cert.pem());
            write(&format!("{name}-key.pem"), key.serialize_pem());
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn client_options(&self, prefix: &str) -> EtcdOptions {
        EtcdOptions {
            ca: Some(self.path("ca.pem")),
            cert: Some(self.path("client.pem")),
            key: Some(self.path("client-key.pem")),
            prefix: prefix.into(),
            dial_timeout: Duration::from_secs(3),
            ..EtcdOptions::default()
        }
    }
}

async fn expect_open_error(etcd: &Etcd, options: &EtcdOptions) -> StoreError {
    match inplace_store::open(&etcd.url(), options).await {
        Ok(store) => panic!("opened {} with {options:?}", store.describe()),
        Err(e) => {
            eprintln!("refused as expected: {e}");
            e
        }
    }
}

/// Enables etcd auth with `root` and a user `updater` that may only touch `/app/`.
async fn enable_auth(etcd: &Etcd, pki: &Pki) {
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(
            &pki.path("ca.pem"),
        )))
        .identity(etcd_client::Identity::from_pem(
            read(&pki.path("client.pem")),
            read(&pki.path("client-key.pem")),
        ));
    let mut admin = etcd_client::Client::connect(
        &etcd.endpoints,
        Some(etcd_client::ConnectOptions::new().with_tls(tls)),
    )
    .await
    .unwrap();
    admin.user_add("root", "root-secret", None).await.unwrap();
    admin.role_add("root").await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.user_add("updater", "s3cret-pw", None).await.unwrap();
    admin.role_add("updater").await.unwrap();
    admin
        .role_grant_permission(
            "updater",
            etcd_client::Permission::read_write("/app/").with_prefix(),
        )
        .await
        .unwrap();
    admin.user_grant_role("updater", "updater").await.unwrap();
    admin.auth_enable().await.unwrap();
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[tokio::test]
async fn tls_with_client_certificates_and_password_auth() {
    let pki = Pki::new();
    let etcd = Etcd::start_with(Some(ServerTls {
        ca: pki.path("ca.pem"),
        cert: pki.path("server.pem"),
        key: pki.path("server-key.pem"),
    }))
    .unwrap();

    // TLS with our client certificate works.
    let store = inplace_store::open(&etcd.url(), &pki.client_options("/app/"))
        .await
        .unwrap();
    assert!(store.describe().contains("TLS"), "{}", store.describe());
    let mut feed = store.subscribe();
    let r = done(
        store
            .put("k", b"over tls".to_vec(), Precondition::Absent)
            .await
            .unwrap(),
    );
    assert_eq!(next_change(&mut feed).await.revision, r);
    drop(store);

    // Without a client certificate, or trusting another CA, etcd cannot be used.
    let mut no_cert = pki.client_options("/app/");
    no_cert.cert = None;
    no_cert.key = None;
    let err = expect_open_error(&etcd, &no_cert).await;
    assert!(err.to_string().contains("check the CA file"), "{err}");
    let other = Pki::new();
    let mut wrong_ca = pki.client_options("/app/");
    wrong_ca.ca = Some(other.path("ca.pem"));
    let err = expect_open_error(&etcd, &wrong_ca).await;
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
    // A certificate without its key is a setup error, named before any connection.
    let mut half = pki.client_options("/app/");
    half.key = None;
    let err = expect_open_error(&etcd, &half).await;
    assert!(matches!(err, StoreError::InvalidOptions(_)), "{err}");
    let mut missing = pki.client_options("/app/");
    missing.ca = Some(pki.path("nope.pem"));
    let err = expect_open_error(&etcd, &missing).await;
    assert!(err.to_string().contains("nope.pem"), "{err}");

    enable_auth(&etcd, &pki).await;
    let with_user = |password: &str, prefix: &str| EtcdOptions {
        user: Some("updater".into()),
        password: Some(password.into()),
        ..pki.client_options(prefix)
    };
    // Right password: reads what was stored before auth was enabled, writes and watches.
    let store = inplace_store::open(&etcd.url(), &with_user("s3cret-pw", "/app/"))
        .await
        .unwrap();
    let described = store.describe();
    assert!(
        described.contains("user updater") && !described.contains("s3cret"),
        "{described}"
    );
    assert_eq!(store.get("k").await.unwrap().unwrap().value, b"over tls");
    let mut feed = store.subscribe();
    let r = done(
        store
            .put("k2", b"authed".to_vec(), Precondition::Absent)
            .await
            .unwrap(),
    );
    assert_eq!(next_change(&mut feed).await.revision, r);

    // Wrong password: refused, not retryable, and the password is not in the message.
    let err = expect_open_error(&etcd, &with_user("wrong-pw", "/app/")).await;
    assert!(matches!(err, StoreError::Auth(_)), "{err}");
    assert!(!err.is_retryable());
    assert!(!err.to_string().contains("wrong-pw"), "{err}");
    // Outside the granted prefix: refused as an auth problem.
    let err = expect_open_error(&etcd, &with_user("s3cret-pw", "/elsewhere/")).await;
    assert!(matches!(err, StoreError::Auth(_)), "{err}");
}

/// Marks the re-executed child of [`a_missing_etcd_binary_says_how_to_install_it`].
const MISSING_ETCD_CHILD_ENV: &str = "INPLACE_STORE_MISSING_ETCD_CHILD";

#[test]
fn a_missing_etcd_binary_says_how_to_install_it() {
    if std::env::var_os(MISSING_ETCD_CHILD_ENV).is_some() {
        let err = match Etcd::start() {
            Ok(_) => panic!("started an etcd from a binary that does not exist"),
            Err(e) => e,
        };
        assert!(
            err.to_string().contains("apt-get install etcd-server"),
            "{err}"
        );
        return;
    }
    // The binary is chosen by an environment variable; set it only in a child process (this
    // test binary again, running just this test) so the other tests keep the real etcd.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "etcd::a_missing_etcd_binary_says_how_to_install_it",
            "--test-threads=1",
        ])
        .env(MISSING_ETCD_CHILD_ENV, "1")
        .env(inplace_store::testing::ETCD_BIN_ENV, "/nonexistent/etcd")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
