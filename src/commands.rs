//! CLI glue: turns each parsed subcommand into library calls and prints the result. `anyhow` lives here and
//! in `main`, nowhere else.

use std::sync::Arc;

use anyhow::Context as _;
use inplace_agent_api::MachineRef;
use inplace_core::{DEFAULT_POLICY_YAML, Policy};
use tokio_util::sync::CancellationToken;

use crate::auth::{AgentTokens, create_token};
use crate::certs::{DevCertPaths, DevCertsSpec, write_dev_certs};
use crate::cli::{
    DEV_CERTS_DIR, OutputFormat, PolicyCommand, ServeArgs, StatusArgs, TokenCreateArgs,
};
use crate::dispatch::{AgentScope, DispatchConfig, Dispatcher, StatusRow};
use crate::hooks::Engine;
use crate::server::{self, Listeners, Metrics, Readiness, Services};

/// Start-up warning when the server holds no agent token: CanUpdate hooks work, but no update can be
/// carried out because no agent gets in.
pub const NO_AGENT_TOKENS_WARNING: &str = "no agent tokens: no agent can authenticate";

/// What `status` adds when the server has answered no CanUpdate/UpdateMachine call since it started: the
/// server cannot see namespaces, so it names what decides whether CAPI calls it at all.
pub const NO_HOOK_CALLS_HINT: &str = "no CanUpdateMachine, CanUpdateMachineSet or UpdateMachine call \
answered since the server started. If a rollout is under way, CAPI is not calling this extension for its \
Cluster: check the ExtensionConfig's namespaceSelector (deploy/ selects inplace-updater/enabled=true) and the \
label on the Cluster's namespace (kubectl label namespace NAMESPACE inplace-updater/enabled=true), and that \
`kubectl get extensionconfig inplace-updater` lists the three handlers in its status.";

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

/// `serve`: everything is loaded and checked before the server reports ready.
pub async fn serve(args: ServeArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    if args.dev
        && args.tls_cert.is_none()
        && !DevCertPaths::in_dir(DEV_CERTS_DIR.as_ref()).server_files_exist()
    {
        let spec = DevCertsSpec::with_defaults(DEV_CERTS_DIR.into(), vec![], vec![]);
        write_dev_certs(&spec).context("generating development certificates")?;
        tracing::info!(dir = DEV_CERTS_DIR, "generated development certificates");
    }
    let policy = load_policy(args.policy.as_deref())?;
    let tokens = match &args.agent_tokens {
        Some(path) => AgentTokens::load(path).context("agent tokens")?,
        None => AgentTokens::none(),
    };
    let store = inplace_store::open(&args.store, &args.etcd.options())
        .await
        .with_context(|| format!("opening the store {}", args.store))?;
    tracing::info!(store = %store.describe(), rules = policy.rules().len(), agent_tokens = tokens.len(), "loaded");
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
    let dispatcher = Dispatcher::new(store, args.dispatch_config(), shutdown.clone());
    let services = Services {
        engine: Arc::new(Engine {
            policy,
            dispatcher: Some(dispatcher),
        }),
        tokens: Arc::new(tokens),
    };
    let (hooks, health, metrics) = args.listen_addrs();
    let listeners = Listeners::bind(hooks, health, metrics).await?;
    let (hooks, health, metrics) = listeners.local_addrs()?;
    tracing::info!(%hooks, %health, %metrics, "listening");
    server::run(
        args.config(),
        listeners,
        services,
        Arc::new(Metrics::new()),
        Readiness::default(),
        shutdown,
    )
    .await?;
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
            crate::dispatch::records::valid_segment(part),
            "{part:?} is not a valid Kubernetes name"
        );
    }
    let expires = args
        .ttl
        .map(|ttl| time::OffsetDateTime::now_utc() + time::Duration::seconds(ttl.as_secs() as i64));
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

/// `status`: from a running server's health port, or straight from a store.
pub async fn status(args: &StatusArgs) -> anyhow::Result<String> {
    // Only a running server knows whether CAPI has called it; a store read directly cannot say.
    let mut no_hook_calls = false;
    let rows: Vec<StatusRow> = match &args.store {
        Some(url) => {
            let store = inplace_store::open(url, &args.etcd.options())
                .await
                .with_context(|| format!("opening {url}"))?;
            Dispatcher::new(store, DispatchConfig::default(), CancellationToken::new())
                .status()
                .await?
        }
        None => {
            let (body, headers) = crate::http::get_plain_response(&format!(
                "{}/status",
                args.server.trim_end_matches('/')
            ))
            .await
            .with_context(|| format!("asking {} for /status", args.server))?;
            no_hook_calls = headers
                .get(server::HOOK_CALLS_ANSWERED_HEADER)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim() == "0");
            serde_json::from_slice(&body).context("decoding /status")?
        }
    };
    Ok(match args.output {
        OutputFormat::Json => {
            if no_hook_calls {
                eprintln!("{NO_HOOK_CALLS_HINT}");
            }
            serde_json::to_string_pretty(&rows)? + "\n"
        }
        OutputFormat::Text if no_hook_calls => {
            format!("{}\n{NO_HOOK_CALLS_HINT}\n", render_status(&rows))
        }
        OutputFormat::Text => render_status(&rows),
    })
}

fn render_status(rows: &[StatusRow]) -> String {
    if rows.is_empty() {
        return "no updates recorded\n".into();
    }
    let mut out = String::new();
    let mut cluster = "";
    for row in rows {
        if row.cluster != cluster {
            cluster = &row.cluster;
            out.push_str(&format!("cluster {cluster}\n"));
        }
        let state = serde_json::to_value(row.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {:<40} {:<12} {:<12} {}",
            row.machine, state, row.run, row.step
        ));
        if !row.message.is_empty() {
            out.push_str(&format!(
                " — {}",
                row.message.lines().next().unwrap_or_default()
            ));
        }
        out.push('\n');
    }
    out
}

/// `diff`: prints the verdicts and returns the exit code (0 in place, 3 rollout, 1 bad input).
pub fn diff(args: &crate::cli::DiffArgs) -> i32 {
    let policy = match load_policy(args.policy.as_deref()) {
        Ok(policy) => policy,
        Err(err) => {
            eprintln!("error: {err:#}");
            return crate::diffcmd::EXIT_BAD_INPUT;
        }
    };
    let settings = args.settings.iter().cloned().collect();
    match crate::diffcmd::run(&args.current, args.desired.as_deref(), &policy, &settings) {
        Ok(report) => {
            let text = match args.output {
                OutputFormat::Text => crate::diffcmd::render_text(&report),
                OutputFormat::Json => crate::diffcmd::render_json(&report),
            };
            print!("{text}");
            report.exit_code
        }
        Err(err) => {
            eprintln!("error: {err}");
            crate::diffcmd::EXIT_BAD_INPUT
        }
    }
}

/// `demo`: runs the demo rollout and prints its summary; fails unless every Machine was updated.
pub async fn demo(args: &crate::cli::DemoArgs) -> anyhow::Result<()> {
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
    let results = crate::demo::run::run(usize::from(args.machines), &dir).await?;
    print!("{}", crate::demo::run::summary(&results));
    anyhow::ensure!(
        results.iter().all(|r| r.result == "done"),
        "some Machines were not updated"
    );
    Ok(())
}
