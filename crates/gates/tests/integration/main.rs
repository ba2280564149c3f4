//! Every integration test of this crate in one test binary: the gates file (`config`), and the gates against
//! the real Prometheus and Alertmanager (Debian's `prometheus` and `prometheus-alertmanager`), started on
//! loopback by each test, with a metric the test controls served by an exporter in this process.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod alertmanager;
mod config;
mod daemons;
mod exporter;
mod prometheus;
mod token;
