//! What an LLM step records about its request, and how a reply or a run ended.
//!
//! The descriptor is written by the agent loop and read back to rebuild the exact request a
//! step sent (`GET …/steps/{id}`); both sides use this one type, so they cannot drift apart.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};
use uuid::Uuid;

use super::{StepKind, StepRecord, StepStatus, ThinkingBlock, Usage};

/// What trimming did to fit a request into its budget.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrimStats {
    /// The budget in characters (0 when there is none).
    pub budget: usize,
    pub chars_before: usize,
    pub chars_after: usize,
    /// Whole turns left out.
    pub dropped_turns: usize,
    /// Tool messages in the result whose content was replaced by a placeholder.
    pub elided_tool_results: usize,
}

impl TrimStats {
    /// True when anything was dropped or elided.
    pub fn trimmed(&self) -> bool {
        self.dropped_turns > 0 || self.elided_tool_results > 0
    }
}

/// How to rebuild the exact request of an LLM step: the stored history up to `upto`, projected
/// with the system prompt and budget that were in force, plus the tools offered. Storing this
/// instead of the request keeps storage per step independent of the history's length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmRequestDescriptor {
    /// Messages `0..upto` of the history were the input of the projection.
    pub upto: usize,
    pub system_prompt: String,
    /// The character budget, when there was one.
    pub budget: Option<usize>,
    pub model: String,
    /// The configured provider's name (`default`: the flags').
    pub provider: String,
    /// The agent version that made the request (absent in steps made before agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<super::AgentTag>,
    /// Names of the tools offered, in the order they were sent.
    pub tools: Vec<String>,
    pub trim: TrimStats,
}

/// Why a model reply or a run ended. Providers' own reasons (`stop`, `end_turn`, `tool_calls`,
/// …) are kept as they were sent; the server's own stops have their own variants. On the wire
/// every reason is a plain string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The run made as many LLM calls as `max_steps` allows.
    MaxSteps,
    /// A token budget stopped the run.
    Budget,
    /// What the provider reported.
    Model(String),
}

impl FinishReason {
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::MaxSteps => "max_steps",
            FinishReason::Budget => "budget",
            FinishReason::Model(reason) => reason,
        }
    }

    pub fn parse(reason: &str) -> FinishReason {
        match reason {
            "max_steps" => FinishReason::MaxSteps,
            "budget" => FinishReason::Budget,
            other => FinishReason::Model(other.to_string()),
        }
    }

    /// True when the server, not the model, ended the run (the run then counts as failed).
    pub fn is_limit(&self) -> bool {
        matches!(self, FinishReason::MaxSteps | FinishReason::Budget)
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for FinishReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FinishReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<FinishReason, D::Error> {
        let reason = std::borrow::Cow::<str>::deserialize(deserializer)?;
        Ok(FinishReason::parse(&reason))
    }
}

/// A step as clients see it: the seed's `AgentStep` union (`type` is `llm`, `tool` or
/// `thinking`), with the run it belongs to and its times beside the seed's fields.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentStep {
    Llm {
        id: Uuid,
        session_id: Uuid,
        run_id: Uuid,
        /// How the request was built (its projection); `GET …/steps/{id}` shows the exact
        /// request rebuilt from it.
        request: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        response: Option<Value>,
        status: StepStatus,
        usage: Usage,
        /// What the step cost in US dollars, when its model had a price (kept in its
        /// response).
        #[serde(skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        created_at: DateTime<Utc>,
        finished_at: Option<DateTime<Utc>>,
    },
    Tool {
        id: Uuid,
        session_id: Uuid,
        run_id: Uuid,
        call_id: String,
        tool: String,
        input: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        output: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
        status: StepStatus,
        created_at: DateTime<Utc>,
        finished_at: Option<DateTime<Utc>>,
    },
    /// The reasoning of one LLM step (`llm_step_id`), when it produced any: `content` is its
    /// readable text, `redacted` how many blocks the provider sent encrypted.
    Thinking {
        id: Uuid,
        session_id: Uuid,
        run_id: Uuid,
        llm_step_id: Option<Uuid>,
        content: String,
        #[serde(skip_serializing_if = "is_zero")]
        redacted: u64,
        created_at: DateTime<Utc>,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a thinking step stores: the LLM step it belongs to (its `request`) and its text (its
/// `response`).
pub fn thinking_step_parts(llm_step_id: Uuid, thinking: &[ThinkingBlock]) -> (Value, Value) {
    let text: Vec<&str> = thinking
        .iter()
        .map(ThinkingBlock::text)
        .filter(|t| !t.is_empty())
        .collect();
    let redacted = thinking
        .iter()
        .filter(|b| matches!(b, ThinkingBlock::RedactedThinking { .. }))
        .count();
    (
        json!({ "llm_step_id": llm_step_id }),
        json!({ "content": text.join("\n\n"), "redacted": redacted }),
    )
}

impl AgentStep {
    pub fn id(&self) -> Uuid {
        match self {
            AgentStep::Llm { id, .. }
            | AgentStep::Tool { id, .. }
            | AgentStep::Thinking { id, .. } => *id,
        }
    }
}

impl From<StepRecord> for AgentStep {
    fn from(step: StepRecord) -> AgentStep {
        let StepRecord {
            id,
            session_id,
            run_id,
            kind,
            status,
            request,
            response,
            usage,
            error,
            created_at,
            finished_at,
        } = step;
        match kind {
            StepKind::Llm => AgentStep::Llm {
                id,
                session_id,
                run_id,
                request,
                cost_usd: response.as_ref().and_then(|r| r["cost_usd"].as_f64()),
                response,
                status,
                usage: usage.unwrap_or_default(),
                error,
                created_at,
                finished_at,
            },
            StepKind::Tool => {
                let text = |v: &Value, key: &str| v[key].as_str().unwrap_or_default().to_string();
                AgentStep::Tool {
                    id,
                    session_id,
                    run_id,
                    call_id: text(&request, "id"),
                    tool: text(&request, "name"),
                    input: request.get("arguments").cloned().unwrap_or(Value::Null),
                    output: response
                        .as_ref()
                        .and_then(|r| r["output"].as_str().map(str::to_string)),
                    is_error: response.as_ref().and_then(|r| r["is_error"].as_bool()),
                    status,
                    created_at,
                    finished_at,
                }
            }
            StepKind::Thinking => AgentStep::Thinking {
                id,
                session_id,
                run_id,
                llm_step_id: request["llm_step_id"].as_str().and_then(|s| s.parse().ok()),
                content: response
                    .as_ref()
                    .and_then(|r| r["content"].as_str().map(str::to_string))
                    .unwrap_or_default(),
                redacted: response
                    .as_ref()
                    .and_then(|r| r["redacted"].as_u64())
                    .unwrap_or(0),
                created_at,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reasons_are_plain_strings_on_the_wire() {
        for (reason, wire) in [
            (FinishReason::MaxSteps, "\"max_steps\""),
            (FinishReason::Budget, "\"budget\""),
            (FinishReason::Model("end_turn".into()), "\"end_turn\""),
        ] {
            assert_eq!(serde_json::to_string(&reason).unwrap(), wire);
            assert_eq!(serde_json::from_str::<FinishReason>(wire).unwrap(), reason);
        }
        assert!(FinishReason::MaxSteps.is_limit());
        assert!(!FinishReason::Model("stop".into()).is_limit());
    }

    #[test]
    fn a_descriptor_round_trips() {
        let descriptor = LlmRequestDescriptor {
            upto: 7,
            system_prompt: "be brief".into(),
            budget: Some(700),
            model: "m".into(),
            provider: "mock".into(),
            agent: Some(crate::model::AgentTag::default()),
            tools: vec!["list_files".into(), "read_file".into()],
            trim: TrimStats {
                budget: 700,
                chars_before: 900,
                chars_after: 650,
                dropped_turns: 1,
                elided_tool_results: 0,
            },
        };
        let value = serde_json::to_value(&descriptor).unwrap();
        assert_eq!(value["upto"], 7);
        assert_eq!(value["trim"]["dropped_turns"], 1);
        let back: LlmRequestDescriptor = serde_json::from_value(value).unwrap();
        assert_eq!(back, descriptor);
    }
}
