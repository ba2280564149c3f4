//! Gates against the real Prometheus and Alertmanager (Debian's `prometheus` and `prometheus-alertmanager`),
//! started on loopback by each test, and a metric the test controls served by an exporter in this process.

mod real {
    pub mod alertmanager;
    pub mod daemons;
    pub mod exporter;
    pub mod prometheus;
}
