//! Runs one configured command: argv only (no shell), a clean environment, its own process
//! group, a deadline after which the whole group is killed, and bounded tails of its output.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use inplace_agent_api::STDERR_TAIL_MAX_BYTES;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;
use tokio::time::Instant;

/// After the deadline (or a shutdown) the group gets SIGTERM, then SIGKILL after this long.
pub const KILL_GRACE: Duration = Duration::from_secs(5);
/// After the command exits, its output pipes are read for at most this long; a grandchild that
/// still holds them open is then killed with the rest of the group.
pub const OUTPUT_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes of stdout kept (the last ones): enough for version strings and checks.
pub const STDOUT_TAIL_MAX_BYTES: usize = 4096;
/// Starts tried again, [`SPAWN_BUSY_DELAY`] apart, while the program is busy (ETXTBSY): a program file written
/// moments before (a fresh binary, a stand-in) is refused while any process still holds it open for writing —
/// including one forked by another thread between the write and its own exec, which lasts moments.
pub const SPAWN_BUSY_RETRIES: u32 = 10;
/// Pause between those tries.
pub const SPAWN_BUSY_DELAY: Duration = Duration::from_millis(20);

/// The environment every command gets: `PATH` as configured, `INPLACE_ROOT`, `LANG=C.UTF-8`,
/// plus the configured extra variables. Nothing is inherited from the agent's own environment.
#[derive(Clone, Debug)]
pub(crate) struct CommandEnv {
    /// `PATH` (also where argv[0] is looked up).
    pub path: String,
    /// `--root`, exported as `INPLACE_ROOT`.
    pub root: PathBuf,
    /// Extra variables from the driver config.
    pub extra: BTreeMap<String, String>,
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CommandEnd {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal (not by the agent).
    Signaled(i32),
    /// The deadline passed; the agent killed the process group.
    TimedOut,
    /// The agent is shutting down; it killed the process group.
    Cancelled,
    /// It could not be started.
    SpawnFailed(String),
}

/// The result of one command.
#[derive(Clone, Debug)]
pub(crate) struct CommandOutput {
    /// How it ended.
    pub end: CommandEnd,
    /// Last [`STDOUT_TAIL_MAX_BYTES`] of stdout.
    pub stdout_tail: String,
    /// Last [`STDERR_TAIL_MAX_BYTES`] of stderr.
    pub stderr_tail: String,
}

impl CommandOutput {
    /// True on exit code 0.
    pub fn success(&self) -> bool {
        self.end == CommandEnd::Exited(0)
    }

    /// The first non-empty line of its stdout, trimmed (what a version command says).
    pub fn first_line(&self) -> Option<&str> {
        self.stdout_tail
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
    }
}

/// Runs `argv` until it exits, `deadline` passes, or `cancel` turns true.
pub(crate) async fn run_command(
    argv: &[String],
    env: &CommandEnv,
    deadline: Instant,
    cancel: &mut watch::Receiver<bool>,
) -> CommandOutput {
    let spawn_failed = |message: String| CommandOutput {
        end: CommandEnd::SpawnFailed(message),
        stdout_tail: String::new(),
        stderr_tail: String::new(),
    };
    let Some((program, args)) = argv.split_first() else {
        return spawn_failed("empty command".to_owned());
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .env("PATH", &env.path)
        .env("INPLACE_ROOT", &env.root)
        .env("LANG", "C.UTF-8")
        .envs(&env.extra)
        .current_dir(&env.root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut busy = 0;
    let mut child = loop {
        match command.spawn() {
            Ok(child) => break child,
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && busy < SPAWN_BUSY_RETRIES =>
            {
                busy += 1;
                tokio::time::sleep(SPAWN_BUSY_DELAY).await;
            }
            Err(e) => return spawn_failed(format!("cannot start {program:?}: {e}")),
        }
    };
    let pgid = child
        .id()
        .and_then(|id| rustix::process::Pid::from_raw(id as i32));
    // If this future is dropped mid-command (the agent's task is aborted), the group dies too.
    let mut guard = GroupGuard(pgid);
    let stdout = child
        .stdout
        .take()
        .map(|s| tokio::spawn(read_tail(s, STDOUT_TAIL_MAX_BYTES)));
    let stderr = child
        .stderr
        .take()
        .map(|s| tokio::spawn(read_tail(s, STDERR_TAIL_MAX_BYTES)));

    let end = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => exit_of(status),
            Err(e) => CommandEnd::SpawnFailed(format!("waiting for {program:?}: {e}")),
        },
        () = tokio::time::sleep_until(deadline) => {
            stop_group(&mut child, pgid).await;
            CommandEnd::TimedOut
        }
        () = cancelled(cancel) => {
            stop_group(&mut child, pgid).await;
            CommandEnd::Cancelled
        }
    };
    let drain_until = Instant::now() + OUTPUT_DRAIN_TIMEOUT;
    let stdout_tail = collect(stdout, drain_until, pgid).await;
    let stderr_tail = collect(stderr, drain_until, pgid).await;
    guard.0 = None;
    CommandOutput {
        end,
        stdout_tail,
        stderr_tail,
    }
}

/// Kills the process group when dropped while still armed.
struct GroupGuard(Option<rustix::process::Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

/// Completes when `cancel` turns true (never, if its sender is gone without doing so).
pub(crate) async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn exit_of(status: std::process::ExitStatus) -> CommandEnd {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => CommandEnd::Exited(code),
        (None, Some(signal)) => CommandEnd::Signaled(signal),
        (None, None) => CommandEnd::Exited(-1),
    }
}

/// SIGTERM to the group, SIGKILL after [`KILL_GRACE`], then reap the child.
async fn stop_group(child: &mut tokio::process::Child, pgid: Option<rustix::process::Pid>) {
    if let Some(pgid) = pgid {
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(KILL_GRACE, child.wait())
        .await
        .is_err()
    {
        kill_group(pgid);
        let _ = child.kill().await;
    }
    // Members that ignored SIGTERM while the leader exited.
    kill_group(pgid);
}

fn kill_group(pgid: Option<rustix::process::Pid>) {
    if let Some(pgid) = pgid {
        // ESRCH (group already gone) is the normal case.
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
}

async fn collect(
    reader: Option<tokio::task::JoinHandle<Vec<u8>>>,
    until: Instant,
    pgid: Option<rustix::process::Pid>,
) -> String {
    let Some(mut reader) = reader else {
        return String::new();
    };
    let bytes = match tokio::time::timeout_at(until, &mut reader).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => Vec::new(),
        Err(_) => {
            // A leftover process holds the pipe open: end the group, then take what was read.
            kill_group(pgid);
            reader.await.unwrap_or_default()
        }
    };
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Reads a stream to its end keeping only the last `max` bytes.
async fn read_tail(mut stream: impl AsyncRead + Unpin, max: usize) -> Vec<u8> {
    let mut kept = Vec::with_capacity(max.min(8192));
    let mut chunk = [0u8; 8192];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&chunk[..n]);
                if kept.len() > 2 * max {
                    kept.drain(..kept.len() - max);
                }
            }
        }
    }
    if kept.len() > max {
        kept.drain(..kept.len() - max);
    }
    // Lossy decoding later could grow a cut UTF-8 sequence; trim a partial leading character.
    while kept.first().is_some_and(|b| (0x80..0xC0).contains(b)) {
        kept.remove(0);
    }
    kept
}

/// Renders argv for messages: `kubeadm upgrade node`. Arguments are the operator's own config
/// with a validated version substituted, so they carry no secrets.
pub(crate) fn display_argv(argv: &[String]) -> String {
    argv.join(" ")
}
