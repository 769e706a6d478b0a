//! The agent loop and context projection.
pub mod context;
