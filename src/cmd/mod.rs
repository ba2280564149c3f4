//! Command glue: everything the binary's subcommands need around the data path and nothing the data path
//! needs. [`cli`] holds the clap types, [`commands`] turns each parsed subcommand into library calls ([`operator`]: the
//! operator's `status`, `retry` and `change`), [`fatal`]
//! prints a start-up failure as one line naming the flag to fix; [`diff`], [`demo`] and [`certs`] are the
//! `diff`, `demo` and `certs` subcommands, [`http`] is the plain-HTTP GET `status` reads the health port
//! with, and [`tables`] how `status` prints for a person.

pub mod certs;
pub mod cli;
pub mod commands;
pub mod demo;
pub mod diff;
pub mod fatal;
pub mod http;
pub mod operator;
pub mod tables;
