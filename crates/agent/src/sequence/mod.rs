//! Command sequences of the agent's `--config`: what a command is (`command`: `run`, `writeFile`, `fetch`,
//! `sysextSwitch` …), the `record:`/`undo:` sequences a rollback runs (`undo`), the `{{variable}}` templates they
//! are written in (`template`), and running one process with its bounds (`process`).

pub(crate) mod command;
pub(crate) mod process;
pub(crate) mod progress;
pub(crate) mod template;
pub(crate) mod undo;
