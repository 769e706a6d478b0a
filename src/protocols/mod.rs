//! The protocols front ends already speak, as views of a session's event log: the Vercel AI
//! SDK's UI message stream ([`ai_sdk`]) and AG-UI ([`ag_ui`]). Each adapter is a small state
//! machine from tah events to the protocol's frames; [`calls`] is what both read from a run's
//! log about the calls that wait for an answer, and [`parts`] how both open, fill and close
//! the reasoning and text of a step.
//!
//! Pure: no I/O, nothing stored. The HTTP layer reads the log, feeds it in, and writes the
//! frames out.

pub mod a2a;
pub mod acp;
pub mod ag_ui;
pub mod ai_sdk;
pub mod anthropic;
pub mod calls;
pub mod mcp;
pub mod openai;
pub mod parts;
