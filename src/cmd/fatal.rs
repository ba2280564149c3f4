//! Fatal errors of the binary: one line, once, in the chosen log format (a JSON object under
//! `--log-format json`), naming the flag to change and how, then exit code 1. Never a backtrace, never the same
//! cause twice. Command-line mistakes (clap's errors) get the same treatment, so a bad `--store` URL looks like
//! any other start-up error to whatever collects the logs.

// The one-line fatal error itself is shared with `inplace-agent` (crates/agent/src/cli/fatal.rs).
pub use inplace_agent::cli::{EXIT_FATAL, Fatal, log_format_of, one_line};

/// The fatal error of whatever a command returned.
pub fn of(error: &anyhow::Error) -> Fatal {
    if let Some(fatal) = error.downcast_ref::<Fatal>() {
        return fatal.clone();
    }
    Fatal::new(None, one_line(error.as_ref()), None::<String>)
}

/// The flag and fix of a server that could not start (or had to stop).
pub fn serve_fatal(
    error: &crate::server::ServeError,
    config: &crate::server::ServeConfig,
) -> Fatal {
    use crate::server::ServeError;
    use crate::server::tls::TlsError;
    match error {
        ServeError::Bind { addr, flag, source } => {
            let fix = if source.kind() == std::io::ErrorKind::AddrInUse {
                format!("another process holds {addr}: stop it, or give {flag} another address")
            } else {
                format!("give {flag} an address of this host that this user may bind")
            };
            Fatal::new(Some(flag), one_line(error), Some(fix))
        }
        ServeError::Tls(tls) => {
            let path = match tls {
                TlsError::Read(read) => Some(read.path()),
                TlsError::Certificate { path, .. }
                | TlsError::Key { path, .. }
                | TlsError::ClientCa { path, .. } => Some(path.as_path()),
                TlsError::Pair { .. } => None,
            };
            let flag = if path.is_some() && path == config.client_ca.as_deref() {
                "--client-ca"
            } else if path == Some(config.tls.key.as_path()) {
                "--tls-key"
            } else {
                "--tls-cert"
            };
            let fix = if flag == "--client-ca" {
                "give --client-ca the PEM CA bundle that signs CAPI's client certificates"
            } else {
                "point --tls-cert and --tls-key at the PEM serving certificate and its key (cert-manager's \
                 tls.crt and tls.key; `inplace-updater certs --out DIR` writes development ones)"
            };
            Fatal::new(
                Some(flag),
                format!("{flag}: {}", one_line(error)),
                Some(fix),
            )
        }
        ServeError::TaskDied(_) => Fatal::new(None, one_line(error), None::<String>),
    }
}

/// The fatal error of a command line clap refused: its message in one line, with the flag it names.
pub fn of_clap(error: &clap::Error) -> Fatal {
    inplace_agent::cli::of_clap(error, "inplace-updater <command>")
}

/// Logs `fatal` as one ERROR line and exits with [`EXIT_FATAL`].
pub fn exit(fatal: &Fatal) -> ! {
    fatal.log();
    crate::observe::logs::flush();
    std::process::exit(EXIT_FATAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on 127.0.0.1:9443: {0}")]
    struct Embeds(#[source] std::io::Error);

    #[test]
    fn a_command_error_is_one_line_with_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use");
        let error = anyhow::Error::from(Embeds(io)).context("starting");
        assert_eq!(
            of(&error).problem,
            "starting: cannot listen on 127.0.0.1:9443: address in use"
        );
    }
}
