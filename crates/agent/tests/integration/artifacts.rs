//! The artifact fetcher against a real registry (Debian's `docker-registry`, TLS + htpasswd, artifacts
//! pushed with skopeo): by digest through a mirror rewrite, and every bad input — a tag, a digest
//! mismatch, no manifest for this architecture, 401, 404, 500, a truncated blob, over the limit — plus a
//! `.partial` left by a killed download. Nothing is ever renamed into place unverified.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Instant;

use inplace_agent::artifact::*;

use crate::registry::{PASSWORD, Registry, USER, content, sha256};

/// Fetch options for `registry`: its CA, its credential, downloads into `dir`.
pub(crate) fn options(registry: &Registry, dir: &Path) -> FetchOptions {
    let mut options = FetchOptions::new(dir);
    options.ca_file = Some(registry.ca_file());
    options
        .credentials
        .insert(registry.host(), Credential::new(USER, PASSWORD));
    options
}

fn oci(registry: &Registry, repository: &str, hex: &str) -> ArtifactSource {
    ArtifactSource::parse(
        &format!("oci://{}/{repository}@sha256:{hex}", registry.host()),
        None,
    )
    .unwrap()
}

/// Fetches and answers the error's text, checking that it names the artifact and that no final file
/// appeared.
async fn failure(options: FetchOptions, source: &ArtifactSource, final_hex: &str) -> String {
    let dir = options.download_dir.clone();
    let err = Fetcher::new(options)
        .unwrap()
        .fetch(source)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with(&format!("artifact {source}: ")), "{text}");
    assert!(
        !dir.join(format!("sha256-{final_hex}")).exists(),
        "renamed into place: {text}"
    );
    println!("{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_fetches_verify_resume_and_name_every_bad_input() {
    let started = Instant::now();
    let registry = Registry::start().await;
    println!("registry ready in {:?}", started.elapsed());
    let arch = inplace_agent::api::go_arch(std::env::consts::ARCH);
    let other = if arch == "amd64" { "arm64" } else { "amd64" };
    let mine = content("mine", 14_000);
    let theirs = content("theirs", 9_000);
    let index = registry.push("k8s/sysext", &[(other, &theirs), (arch, &mine)]);
    let foreign = registry.push(
        "k8s/foreign",
        &[("s390x", &content("s", 10)), ("ppc64le", &content("p", 10))],
    );
    let big = content("big", 300_000);
    let big_index = registry.push("k8s/big", &[(arch, &big)]);
    let short = content("short", 14_000);
    let short_index = registry.push("k8s/short", &[(arch, &short)]);
    let broken = content("broken", 14_000);
    let broken_index = registry.push("k8s/broken", &[(arch, &broken)]);
    let corrupt = content("corrupt", 14_000);
    let corrupt_index = registry.push("k8s/corrupt", &[(arch, &corrupt)]);
    println!("pushed in {:?}", started.elapsed());
    let mine_hex = sha256(&mine);

    // By digest through a mirror rewrite: the source names a registry that does not exist.
    let dir = tempfile::tempdir().unwrap();
    let mut mirrored = options(&registry, dir.path());
    mirrored.mirrors = vec![MirrorRewrite {
        prefix: "registry.example.com/k8s".into(),
        replacement: format!("{}/k8s", registry.host()),
    }];
    let source = ArtifactSource::parse(
        &format!("oci://registry.example.com/k8s/sysext@sha256:{index}"),
        None,
    )
    .unwrap();
    let fetcher = Fetcher::new(mirrored).unwrap();
    let path = fetcher.fetch(&source).await.unwrap();
    assert_eq!(path, dir.path().join(format!("sha256-{mine_hex}")));
    assert_eq!(std::fs::read(&path).unwrap(), mine);
    // Fetched again: the verified file is reused.
    let blob_get = format!("/blobs/sha256:{mine_hex}");
    let gets = registry.wait_log(&blob_get, 1).await;
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let first = inode(&path);
    assert_eq!(fetcher.fetch(&source).await.unwrap(), path);
    assert_eq!(inode(&path), first, "the verified file was replaced");
    assert_eq!(
        registry.log().matches(&blob_get).count(),
        gets,
        "a verified file is downloaded again"
    );

    // A tag is refused before anything is asked.
    let tag = format!("oci://{}/k8s/sysext:v1", registry.host());
    let err = ArtifactSource::parse(&tag, None).unwrap_err().to_string();
    println!("{err}");
    assert_eq!(
        err,
        format!("{tag:?} names a tag; give a digest (@sha256:…)")
    );

    // No manifest for this architecture: the offer is named.
    let fresh = tempfile::tempdir().unwrap();
    let text = failure(
        options(&registry, fresh.path()),
        &oci(&registry, "k8s/foreign", &foreign),
        "",
    )
    .await;
    assert!(
        text.contains(&format!("no manifest for linux/{arch}"))
            && text.ends_with("it offers: linux/s390x, linux/ppc64le"),
        "{text}"
    );

    // 401: a wrong password; and no credentials at all.
    let mut wrong = options(&registry, fresh.path());
    wrong
        .credentials
        .insert(registry.host(), Credential::new(USER, "wrong"));
    let text = failure(wrong, &oci(&registry, "k8s/sysext", &index), &mine_hex).await;
    assert!(
        text.contains("401 Unauthorized")
            && text.contains("refused the credentials of user \"agent\""),
        "{text}"
    );
    assert!(!text.contains("wrong"), "{text}");
    let mut none = options(&registry, fresh.path());
    none.credentials = Credentials::default();
    let text = failure(none, &oci(&registry, "k8s/sysext", &index), &mine_hex).await;
    assert!(
        text.contains("credentials file has no entry for 127.0.0.1"),
        "{text}"
    );

    // 404: a digest the registry does not have.
    let missing = sha256(b"not pushed");
    let text = failure(
        options(&registry, fresh.path()),
        &oci(&registry, "k8s/sysext", &missing),
        "",
    )
    .await;
    assert!(
        text.contains("404 Not Found") && text.contains("MANIFEST_UNKNOWN"),
        "{text}"
    );

    // Over the limit: refused from the descriptor, before a byte is written.
    let mut small = options(&registry, fresh.path());
    small.max_bytes = 100_000;
    let big_hex = sha256(&big);
    let text = failure(small, &oci(&registry, "k8s/big", &big_index), &big_hex).await;
    assert!(
        text.ends_with("300000 bytes is over the limit of 100000 bytes"),
        "{text}"
    );
    assert!(
        !fresh
            .path()
            .join(format!("sha256-{big_hex}.partial"))
            .exists()
    );

    // 500: the repository's layer link is garbage.
    let broken_hex = sha256(&broken);
    std::fs::write(registry.layer_link("k8s/broken", &broken_hex), "garbage").unwrap();
    let text = failure(
        options(&registry, fresh.path()),
        &oci(&registry, "k8s/broken", &broken_index),
        &broken_hex,
    )
    .await;
    assert!(
        text.contains("answered 500 (a server error): {\"errors\":[{\"code\":\"UNKNOWN\""),
        "{text}"
    );

    // A truncated blob: the registry serves 5000 bytes with a 200.
    let short_hex = sha256(&short);
    let data = registry.blob_data(&short_hex);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(5000)
        .unwrap();
    let text = failure(
        options(&registry, fresh.path()),
        &oci(&registry, "k8s/short", &short_index),
        &short_hex,
    )
    .await;
    assert!(
        text.ends_with("truncated: got 5000 of 14000 bytes"),
        "{text}"
    );

    // A digest mismatch: the stored blob has the right size and other bytes.
    let corrupt_hex = sha256(&corrupt);
    std::fs::write(registry.blob_data(&corrupt_hex), content("other", 14_000)).unwrap();
    let text = failure(
        options(&registry, fresh.path()),
        &oci(&registry, "k8s/corrupt", &corrupt_index),
        &corrupt_hex,
    )
    .await;
    assert!(
        text.contains(&format!(
            "digest mismatch: expected sha256:{corrupt_hex}, got sha256:"
        )),
        "{text}"
    );
    assert!(
        !fresh
            .path()
            .join(format!("sha256-{corrupt_hex}.partial"))
            .exists(),
        "a mismatching .partial is kept"
    );

    // A `.partial` left by a killed download is resumed with a Range request (206) and verified.
    let killed = tempfile::tempdir().unwrap();
    std::fs::write(
        killed.path().join(format!("sha256-{mine_hex}.partial")),
        &mine[..6000],
    )
    .unwrap();
    let before = registry.log().matches("\" 206 ").count();
    let path = Fetcher::new(options(&registry, killed.path()))
        .unwrap()
        .fetch(&oci(&registry, "k8s/sysext", &index))
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), mine);
    // The access log line is written after the answer: wait for it (a 206 is the proof of the resume).
    registry.wait_log("\" 206 ", before + 1).await;
    assert!(
        !killed
            .path()
            .join(format!("sha256-{mine_hex}.partial"))
            .exists()
    );

    // A `.partial` with wrong bytes: resumed, found wrong, fetched again from the start.
    let garbled = tempfile::tempdir().unwrap();
    std::fs::write(
        garbled.path().join(format!("sha256-{mine_hex}.partial")),
        vec![0u8; 6000],
    )
    .unwrap();
    let path = Fetcher::new(options(&registry, garbled.path()))
        .unwrap()
        .fetch(&oci(&registry, "k8s/sysext", &index))
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), mine);

    // https:// (the registry's blob URL, credentials by host) and file:// go through the same verify path.
    let url = format!(
        "https://{}/v2/k8s/sysext/blobs/sha256:{mine_hex}",
        registry.host()
    );
    let https = tempfile::tempdir().unwrap();
    let source = ArtifactSource::parse(&url, Some(&mine_hex)).unwrap();
    let path = Fetcher::new(options(&registry, https.path()))
        .unwrap()
        .fetch(&source)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), mine);
    let wrong_hex = sha256(b"something else");
    let source = ArtifactSource::parse(&url, Some(&wrong_hex)).unwrap();
    let text = failure(options(&registry, https.path()), &source, &wrong_hex).await;
    assert!(
        text.contains(&format!(
            "digest mismatch: expected sha256:{wrong_hex}, got sha256:{mine_hex}"
        )),
        "{text}"
    );
    let local = https.path().join("local.raw");
    std::fs::write(&local, &theirs).unwrap();
    let files = tempfile::tempdir().unwrap();
    let source =
        ArtifactSource::parse(&format!("file://{}", local.display()), Some(&wrong_hex)).unwrap();
    let text = failure(options(&registry, files.path()), &source, &wrong_hex).await;
    assert!(text.contains("digest mismatch"), "{text}");
    let source = ArtifactSource::parse(
        &format!("file://{}", local.display()),
        Some(&sha256(&theirs)),
    )
    .unwrap();
    let path = Fetcher::new(options(&registry, files.path()))
        .unwrap()
        .fetch(&source)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), theirs);
    println!("all in {:?}", started.elapsed());
}
