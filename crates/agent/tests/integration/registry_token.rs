//! The Bearer token flow against the real registry: Debian's `docker-registry` with `auth: token` (realm,
//! service, issuer, rootcertbundle) in front of the storage the artifacts were pushed to, and a token server
//! written here (hyper over TLS with the registry's certificate) that checks the Basic credential and mints
//! an ES256 JWT carrying its signing certificate in `x5c` (signed with rcgen's ring key; the registry trusts
//! that certificate as its `rootcertbundle`). The fetcher asks the realm for the scope the registry names and
//! fetches by digest; a wrong password is refused by the token server, and the error says so.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use inplace_agent::artifact::*;
use rcgen::SigningKey as _;

use crate::artifacts::options;
use crate::registry::{PASSWORD, Registry, USER, content, sha256};

const SERVICE: &str = "test-registry";
const ISSUER: &str = "test-token-issuer";

/// The key that signs tokens and its self-signed certificate (the registry's `rootcertbundle`).
struct Signer {
    key: rcgen::KeyPair,
    cert: rcgen::Certificate,
}

impl Signer {
    fn new() -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "token signer");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        Self { key, cert }
    }

    /// An ES256 JWT granting `actions` on repository `name`.
    fn token(&self, name: &str, actions: &[&str]) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header = serde_json::json!({
            "typ": "JWT", "alg": "ES256",
            "x5c": [base64::engine::general_purpose::STANDARD.encode(self.cert.der())],
        });
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": USER, "aud": SERVICE,
            "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("t-{now}-{name}"),
            "access": [{"type": "repository", "name": name, "actions": actions}],
        });
        let input = format!(
            "{}.{}",
            b64.encode(serde_json::to_vec(&header).unwrap()),
            b64.encode(serde_json::to_vec(&claims).unwrap())
        );
        let der = self.key.sign(input.as_bytes()).unwrap();
        format!("{input}.{}", b64.encode(der_to_jose(&der)))
    }
}

/// An ASN.1 `ECDSA-Sig-Value` (SEQUENCE of r and s) as JWS wants it: r and s as 32 bytes each.
fn der_to_jose(der: &[u8]) -> Vec<u8> {
    assert_eq!(der[0], 0x30, "not a DER sequence");
    let mut at = if der[1] & 0x80 != 0 {
        2 + usize::from(der[1] & 0x7f)
    } else {
        2
    };
    let mut out = Vec::with_capacity(64);
    for _ in 0..2 {
        assert_eq!(der[at], 0x02, "not a DER integer");
        let len = usize::from(der[at + 1]);
        let value = &der[at + 2..at + 2 + len];
        let value = &value[value.iter().take_while(|b| **b == 0).count()..];
        out.extend(std::iter::repeat_n(0u8, 32 - value.len()));
        out.extend_from_slice(value);
        at += 2 + len;
    }
    out
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// The token endpoint: its port and the decoded query of every request it answered.
struct TokenServer {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

async fn token_server(registry: &Registry, signer: Arc<Signer>) -> TokenServer {
    let (cert, key) = registry.server_cert();
    let cert = rustls_pki_types::CertificateDer::pem_slice_iter(&cert)
        .map(Result::unwrap)
        .collect();
    use rustls_pki_types::pem::PemObject as _;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(cert, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, signer, log) = (acceptor.clone(), signer.clone(), log.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req| {
                    let answer = answer(&req, &signer, &log);
                    async move { Ok::<_, std::convert::Infallible>(answer) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    TokenServer { port, seen }
}

/// `GET /token?service=…&scope=repository:<name>:<actions>` with the right Basic credential → a token.
fn answer(
    req: &Request<Incoming>,
    signer: &Signer,
    log: &Mutex<Vec<String>>,
) -> Response<Full<Bytes>> {
    let query = percent_decode(req.uri().query().unwrap_or_default());
    log.lock().unwrap().push(query.clone());
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    let authorized = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(basic.as_str());
    let status_body = |status, body: String| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    if !authorized {
        return status_body(
            StatusCode::UNAUTHORIZED,
            r#"{"details":"bad credentials"}"#.into(),
        );
    }
    let scope = query
        .split('&')
        .find_map(|p| p.strip_prefix("scope="))
        .unwrap_or_default();
    let mut parts = scope.splitn(3, ':');
    let (_, name, actions) = (parts.next(), parts.next(), parts.next());
    let actions: Vec<&str> = actions.unwrap_or_default().split(',').collect();
    let token = signer.token(name.unwrap_or_default(), &actions);
    status_body(
        StatusCode::OK,
        serde_json::json!({"token": token, "expires_in": 300}).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_from_a_token_server_open_a_token_auth_registry() {
    let started = Instant::now();
    let mut registry = Registry::start().await;
    let arch = inplace_agent::api::go_arch(std::env::consts::ARCH);
    let kubelet = content("kubelet behind tokens", 50_000);
    let index = registry.push("k8s/kubelet", &[(arch, &kubelet)]);
    let signer = Arc::new(Signer::new());
    let bundle = registry.dir.path().join("token-signer.crt");
    std::fs::write(&bundle, signer.cert.pem()).unwrap();
    let tokens = token_server(&registry, signer).await;
    let realm = format!("https://127.0.0.1:{}/token", tokens.port);
    registry
        .restart_with_auth(&format!(
            "  token:\n    realm: {realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    \
             rootcertbundle: {}\n",
            bundle.display()
        ))
        .await;

    let options = |password: &str, dir: &std::path::Path| {
        let mut options = options(&registry, dir);
        options
            .credentials
            .insert(registry.host(), Credential::new(USER, password));
        options
    };
    let source = ArtifactSource::parse(
        &format!("oci://{}/k8s/kubelet@sha256:{index}", registry.host()),
        None,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = Fetcher::new(options(PASSWORD, dir.path()))
        .unwrap()
        .fetch(&source)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), kubelet);
    assert_eq!(
        path.file_name().unwrap().to_string_lossy(),
        format!("sha256-{}", sha256(&kubelet))
    );
    let seen = tokens.seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|q| q.contains(&format!("service={SERVICE}"))
                && q.contains("scope=repository:k8s/kubelet:pull")),
        "{seen:?}"
    );

    // A wrong password: the token server refuses it, and the error names the realm, never the password.
    let fresh = tempfile::tempdir().unwrap();
    let err = Fetcher::new(options("wrong-password", fresh.path()))
        .unwrap()
        .fetch(&source)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("artifact {source}: token from {realm}: answered 401 Unauthorized (check the credentials file)")),
        "{err}"
    );
    assert!(!err.contains("wrong-password"), "{err}");
    eprintln!("{err}");
    eprintln!("bearer token flow: {:?}", started.elapsed());
}
