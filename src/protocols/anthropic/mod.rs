//! Claude Managed Agents (`client.beta.agents`, `client.beta.sessions`,
//! `client.beta.sessions.events` of Anthropic's SDKs) as views of tah's agents and sessions:
//! their agent object ↔ tah's agent version ([`agents`]), and a session's log as their
//! session events ([`events`]). Pure: the HTTP face (`crate::http::adapters::anthropic`)
//! reads and writes.

pub mod agents;
pub mod events;
