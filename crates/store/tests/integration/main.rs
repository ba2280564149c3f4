//! Every integration test of this crate in one test binary: each module was a binary of its own, and
//! each binary linked the whole crate again (one binary builds and links once).

mod common;
mod conformance;
mod conformance_txn;
mod crash;
mod etcd;
mod file;
mod file_full;
