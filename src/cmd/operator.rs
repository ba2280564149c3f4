//! The operator's commands against a fleet: `status` (updates, agents, changes and the update budget, from a
//! running server's health port or straight from the store), `retry` and `change` (written to the store the
//! servers share, as the health ports take no writes).

use std::sync::Arc;

use anyhow::Context as _;
use inplace_store::StoreUrl;
use tokio_util::sync::CancellationToken;

use crate::cmd::cli::{ChangeAction, ChangeArgs, EtcdArgs, OutputFormat, RetryArgs, StatusArgs};
use crate::cmd::tables::{render_agents, render_changes, render_status};
use crate::dispatch::changes::budget::BudgetStatus;
use crate::dispatch::changes::control::{ChangeRow, Control};
use crate::dispatch::floor::guard::GuardRecord;
use crate::dispatch::{
    AgentRow, DispatchConfig, Dispatcher, RetentionRecord, RetryOutcome, StatusRow, now_ms,
};
use crate::mgmt::events::metrics::EventsStatus;
use crate::server;

/// What `status` adds when the server has answered no CanUpdate/UpdateMachine call since it started: the
/// server cannot see namespaces, so it names what decides whether CAPI calls it at all.
pub const NO_HOOK_CALLS_HINT: &str = "no CanUpdateMachine, CanUpdateMachineSet or UpdateMachine call \
answered since the server started. If a rollout is under way, CAPI is not calling this extension for its \
Cluster: check the ExtensionConfig's namespaceSelector (deploy/ selects inplace-updater/enabled=true) and the \
label on the Cluster's namespace (kubectl label namespace NAMESPACE inplace-updater/enabled=true), and that \
`kubectl get extensionconfig inplace-updater` lists the three handlers in its status.";

/// `status`: from a running server's health port, or straight from a store. With `--agents`, the agents.
pub async fn status(args: &StatusArgs) -> anyhow::Result<String> {
    if args.agents {
        let rows: Vec<AgentRow> = match &args.store {
            Some(url) => {
                store_dispatcher(&args.etcd, url)
                    .await?
                    .agents
                    .list()
                    .await?
            }
            None => get_json(args, "/status/agents").await?.0,
        };
        return Ok(match args.output {
            OutputFormat::Json => serde_json::to_string_pretty(&rows)? + "\n",
            OutputFormat::Text => render_agents(&rows, now_ms()),
        });
    }
    if args.changes {
        let rows: Vec<ChangeRow> = match &args.store {
            Some(url) => {
                store_dispatcher(&args.etcd, url)
                    .await?
                    .changes
                    .list()
                    .await?
            }
            None => get_json(args, "/status/changes").await?.0,
        };
        return Ok(match args.output {
            OutputFormat::Json => serde_json::to_string_pretty(&rows)? + "\n",
            OutputFormat::Text => render_changes(&rows),
        });
    }
    // Only a running server knows whether CAPI has called it; a store read directly cannot say.
    let mut no_hook_calls = false;
    // Only a running server counts its Events.
    let mut events = None;
    let (rows, retention, budget, guards): (
        Vec<StatusRow>,
        Option<RetentionRecord>,
        BudgetStatus,
        Vec<GuardRecord>,
    ) = match &args.store {
        Some(url) => {
            let dispatcher = store_dispatcher(&args.etcd, url).await?;
            (
                dispatcher.fleet.status().await?,
                dispatcher.retention().await?,
                BudgetStatus {
                    limits_unknown: true,
                    ..dispatcher.budget.status().await?
                },
                dispatcher.remediation_guards().await?,
            )
        }
        None => {
            let (rows, headers) = get_json(args, "/status").await?;
            no_hook_calls = headers
                .get(server::HOOK_CALLS_ANSWERED_HEADER)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim() == "0");
            let status: EventsStatus = get_json(args, "/status/events").await?.0;
            events = Some(status.status_line());
            (
                rows,
                get_json(args, "/status/retention").await?.0,
                get_json(args, "/status/budget").await?.0,
                get_json(args, "/status/guards").await?.0,
            )
        }
    };
    let retention = match &retention {
        Some(record) => format!("{}\n", record.status_line(now_ms())),
        None => "retention: no sweep has run against this store yet\n".to_string(),
    };
    let mut retention = format!(
        "{}\n{}\n{retention}",
        budget.status_line(now_ms()),
        crate::dispatch::guards::status_line(&guards)
    );
    if let Some(line) = events {
        retention.push_str(&format!("{line}\n"));
    }
    Ok(match args.output {
        OutputFormat::Json => {
            if no_hook_calls {
                eprintln!("{NO_HOOK_CALLS_HINT}");
            }
            serde_json::to_string_pretty(&rows)? + "\n"
        }
        OutputFormat::Text if no_hook_calls => {
            format!(
                "{}{retention}\n{NO_HOOK_CALLS_HINT}\n",
                render_status(&rows)
            )
        }
        OutputFormat::Text => format!("{}{retention}", render_status(&rows)),
    })
}

/// `retry`: starts a fresh run of the Machine's failed update in the store; an error when there is nothing to
/// retry.
pub async fn retry(args: &RetryArgs) -> anyhow::Result<String> {
    let machine = &args.machine;
    let value = args
        .value
        .clone()
        .unwrap_or_else(|| format!("cli-{}", now_ms()));
    let dispatcher = store_dispatcher(&args.etcd, &args.store).await?;
    match dispatcher.runs.retry(machine, &value).await? {
        RetryOutcome::Started { run_id } => Ok(format!(
            "{machine}: a fresh run of the failed update started (run {}); its agent picks it up at once, \
             and the next UpdateMachine answers from it\n",
            run_id.chars().take(12).collect::<String>()
        )),
        RetryOutcome::Ignored { state } => anyhow::bail!(
            "{machine}: nothing to retry: its current update has not failed ({state})"
        ),
        RetryOutcome::AlreadySeen => {
            anyhow::bail!("{machine}: retry value {value:?} was used before; pass a new --value")
        }
        RetryOutcome::NoRecord => {
            anyhow::bail!("{machine}: no update is recorded for this Machine")
        }
    }
}

/// `inplace-updater change ACTION ID`: the control as one compare-and-swap on the change record.
pub async fn change(args: &ChangeArgs) -> anyhow::Result<String> {
    let control = match args.action {
        ChangeAction::Halt => Control::Halt,
        ChangeAction::Release => Control::Release,
        ChangeAction::Promote => Control::Promote,
    };
    let dispatcher = store_dispatcher(&args.etcd, &args.store).await?;
    let Some(record) = dispatcher.changes.control(&args.id, control).await? else {
        anyhow::bail!(
            "no change {} is recorded (ids: `inplace-updater status --changes`)",
            args.id
        );
    };
    let row = ChangeRow::of(&record);
    Ok(format!(
        "change {} ({}): {}\n",
        row.id, row.label, row.state
    ))
}

async fn store_dispatcher(etcd: &EtcdArgs, url: &StoreUrl) -> anyhow::Result<Arc<Dispatcher>> {
    let store = inplace_store::open(url, &etcd.options())
        .await
        .with_context(|| format!("opening {url}"))?;
    let dispatcher = Dispatcher::new(store, DispatchConfig::default(), CancellationToken::new());
    dispatcher
        .check_format()
        .await
        .with_context(|| format!("reading {url}"))?;
    Ok(dispatcher)
}

async fn get_json<T: serde::de::DeserializeOwned>(
    args: &StatusArgs,
    path: &str,
) -> anyhow::Result<(T, hyper::HeaderMap)> {
    let url = format!("{}{path}", args.server.trim_end_matches('/'));
    let (body, headers) = crate::cmd::http::get_plain_response(&url)
        .await
        .with_context(|| format!("asking {} for {path}", args.server))?;
    let value = serde_json::from_slice(&body).with_context(|| format!("decoding {path}"))?;
    Ok((value, headers))
}
