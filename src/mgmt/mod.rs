//! The management cluster (issue 40).

pub mod events;
