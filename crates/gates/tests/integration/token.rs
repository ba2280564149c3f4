//! The bearer token file is read before every request: a rotated token goes out on the next evaluation, a
//! token file that went away fails the gate naming the file, never the token. (Prometheus and Alertmanager do
//! not check bearer tokens themselves — a proxy in front of them does — so a recording endpoint stands in.)

use std::sync::{Arc, Mutex};

use inplace_gates::{Vars, Verdict, evaluate};

use crate::exporter::serve;
use crate::prometheus::gate;

const EMPTY_VECTOR: &str = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;

/// Answers every request with an empty vector and keeps each request's `Authorization` header.
async fn recording_endpoint() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    serve(listener, move |request| {
        let header = request.headers().get("authorization");
        let header = header.map_or("(none)".into(), |v| v.to_str().unwrap().to_string());
        record.lock().unwrap().push(header);
        EMPTY_VECTOR.to_string()
    });
    (addr, seen)
}

#[tokio::test]
async fn a_rotated_token_is_used_at_the_next_evaluation() {
    let (addr, seen) = recording_endpoint().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "first-token\n").unwrap();
    let storage = gate(
        &format!(
            "gates:\n  - name: storage\n    prometheus: {{url: 'http://{addr}', query: up, bearerTokenFile: token}}\n"
        ),
        dir.path(),
    );
    let vars = Vars::default();
    assert!(evaluate(&storage, &vars).await.passes());
    std::fs::write(&token, "second-token").unwrap();
    assert!(evaluate(&storage, &vars).await.passes());
    assert_eq!(
        *seen.lock().unwrap(),
        ["Bearer first-token", "Bearer second-token"]
    );

    std::fs::remove_file(&token).unwrap();
    let result = evaluate(&storage, &vars).await;
    match &result.verdict {
        Verdict::Unreachable { cause } => {
            assert!(
                cause.starts_with("bearer token file: cannot read "),
                "{cause}"
            );
            assert!(cause.contains(token.to_str().unwrap()), "{cause}");
        }
        other => panic!("not unreachable: {other:?}"),
    }
    assert!(!result.message().contains("second-token"));
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "no request without the token"
    );
}
