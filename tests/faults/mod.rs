//! Faults, hostile providers and hostile pages, tried from outside through HTTP: what tah does
//! when its storage fails, when a provider sends without bounds or echoes secrets, and when a
//! web page or a slow client tries what a browser or a socket allows.
//!
//! - `storage`: a full disk (a small tmpfs), a second process on the same database, a
//!   read-only or deleted database (the tmpfs ones need root: `cfg(mount_tests)`).
//! - `provider`: the hostile provider of `hostile.rs` (endless text, a huge line, ten thousand
//!   tool calls, huge arguments, a trickle, a split surrogate pair, echoed keys).
//! - `web`: Host and Origin checks, content types, the bearer scheme.
//! - `connections`: partial headers, idle and silent connections, the connection cap, HTTP/2
//!   with prior knowledge.
//! - `sessions`: a row that cannot be read, a fork during a run, paging.

mod connections;
mod hostile;
mod provider;
mod sessions;
mod storage;
mod web;
