//! OpenAI's two formats as views of a session's log: the Responses API ([`responses`]) and
//! the Agents API's session events and resources ([`agents`]).

pub mod agents;
pub mod responses;

pub use responses::*;
