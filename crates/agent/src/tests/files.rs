//! The files and ssh-keys drivers on a sandbox root.

use std::io::Write;
use std::os::unix::fs::MetadataExt;

use base64::Engine;
use inplace_agent_api::{FileEncoding, FileSpec, SshUser, StepAction};

use super::{Sandbox, mode_of, run_action};
use crate::drivers::DriverOutcome;
use crate::fsutil::euid;

fn file(path: &str, content: &str) -> FileSpec {
    FileSpec {
        path: path.into(),
        owner: None,
        permissions: None,
        encoding: FileEncoding::None,
        append: false,
        content: content.into(),
    }
}

fn gzip_base64(text: &str) -> String {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(text.as_bytes()).unwrap();
    base64::engine::general_purpose::STANDARD.encode(encoder.finish().unwrap())
}

#[tokio::test]
async fn files_are_written_with_mode_owner_encodings_and_append() {
    let sb = Sandbox::new();
    sb.write_node(
        "/etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\nalice:x:1234:2345::/home/alice:/bin/sh\n",
    );
    sb.write_node("/etc/group", "root:x:0:\nops:x:3456:\n");
    sb.write_node("/etc/hosts", "127.0.0.1 localhost\n");
    let env = sb.env("");
    let files = vec![
        FileSpec {
            permissions: Some("0600".into()),
            owner: Some("alice:ops".into()),
            ..file("/etc/app/secret.conf", "token=abc\n")
        },
        FileSpec {
            encoding: FileEncoding::Base64,
            permissions: Some("0755".into()),
            ..file(
                "/usr/local/bin/hello",
                &base64::engine::general_purpose::STANDARD.encode("#!/bin/sh\necho hi\n"),
            )
        },
        FileSpec {
            encoding: FileEncoding::GzipBase64,
            ..file("/etc/gz.txt", &gzip_base64("unzipped text\n"))
        },
        FileSpec {
            append: true,
            ..file("/etc/hosts", "10.0.0.1 api\n")
        },
    ];
    let result = run_action(
        &env,
        "plan-a",
        StepAction::Files {
            files: files.clone(),
        },
        30,
    )
    .await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert!(result.message.contains("4 written"), "{}", result.message);

    let secret = sb.node("/etc/app/secret.conf");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "token=abc\n");
    assert_eq!(mode_of(&secret), 0o600);
    if euid() == 0 {
        let meta = std::fs::metadata(&secret).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1234, 3456));
    }
    assert_eq!(
        std::fs::read_to_string(sb.node("/usr/local/bin/hello")).unwrap(),
        "#!/bin/sh\necho hi\n"
    );
    assert_eq!(mode_of(&sb.node("/usr/local/bin/hello")), 0o755);
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/gz.txt")).unwrap(),
        "unzipped text\n"
    );
    assert_eq!(mode_of(&sb.node("/etc/gz.txt")), 0o644);
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/hosts")).unwrap(),
        "127.0.0.1 localhost\n10.0.0.1 api\n"
    );
    // No temp files left next to the targets.
    let leftovers: Vec<_> = std::fs::read_dir(sb.node("/etc"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("inplace-tmp"))
        .collect();
    assert!(leftovers.is_empty());

    // Same desired set again: converged, nothing written, append not repeated.
    let again = run_action(&env, "plan-a", StepAction::Files { files }, 30).await;
    assert_eq!(again.outcome, DriverOutcome::Succeeded);
    assert!(
        again.message.contains("0 written, 4 unchanged"),
        "{}",
        again.message
    );
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/hosts")).unwrap(),
        "127.0.0.1 localhost\n10.0.0.1 api\n"
    );
}

#[tokio::test]
async fn replaced_and_dropped_files_are_backed_up_and_removed() {
    let sb = Sandbox::new();
    sb.write_node("/etc/existing.conf", "original\n");
    let env = sb.env("");
    let first = vec![
        file("/etc/existing.conf", "v1\n"),
        file("/etc/dropme.conf", "temporary\n"),
    ];
    let result = run_action(&env, "plan-1", StepAction::Files { files: first }, 30).await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    let backup = sb.state.join("backups/plan-1/etc/existing.conf");
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), "original\n");
    assert_eq!(mode_of(&backup), 0o600);
    assert_eq!(
        std::fs::read_to_string(sb.state.join("backups/plan-1/etc/existing.conf.mode")).unwrap(),
        "0644\n"
    );

    // The next plan drops /etc/dropme.conf and changes the other.
    let second = vec![file("/etc/existing.conf", "v2\n")];
    let result = run_action(&env, "plan-2", StepAction::Files { files: second }, 30).await;
    assert!(
        result.message.contains("1 written, 0 unchanged, 1 removed"),
        "{}",
        result.message
    );
    assert!(!sb.node("/etc/dropme.conf").exists());
    assert_eq!(
        std::fs::read_to_string(sb.state.join("backups/plan-2/etc/dropme.conf")).unwrap(),
        "temporary\n"
    );
    assert_eq!(
        std::fs::read_to_string(sb.state.join("backups/plan-2/etc/existing.conf")).unwrap(),
        "v1\n"
    );
    assert_eq!(
        std::fs::read_to_string(sb.node("/etc/existing.conf")).unwrap(),
        "v2\n"
    );
    // A file the agent never wrote is never removed.
    sb.write_node("/etc/foreign.conf", "not ours\n");
    let result = run_action(&env, "plan-3", StepAction::Files { files: vec![] }, 30).await;
    assert!(result.message.contains("1 removed"), "{}", result.message);
    assert!(sb.node("/etc/foreign.conf").exists());
    assert!(!sb.node("/etc/existing.conf").exists());
}

#[tokio::test]
async fn bad_content_fails_before_anything_is_written() {
    let sb = Sandbox::new();
    let env = sb.env("");
    let files = vec![
        file("/etc/first.conf", "fine\n"),
        FileSpec {
            encoding: FileEncoding::Base64,
            ..file("/etc/second.conf", "!!not base64!!")
        },
    ];
    let result = run_action(&env, "p", StepAction::Files { files }, 30).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(
        result
            .message
            .contains("/etc/second.conf: content is not valid base64"),
        "{}",
        result.message
    );
    assert!(!sb.node("/etc/first.conf").exists());

    let gzip = vec![FileSpec {
        encoding: FileEncoding::Gzip,
        ..file("/etc/z", "plain, not gzip")
    }];
    let result = run_action(&env, "p", StepAction::Files { files: gzip }, 30).await;
    assert!(
        result.message.contains("not valid gzip"),
        "{}",
        result.message
    );

    let owner = vec![FileSpec {
        owner: Some("nobody-here".into()),
        ..file("/etc/o", "x")
    }];
    let result = run_action(&env, "p", StepAction::Files { files: owner }, 30).await;
    assert!(
        result.message.contains("no user \"nobody-here\""),
        "{}",
        result.message
    );

    let escape = vec![file("/etc/../../outside", "x")];
    let result = run_action(&env, "p", StepAction::Files { files: escape }, 30).await;
    assert_eq!(result.outcome, DriverOutcome::Failed);
    assert!(result.message.contains("`..`"), "{}", result.message);
}

#[tokio::test]
async fn ssh_keys_follow_passwd_and_handle_missing_users() {
    let sb = Sandbox::new();
    sb.write_node("/etc/passwd", "capi:x:1500:1500::/srv/capi:/bin/sh\n");
    let env = sb.env("");
    let users = vec![
        SshUser {
            name: "capi".into(),
            authorized_keys: vec!["ssh-ed25519 AAAAkey1 a@b".into(), "ssh-rsa AAAAkey2".into()],
        },
        SshUser {
            name: "ghost".into(),
            authorized_keys: vec!["ssh-ed25519 AAAAghost".into()],
        },
    ];
    let result = run_action(
        &env,
        "p1",
        StepAction::SshKeys {
            users: users.clone(),
        },
        30,
    )
    .await;
    assert_eq!(
        result.outcome,
        DriverOutcome::Succeeded,
        "{}",
        result.message
    );
    assert!(
        result.message.contains("not in /etc/passwd") && result.message.contains("ghost"),
        "{}",
        result.message
    );
    let keys = sb.node("/srv/capi/.ssh/authorized_keys");
    assert_eq!(
        std::fs::read_to_string(&keys).unwrap(),
        "ssh-ed25519 AAAAkey1 a@b\nssh-rsa AAAAkey2\n"
    );
    assert_eq!(mode_of(&keys), 0o600);
    assert_eq!(mode_of(&sb.node("/srv/capi/.ssh")), 0o700);
    if euid() == 0 {
        assert_eq!(std::fs::metadata(&keys).unwrap().uid(), 1500);
        assert_eq!(
            std::fs::metadata(sb.node("/srv/capi/.ssh")).unwrap().uid(),
            1500
        );
    }
    assert_eq!(
        std::fs::read_to_string(sb.node("/home/ghost/.ssh/authorized_keys")).unwrap(),
        "ssh-ed25519 AAAAghost\n"
    );

    let again = run_action(&env, "p1", StepAction::SshKeys { users }, 30).await;
    assert!(
        again.message.contains("0 written, 2 unchanged"),
        "{}",
        again.message
    );

    let rotated = vec![SshUser {
        name: "capi".into(),
        authorized_keys: vec!["ssh-ed25519 AAAAnew".into()],
    }];
    run_action(&env, "p2", StepAction::SshKeys { users: rotated }, 30).await;
    assert_eq!(
        std::fs::read_to_string(&keys).unwrap(),
        "ssh-ed25519 AAAAnew\n"
    );
    assert_eq!(
        std::fs::read_to_string(sb.state.join("backups/p2/srv/capi/.ssh/authorized_keys")).unwrap(),
        "ssh-ed25519 AAAAkey1 a@b\nssh-rsa AAAAkey2\n"
    );
}
