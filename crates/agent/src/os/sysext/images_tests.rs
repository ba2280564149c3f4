//! The journal of linked sysext images and the sweep of old ones: the journal after each switch (a resumed one
//! too), the decision case by case, and real switches (`sysextSwitch` with stand-ins for systemd-sysext and
//! unsquashfs on a sandboxed root) followed by sweeps that remove exactly the images nothing needs.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use tokio::time::Instant;

use super::*;
use crate::config::DriverConfig;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn img(version: &str) -> String {
    format!("/opt/extensions/kubernetes/kubernetes-{version}.raw")
}

#[test]
fn the_journal_keeps_current_previous_and_older_images_per_name() {
    let mut journal = Journal::default();
    // A node provisioned with v1 (linked before the agent ever switched), then v2, v3, v4.
    assert!(journal.linked("kubernetes", &img("v2"), Some(&img("v1"))));
    assert!(journal.linked("kubernetes", &img("v3"), Some(&img("v2"))));
    assert!(
        !journal.linked("kubernetes", &img("v3"), Some(&img("v3"))),
        "a repeat"
    );
    // Killed after the link moved to v4, before the journal was written: the resumed switch finds the link at
    // v4 already, and the journal still knows v3 was linked.
    assert!(journal.linked("kubernetes", &img("v4"), Some(&img("v4"))));
    let k = &journal.0["kubernetes"];
    assert_eq!(k.current, Some(img("v4")));
    assert_eq!(k.previous, Some(img("v3")));
    assert_eq!(k.older, [img("v1"), img("v2")]);
    // Back to v2 (an undo): it is current again, no longer old.
    journal.linked("kubernetes", &img("v2"), Some(&img("v4")));
    let k = &journal.0["kubernetes"];
    assert_eq!(
        (k.current.clone(), k.previous.clone(), k.older.clone()),
        (Some(img("v2")), Some(img("v4")), vec![img("v1"), img("v3")])
    );
    // The link removed: nothing current, v2 previous.
    journal.linked("kubernetes", "", Some(&img("v2")));
    let k = &journal.0["kubernetes"];
    assert_eq!(
        (k.current.clone(), k.previous.clone()),
        (None, Some(img("v2")))
    );
    assert_eq!(k.older, [img("v1"), img("v3"), img("v4")]);
}

#[test]
fn old_images_go_only_when_nothing_needs_them() {
    let now = SystemTime::UNIX_EPOCH + 100 * DAY;
    let journal = Journal(BTreeMap::from([(
        "kubernetes".to_string(),
        Linked {
            current: Some(img("v6")),
            previous: Some(img("v5")),
            older: ["v1", "v2", "v3", "v4", "gone"].map(img).to_vec(),
        },
    )]));
    let written = BTreeMap::from([
        (img("v1"), Some(now - 8 * DAY)),
        (img("v2"), Some(now - 8 * DAY)),
        (img("v3"), Some(now - 8 * DAY)),
        (img("v4"), Some(now - DAY)),
        (img("gone"), None),
    ]);
    // v2: a link points at it (another name's, or an operator's); v3: the plan's undo record names it; v4: too
    // recent; gone: forgotten; v1: removed.
    let linked = BTreeSet::from([img("v2")]);
    let named = |image: &str| image == img("v3");
    let decision = decide(
        &journal,
        &linked,
        &named,
        &written,
        now,
        SYSEXT_IMAGE_RETENTION,
    );
    assert_eq!(decision.remove, [img("v1")]);
    assert_eq!(decision.forget, [img("v1"), img("gone")]);
    // The current and previous image are never candidates, whatever their age.
    let only_in_use = Journal(BTreeMap::from([(
        "k".to_string(),
        Linked {
            current: Some(img("a")),
            previous: Some(img("b")),
            older: vec![img("b")],
        },
    )]));
    let old = BTreeMap::from([(img("b"), Some(now - 30 * DAY))]);
    assert_eq!(
        decide(
            &only_in_use,
            &BTreeSet::new(),
            &|_| false,
            &old,
            now,
            SYSEXT_IMAGE_RETENTION
        ),
        Decision::default()
    );
}

/// A sandboxed root with an os-release, stand-ins for systemd-sysext (which says the extension is merged from
/// its link) and unsquashfs (an extension-release that matches any OS), and a state dir.
struct Node {
    _dir: tempfile::TempDir,
    root: PathBuf,
    env: DriverEnv,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let bin = dir.path().join("bin");
        for d in [
            root.join("etc"),
            root.join("opt/extensions/kubernetes"),
            bin.clone(),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(root.join("etc/os-release"), "ID=debian\nVERSION_ID=12\n").unwrap();
        let script = |name: &str, body: &str| {
            let path = bin.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path.display().to_string()
        };
        let sysext = script(
            "systemd-sysext",
            r#"case "$1" in
status) echo '[{"hierarchy":"/usr","extensions":["kubernetes"]}]' ;;
list) echo '[{"name":"kubernetes","type":"raw","path":"/etc/extensions/kubernetes.raw"}]' ;;
esac"#,
        );
        let unsquashfs = script("unsquashfs", "echo ID=_any");
        let config = DriverConfig::from_yaml(&format!(
            "sysext:\n  command: [{sysext}]\n  unsquashfs: [{unsquashfs}]\n  extensionsDir: /etc/extensions\n"
        ))
        .unwrap();
        let env = DriverEnv::new(root.clone(), config, dir.path().join("state"));
        std::fs::create_dir_all(&env.state_dir).unwrap();
        Node {
            _dir: dir,
            root,
            env,
        }
    }

    fn path(&self, node: &str) -> PathBuf {
        self.root.join(node.trim_start_matches('/'))
    }

    fn image(&self, version: &str, age: Duration) {
        let path = self.path(&img(version));
        std::fs::write(&path, version).unwrap();
        set_age(&path, age);
    }

    async fn switch(&self, version: &str) {
        let (_tx, mut cancel) = tokio::sync::watch::channel(false);
        let mut run = crate::os::sysext::Run {
            env: &self.env,
            deadline: Instant::now() + Duration::from_secs(30),
            cancel: &mut cancel,
        };
        let said = run.switch("kubernetes", &img(version)).await.unwrap();
        assert!(said.ends_with("kubernetes merged"), "{said}");
    }

    fn exists(&self, version: &str) -> bool {
        self.path(&img(version)).exists()
    }
}

fn set_age(path: &Path, age: Duration) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(SystemTime::now() - age)
        .unwrap();
}

#[tokio::test]
async fn switches_are_journaled_and_the_sweep_removes_only_images_nothing_needs() {
    let node = Node::new();
    for version in ["v1", "v2", "v3", "v4"] {
        node.image(version, 8 * DAY);
        node.switch(version).await;
    }
    node.image("v5", 8 * DAY); // fetched, never linked: not this sweep's
    let leftovers = node.path("/opt/extensions/kubernetes");
    std::fs::write(leftovers.join(".kubernetes-v9.raw.inplace-tmp"), "half").unwrap();
    set_age(&leftovers.join(".kubernetes-v9.raw.inplace-tmp"), 8 * DAY);
    std::fs::write(
        leftovers.join(".kubernetes-v8.raw.inplace-tmp"),
        "being written",
    )
    .unwrap();

    // The current plan's undo record names v2: it stays with v3 (previous) and v4 (current); v1 goes.
    let plan = format!(
        r#"{{"steps":[{{"undo":{{"values":{{"previousKubernetes":"{}"}}}}}}]}}"#,
        img("v2")
    );
    let swept = sweep(&node.env, &plan, SystemTime::now()).unwrap();
    assert_eq!(
        swept,
        Swept {
            images: 1,
            leftovers: 1
        }
    );
    let present = |versions: &[&str]| versions.iter().map(|v| node.exists(v)).collect::<Vec<_>>();
    assert_eq!(
        present(&["v1", "v2", "v3", "v4", "v5"]),
        [false, true, true, true, true]
    );
    assert!(!leftovers.join(".kubernetes-v9.raw.inplace-tmp").exists());
    assert!(
        leftovers.join(".kubernetes-v8.raw.inplace-tmp").exists(),
        "too recent"
    );
    assert_eq!(
        std::fs::read_link(node.path("/etc/extensions/kubernetes.raw")).unwrap(),
        PathBuf::from(img("v4"))
    );

    // The plan ended: v2 goes at the next sweep; a second sweep then finds nothing more to do.
    assert_eq!(sweep(&node.env, "", SystemTime::now()).unwrap().images, 1);
    assert!(!node.exists("v2"));
    assert_eq!(
        sweep(&node.env, "", SystemTime::now()).unwrap(),
        Swept::default()
    );
    let journal: Journal =
        serde_json::from_slice(&std::fs::read(node.env.state_dir.join(JOURNAL)).unwrap()).unwrap();
    assert!(journal.0["kubernetes"].older.is_empty(), "{journal:?}");

    // Killed between removing an image and writing the journal: the journal names a missing image, which the
    // next sweep forgets.
    node.image("v6", 8 * DAY);
    node.switch("v6").await;
    node.switch("v4").await; // an undo: back to v4; v3 is older now
    std::fs::remove_file(node.path(&img("v3"))).unwrap();
    let swept = sweep(&node.env, "", SystemTime::now()).unwrap();
    assert_eq!(swept.images, 0);
    let journal: Journal =
        serde_json::from_slice(&std::fs::read(node.env.state_dir.join(JOURNAL)).unwrap()).unwrap();
    assert!(journal.0["kubernetes"].older.is_empty(), "{journal:?}");
    assert_eq!(present(&["v4", "v5", "v6"]), [true, true, true]);
}
