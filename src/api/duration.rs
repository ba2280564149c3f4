//! Go's `time.ParseDuration` syntax (the `?timeout=` query parameter): the parser lives in `inplace_core`,
//! which also reads v1beta1 Machines' `spec.nodeDrainTimeout` with it.

pub use inplace_core::duration::{DurationError, parse_go_duration};
