//! The agent's HTTPS link to its server: the client (`client`, TLS, long-poll, bounded answers), the bearer
//! token and its rotation (`token_file`), and the words a failed exchange is explained in (`diagnose`).

pub(crate) mod client;
pub(crate) mod diagnose;
pub(crate) mod token_file;
