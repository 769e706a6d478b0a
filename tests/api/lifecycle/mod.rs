//! The life of a run: cancel, resume after a crash or a stop, fork, conflicting runs,
//! `max_steps`, the current configuration winning after a restart, graceful shutdown, and what
//! a long session stores.
//!
//! - `cancel`: cancel mid-stream, right after the run was posted, and with nothing running.
//! - `resume`: after a kill -9 mid-turn, and what resume answers in each state.
//! - `fork`: the turns a fork copies; a fork and its source are independent.
//! - `state_rules`: one run at a time, `max_steps`, the restarted server's configuration, delete.
//! - `shutdown`: SIGTERM during a run, and its resume after the restart.
//! - `storage`: an LLM step's storage does not grow with the history.

mod cancel;
mod fork;
mod resume;
mod shutdown;
mod state_rules;
mod storage;
