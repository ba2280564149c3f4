//! CLI glue: turns each parsed subcommand into library calls and prints the result. `anyhow` lives here and
//! in `main`, nowhere else.

use std::sync::Arc;

use anyhow::Context as _;
use inplace_agent_api::MachineRef;
use inplace_core::{DEFAULT_POLICY_YAML, Policy};
use inplace_gates::Gates;
use tokio_util::sync::CancellationToken;

use crate::cmd::certs::{DevCertPaths, DevCertsSpec, write_dev_certs};
use crate::cmd::cli::{DEV_CERTS_DIR, OutputFormat, PolicyCommand, ServeArgs, TokenCreateArgs};
use crate::cmd::fatal::{Fatal, one_line, serve_fatal};
use crate::dispatch::upkeep::tokens::{AgentTokens, create_token};
use crate::dispatch::{AgentScope, Dispatcher};
use crate::hooks::Engine;
use crate::mgmt::{Management, ManagementSource};
use crate::observe::{InstrumentedStore, backend_name};
use crate::server::{self, Listeners, Metrics, Readiness, Services};
use inplace_store::StoreUrl;

/// Start-up warning when the server holds no agent token: CanUpdate hooks work, but no update can be
/// carried out because no agent gets in.
pub const NO_AGENT_TOKENS_WARNING: &str = "no agent tokens: no agent can authenticate";

/// Largest policy file read (`serve --policy`, `policy check`, `diff --policy`); the built-in policy is 4 KiB.
pub const MAX_POLICY_BYTES: u64 = 1024 * 1024;

/// Reads `--policy` (at most [`MAX_POLICY_BYTES`]) or takes the built-in default.
pub fn load_policy(path: Option<&std::path::Path>) -> anyhow::Result<Policy> {
    match path {
        None => Ok(Policy::builtin()),
        Some(path) => {
            let text = inplace_bounded_read::read_to_string(path, MAX_POLICY_BYTES)
                .context("reading the policy")?;
            Policy::from_yaml(&text).with_context(|| format!("policy {}", path.display()))
        }
    }
}

/// Reads and checks `--gates-file` (none when absent); a bad file is a [`Fatal`] naming the gate and field.
fn load_gates(path: Option<&std::path::Path>) -> anyhow::Result<Gates> {
    let Some(path) = path else {
        return Ok(Gates::none());
    };
    Gates::load(path).map_err(|err| {
        Fatal::new(
            Some("--gates-file"),
            format!("--gates-file {}: {}", path.display(), one_line(&err)),
            Some("fix the named gate and field (docs/operations.md \"Health gates\"), or leave --gates-file unset for no gates"),
        )
        .into()
    })
}

/// The management-cluster client of `--management-kubeconfig` / `--management-in-cluster` (none without
/// either); an unusable configuration is a [`Fatal`] naming the flag. The API itself is not asked yet.
async fn connect_management(
    args: &ServeArgs,
    metrics: &Metrics,
) -> anyhow::Result<Option<Management>> {
    let Some(source) = args.management_source() else {
        return Ok(None);
    };
    let flag = match source {
        ManagementSource::Kubeconfig(_) => "--management-kubeconfig",
        ManagementSource::InCluster => "--management-in-cluster",
    };
    let management = Management::connect(source, metrics.management.clone())
        .await
        .map_err(|err| {
            Fatal::new(
                Some(flag),
                one_line(&err),
                Some("give a readable kubeconfig of the management cluster (its current context is used), or run in a Pod with a ServiceAccount token for --management-in-cluster; leave both unset to run without the remediation guard and Events"),
            )
        })?;
    tracing::info!(management = ?management, "management cluster API client configured");
    Ok(Some(management))
}

/// `serve`: everything is loaded and checked before the server reports ready. A start-up failure is a
/// [`Fatal`] naming the flag to fix.
pub async fn serve(args: ServeArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    if args.dev
        && args.tls_cert.is_none()
        && !DevCertPaths::in_dir(DEV_CERTS_DIR.as_ref()).server_files_exist()
    {
        let spec = DevCertsSpec::with_defaults(DEV_CERTS_DIR.into(), vec![], vec![]);
        write_dev_certs(&spec).map_err(|err| {
            Fatal::new(
                Some("--dev"),
                format!(
                    "--dev: cannot write development certificates into ./{DEV_CERTS_DIR}: {}",
                    one_line(&err)
                ),
                Some("run where ./certs may be written, or pass --tls-cert and --tls-key"),
            )
        })?;
        tracing::info!(dir = DEV_CERTS_DIR, "generated development certificates");
    }
    let policy = load_policy(args.policy.as_deref()).map_err(|err| {
        Fatal::new(
            Some("--policy"),
            format!("--policy: {}", one_line(err.as_ref())),
            Some("check the file with `inplace-updater policy check FILE`, or leave --policy unset for the built-in default (`inplace-updater policy show`)"),
        )
    })?;
    let gates = load_gates(args.gates_file.as_deref())?;
    let tokens = match &args.agent_tokens {
        Some(path) => AgentTokens::load(path).map_err(|err| {
            Fatal::new(
                Some("--agent-tokens"),
                format!("--agent-tokens: {}", one_line(&err)),
                Some("each line is `sha256:<64 hex> cluster=NAMESPACE/NAME` or `machine=NAMESPACE/NAME`, optionally `expires=<RFC 3339>`; `inplace-updater token create` prints one"),
            )
        })?,
        None => AgentTokens::none(),
    };
    let metrics = Arc::new(Metrics::new());
    let store = inplace_store::open(&args.store, &args.etcd.options())
        .await
        .map_err(|err| {
            let fix = match &args.store {
                StoreUrl::Etcd(_) => "check that the etcd endpoints answer from here and that --etcd-ca, --etcd-cert, --etcd-key and --etcd-user match the cluster",
                _ => "give --store a directory this user may write that no other server uses (file:DIR), or an etcd:// URL",
            };
            Fatal::new(
                Some("--store"),
                format!("--store {}: {}", args.store, one_line(&err)),
                Some(fix),
            )
        })?;
    let store = InstrumentedStore::wrap(store, backend_name(&args.store), metrics.store.clone());
    tracing::info!(store = %store.describe(), rules = policy.rules().len(), gates = gates.len(), agent_tokens = tokens.len(), "loaded");
    if tokens.is_empty() {
        let reason = match &args.agent_tokens {
            None => "no --agent-tokens file given".to_string(),
            Some(path) if !path.exists() => format!(
                "{} does not exist (yet); it is read again every {:?}",
                path.display(),
                args.tls_reload_interval
            ),
            Some(path) => format!("{} has no token line", path.display()),
        };
        tracing::warn!(
            %reason,
            "{NO_AGENT_TOKENS_WARNING} (hook calls are answered; `inplace-updater token create` makes a token and its line)"
        );
    }
    let dispatcher = Dispatcher::with_metrics(
        store,
        args.dispatch_config(),
        shutdown.clone(),
        metrics.fleet.clone(),
    );
    if let Some(path) = &args.test_window_clock_file {
        dispatcher.clock().follow_file_for_tests(path.clone());
    }
    // Before anything in the store is read or changed: a store of another format version is refused.
    dispatcher.check_format().await.map_err(|err| {
        Fatal::new(
            Some("--store"),
            format!("--store {}: {err}", args.store),
            Some("point --store at the store this version wrote, or at an empty one"),
        )
    })?;
    let agent_image = agent_upkeep(&args, &dispatcher)?;
    let management = connect_management(&args, &metrics).await?;
    let gates = Arc::new(gates);
    dispatcher
        .changes
        .set_gates(Arc::new(crate::hooks::gates::FileGates::new(gates.clone())));
    let services = Services {
        engine: Arc::new(Engine {
            policy,
            dispatcher,
            gates,
        }),
        tokens: Arc::new(tokens),
        agent_image,
        management,
    };
    let config = args.config();
    let (hooks, health, metrics_addr) = args.listen_addrs();
    let listeners = Listeners::bind(hooks, health, metrics_addr)
        .await
        .map_err(|err| serve_fatal(&err, &config))?;
    // `listening` is logged by `server::run` once the certificates loaded too.
    server::run(
        config.clone(),
        listeners,
        services,
        metrics,
        Readiness::default(),
        shutdown,
    )
    .await
    .map_err(|err| serve_fatal(&err, &config))?;
    Ok(())
}

/// `token create`: prints the token (for the node) and the line for the server's token file.
pub fn token_create(args: &TokenCreateArgs) -> anyhow::Result<String> {
    let scope = match (&args.cluster, &args.machine) {
        (Some(cluster), _) => AgentScope::Cluster {
            namespace: args.namespace.clone(),
            cluster: cluster.clone(),
        },
        (None, Some(machine)) => AgentScope::Machine(MachineRef::new(&args.namespace, machine)),
        (None, None) => anyhow::bail!("give --cluster or --machine"),
    };
    for part in [
        &args.namespace,
        args.cluster
            .as_ref()
            .or(args.machine.as_ref())
            .unwrap_or(&args.namespace),
    ] {
        anyhow::ensure!(
            crate::dispatch::valid_segment(part),
            "{part:?} is not a valid Kubernetes name"
        );
    }
    let expires = (!args.ttl.is_zero()).then(|| {
        time::OffsetDateTime::now_utc() + time::Duration::seconds(args.ttl.as_secs() as i64)
    });
    let token =
        create_token(&scope, expires).map_err(|err| anyhow::anyhow!("no OS randomness: {err}"))?;
    Ok(format!(
        "token (give this to the agent as its --token-file; it is shown once):\n{}\n\nline for the server's --agent-tokens file:\n{}\n",
        token.token, token.line
    ))
}

/// `policy show` / `policy check`.
pub fn policy(command: &PolicyCommand) -> anyhow::Result<String> {
    match command {
        PolicyCommand::Show => Ok(DEFAULT_POLICY_YAML.to_string()),
        PolicyCommand::Check { file } => {
            let policy = load_policy(Some(file))?;
            Ok(format!(
                "{}: {} rules, valid\n",
                file.display(),
                policy.rules().len()
            ))
        }
    }
}

/// GETs `path` from the server's health port and decodes the JSON body; the headers come back too.
/// The agent executable to hand out and the release the fleet should run (`--agent-binary`, `--agent-release`,
/// `--no-agent-upgrades`), set on the dispatcher.
fn agent_upkeep(
    args: &ServeArgs,
    dispatcher: &Dispatcher,
) -> Result<crate::dispatch::upkeep::rollout::release::SharedImage, Fatal> {
    use crate::dispatch::upkeep::rollout::release::{find_image, release};
    if std::env::var_os(inplace_agent::cli::DEPRECATED_BINARY_ENV).is_some_and(|v| !v.is_empty()) {
        tracing::warn!(
            "{} is set, but it is a node agent's own executable and serve ignores it; the agent executable this \
             server hands out is --agent-binary (INPLACE_UPDATER_SERVED_AGENT_BINARY)",
            inplace_agent::cli::DEPRECATED_BINARY_ENV
        );
    }
    let image = find_image(args.agent_binary.as_deref()).map_err(|err| {
        Fatal::new(
            Some("--agent-binary"),
            err.to_string(),
            Some("name the inplace-agent executable of this release"),
        )
    })?;
    let release = if args.no_agent_upgrades {
        None
    } else {
        release(
            args.agent_release.as_deref(),
            image.as_ref(),
            args.agent_upgrade_concurrency,
            args.agent_upgrade_max_failures,
        )
        .map_err(|err| Fatal::new(Some("--agent-release"), err.to_string(), None::<String>))?
    };
    match (&release, &image) {
        (Some(release), _) => {
            tracing::info!(version = %release.version, architectures = ?release.binaries.keys().collect::<Vec<_>>(), "agents are upgraded to this release")
        }
        (None, _) if args.no_agent_upgrades => {
            tracing::info!("agent self-upgrades are off (--no-agent-upgrades)")
        }
        (None, _) => tracing::info!(
            "agent self-upgrades are off: no inplace-agent beside this executable and no --agent-binary or --agent-release"
        ),
    }
    dispatcher.upkeep.rollout.set_release(release);
    Ok(image.map(Arc::new))
}

/// `diff`: prints the verdicts and returns the exit code (0 in place, 3 rollout, 1 bad input).
pub fn diff(args: &crate::cmd::cli::DiffArgs) -> i32 {
    let policy = match load_policy(args.policy.as_deref()) {
        Ok(policy) => policy,
        Err(err) => {
            eprintln!("error: {err:#}");
            return crate::cmd::diff::EXIT_BAD_INPUT;
        }
    };
    let settings = args.settings.iter().cloned().collect();
    match crate::cmd::diff::run(&args.current, args.desired.as_deref(), &policy, &settings) {
        Ok(report) => {
            let text = match args.output {
                OutputFormat::Text => crate::cmd::diff::render_text(&report),
                OutputFormat::Json => crate::cmd::diff::render_json(&report),
            };
            print!("{text}");
            report.exit_code
        }
        Err(err) => {
            eprintln!("error: {err}");
            crate::cmd::diff::EXIT_BAD_INPUT
        }
    }
}

/// `demo`: runs the demo rollout and prints its summary; fails unless every Machine was updated (with
/// `--fail-machine N`: unless the Machines before N were updated, N was rolled back and none after it started;
/// with `--canary` also: N was rolled back and the brake held every other Machine, and never more Machines
/// updated at once than the budget).
pub async fn demo(args: &crate::cmd::cli::DemoArgs) -> anyhow::Result<()> {
    let temp;
    let dir = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => {
            temp = tempfile::tempdir()?;
            temp.path().to_owned()
        }
    };
    let fail = args.fail_machine.map(usize::from);
    if let Some(n) = fail {
        anyhow::ensure!(
            n <= usize::from(args.machines),
            "--fail-machine {n}: the demo has only {} Machines",
            args.machines
        );
    }
    let scenario = match &args.os_image {
        Some(image) => crate::cmd::demo::scenario::Scenario::OsImage(image.clone()),
        None => crate::cmd::demo::scenario::Scenario::Upgrade,
    };
    use crate::cmd::demo::{canary, run};
    let (results, expected): (_, Box<dyn Fn(usize) -> &'static str>) = if args.canary {
        let paced = canary::run(usize::from(args.machines), &dir, fail, &scenario).await?;
        print!("{}", run::summary(&paced.results));
        println!(
            "at most {} Machines updated at once (--max-concurrent-updates {})",
            paced.most_at_once,
            canary::DEMO_BUDGET
        );
        print!("\n$ inplace-updater status --changes\n{}", paced.changes);
        anyhow::ensure!(
            paced.most_at_once <= canary::DEMO_BUDGET as usize,
            "more Machines updated at once than the budget"
        );
        // The failing canary rolls back and the brake holds every other Machine.
        let expected = move |i: usize| match fail {
            Some(n) if i + 1 == n => run::ROLLED_BACK,
            Some(_) => canary::HELD,
            None => "done",
        };
        (paced.results, Box::new(expected))
    } else {
        let results = run::run(usize::from(args.machines), &dir, fail, &scenario).await?;
        print!("{}", run::summary(&results));
        let expected = move |i: usize| match fail {
            Some(n) if i + 1 == n => run::ROLLED_BACK,
            Some(n) if i + 1 > n => run::NOT_STARTED,
            _ => "done",
        };
        (results, Box::new(expected))
    };
    anyhow::ensure!(
        results
            .iter()
            .enumerate()
            .all(|(i, r)| r.result == expected(i)),
        "some Machines did not end as expected"
    );
    if let crate::cmd::demo::scenario::Scenario::OsImage(image) = &scenario {
        // Every node updated booted the image, after exactly one reboot.
        let wrong: Vec<&str> = results
            .iter()
            .filter(|r| r.result == "done" && r.os != (image.clone(), 1))
            .map(|r| r.name.as_str())
            .collect();
        anyhow::ensure!(
            wrong.is_empty(),
            "not on {image} after one reboot: {}",
            wrong.join(", ")
        );
    }
    Ok(())
}
