//! Traces: OpenTelemetry spans of runs, LLM calls and tool calls, named and attributed as the
//! GenAI semantic conventions have them (`invoke_agent`, `chat {model}`, `execute_tool
//! {tool}`), exported over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the exporter reads the other standard `OTEL_*`
//! variables itself (headers, timeout, compression, `OTEL_BSP_*`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`).
//!
//! The spans are `tracing` spans of their own target, [`TARGET`], which only the OpenTelemetry
//! layer enables: the log never shows them, and without an exporter no layer wants them, so
//! each one is a disabled span (one atomic load; nothing is formatted or allocated). Messages
//! and tool arguments and results go into spans only with `--trace-content`.
//!
//! This module owns the set-up ([`Traces`]) and the span helpers the session actor and the
//! agent loop call; it knows nothing of sessions or storage.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::{Status, TracerProvider as _};
use opentelemetry::{Array, StringValue, Value as OtelValue};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use serde_json::{json, Value};
use tracing::field::Empty;
use tracing::{Metadata, Span, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::filter::{filter_fn, FilterExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;
use uuid::Uuid;

use crate::llm::{LlmError, LlmErrorKind, ModelReply};
use crate::model::{Message, Role, RunRecord, RunStatus, ToolCall};
use crate::tools::ToolOutput;

/// The `tracing` target of the trace spans: only the OpenTelemetry layer enables it.
pub const TARGET: &str = "tah::trace";

/// The service name when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` gives one.
const SERVICE_NAME: &str = "tah";

/// `--trace-content`: messages, tool arguments and results go into spans.
static CONTENT: AtomicBool = AtomicBool::new(false);

#[derive(Debug, thiserror::Error)]
pub enum TraceSetupError {
    #[error(
        "{var}={value:?}: this build exports traces over OTLP/HTTP only; set it to \
         http/protobuf (the default) or http/json"
    )]
    Protocol { var: &'static str, value: String },
    #[error("cannot set up the OTLP trace exporter: {0}")]
    Exporter(String),
}

/// The trace exporter, while the process runs.
pub struct Traces {
    provider: SdkTracerProvider,
}

/// True for the metadata of a trace span (the log leaves them out).
pub fn is_trace_span(metadata: &Metadata<'_>) -> bool {
    metadata.target() == TARGET
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Traces {
    /// The exporter the environment asks for: `None` unless an OTLP endpoint is set (or when
    /// `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`). `content` is
    /// `--trace-content`.
    pub fn from_env(content: bool) -> Result<Option<Traces>, TraceSetupError> {
        let endpoint = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .is_some();
        let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
        if !endpoint || disabled {
            return Ok(None);
        }
        let protocol = protocol()?;
        // An https endpoint needs the TLS provider the rest of the crate uses.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .build()
            .map_err(|e| TraceSetupError::Exporter(e.to_string()))?;
        let mut resource = Resource::builder();
        let named = env("OTEL_SERVICE_NAME").is_some()
            || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
        if !named {
            resource = resource.with_service_name(SERVICE_NAME);
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        CONTENT.store(content, Ordering::Relaxed);
        Ok(Some(Traces { provider }))
    }

    /// The `tracing` layer that turns the trace spans (and nothing else) into OpenTelemetry
    /// spans.
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer("tah");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(filter_fn(is_trace_span).and(filter_fn(|m| m.is_span())))
    }

    /// Exports the spans still queued and stops the exporter. It blocks: call it outside the
    /// async runtime (or from a blocking task).
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "could not export the last trace spans");
        }
    }
}

/// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`; http/protobuf
/// unless one of them says http/json.
fn protocol() -> Result<Protocol, TraceSetupError> {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        let Some(value) = env(var) else { continue };
        return match value.trim().to_ascii_lowercase().as_str() {
            "http/protobuf" => Ok(Protocol::HttpBinary),
            "http/json" => Ok(Protocol::HttpJson),
            _ => Err(TraceSetupError::Protocol { var, value }),
        };
    }
    Ok(Protocol::HttpBinary)
}

/// Whether content goes into this span: `--trace-content`, and the span is exported.
fn with_content(span: &Span) -> bool {
    !span.is_disabled() && CONTENT.load(Ordering::Relaxed)
}

fn failed(span: &Span, error_type: &str, description: &str) {
    span.record("error.type", error_type);
    span.set_status(Status::error(description.to_string()));
}

/// The span of one operation of a run (an LLM call, a tool call), a child of the current span:
/// the attributes every operation has, then the operation's own. Its `otel.name` and
/// conversation are recorded by [`name_operation`], and only when the span is exported.
macro_rules! operation_span {
    ($operation:literal, $kind:literal, $($field:tt)*) => {
        tracing::info_span!(
            target: TARGET,
            $operation,
            otel.name = Empty,
            otel.kind = $kind,
            gen_ai.operation.name = $operation,
            gen_ai.conversation.id = Empty,
            $($field)*
        )
    };
}

/// Records an operation span's name (`{operation} {subject}`) and its conversation, when
/// there is one; nothing for a disabled span (the name is not even formatted).
fn name_operation(span: &Span, name: std::fmt::Arguments<'_>, conversation: Option<Uuid>) {
    if span.is_disabled() {
        return;
    }
    span.record("otel.name", name.to_string().as_str());
    if let Some(id) = conversation {
        span.record("gen_ai.conversation.id", tracing::field::display(id));
    }
}

/// The span of one run (`invoke_agent`): a root, or the child of `parent` (the `execute_tool
/// task` span of the parent run, for a sub-agent).
pub fn run_span(
    parent: &Span,
    session: Uuid,
    run: Uuid,
    provider: &str,
    model: &str,
    agent: &crate::model::AgentTag,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "invoke_agent",
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.conversation.id = %session,
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        gen_ai.agent.name = agent.name.as_str(),
        gen_ai.agent.id = %agent.id,
        tah.agent.version = agent.version,
        tah.run.id = %run,
        tah.run.status = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        error.type = Empty,
    )
}

/// The run ended: its totals, and an error status when it failed.
pub fn run_ended(span: &Span, run: &RunRecord) {
    if span.is_disabled() {
        return;
    }
    span.record("tah.run.status", run.status.as_str());
    span.record("gen_ai.usage.input_tokens", count(run.usage.input_tokens));
    span.record("gen_ai.usage.output_tokens", count(run.usage.output_tokens));
    if let Some(reason) = &run.finish_reason {
        finish_reasons(span, reason.as_str());
    }
    if run.status == RunStatus::Failed {
        let reason = run.finish_reason.as_ref().map_or("failed", |r| r.as_str());
        failed(
            span,
            reason,
            run.error.as_deref().unwrap_or("the run failed"),
        );
    }
}

fn finish_reasons(span: &Span, reason: &str) {
    let reasons = Array::String(vec![StringValue::from(reason.to_string())]);
    span.set_attribute("gen_ai.response.finish_reasons", OtelValue::Array(reasons));
}

/// The span of one LLM call (`chat {model}`), a child of the current span (the run's).
/// `messages` are the request's, recorded with `--trace-content`.
pub fn chat_span(
    conversation: Option<Uuid>,
    (provider, model, agent): (&str, &str, &str),
    messages: &[Cow<'_, Message>],
) -> Span {
    let span = operation_span!(
        "chat",
        "client",
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        gen_ai.agent.name = agent,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        error.type = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
    );
    name_operation(&span, format_args!("chat {model}"), conversation);
    if with_content(&span) {
        let input: Vec<Value> = messages.iter().map(|m| message_parts(m)).collect();
        span.record("gen_ai.input.messages", Value::from(input).to_string());
    }
    span
}

/// The LLM call answered.
pub fn chat_done(span: &Span, reply: &ModelReply) {
    if span.is_disabled() {
        return;
    }
    span.record("gen_ai.usage.input_tokens", count(reply.usage.input_tokens));
    span.record(
        "gen_ai.usage.output_tokens",
        count(reply.usage.output_tokens),
    );
    finish_reasons(span, &reply.finish_reason);
    if with_content(span) {
        let message = Message::assistant(reply.text.clone(), reply.tool_calls.clone());
        let mut output = message_parts(&message);
        output["finish_reason"] = json!(reply.finish_reason);
        span.record("gen_ai.output.messages", json!([output]).to_string());
    }
}

/// The LLM call failed (`None`: its reply ended without completing).
pub fn chat_failed(span: &Span, error: &LlmError) {
    if !span.is_disabled() {
        failed(span, error_type(error.kind), &error.to_string());
    }
}

/// The LLM call was cancelled with its run.
pub fn chat_cancelled(span: &Span) {
    span.record("error.type", "cancelled");
}

fn error_type(kind: LlmErrorKind) -> &'static str {
    match kind {
        LlmErrorKind::Auth => "auth",
        LlmErrorKind::NotFound => "not_found",
        LlmErrorKind::RateLimited => "rate_limited",
        LlmErrorKind::Server => "server",
        LlmErrorKind::Connection => "connection",
        LlmErrorKind::Timeout => "timeout",
        LlmErrorKind::Protocol => "protocol",
        LlmErrorKind::Rejected => "rejected",
    }
}

/// The span of one tool call (`execute_tool {tool}`), a child of the current span (the run's).
pub fn tool_span(conversation: Option<Uuid>, call: &ToolCall) -> Span {
    let span = operation_span!(
        "execute_tool",
        "internal",
        gen_ai.tool.name = call.name.as_str(),
        gen_ai.tool.call.id = call.id.as_str(),
        gen_ai.tool.type = "function",
        error.type = Empty,
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
    );
    name_operation(
        &span,
        format_args!("execute_tool {}", call.name),
        conversation,
    );
    if with_content(&span) {
        span.record(
            "gen_ai.tool.call.arguments",
            call.arguments.to_string().as_str(),
        );
    }
    span
}

/// The tool call returned.
pub fn tool_finished(span: &Span, output: &ToolOutput) {
    if span.is_disabled() {
        return;
    }
    if with_content(span) {
        span.record("gen_ai.tool.call.result", output.output.as_str());
    }
    if output.is_error {
        failed(span, "tool_error", "the tool call failed");
    }
}

/// A message as the conventions' `gen_ai.*.messages` have it: a role and its parts.
fn message_parts(message: &Message) -> Value {
    let mut parts = Vec::new();
    match message.role {
        Role::Tool => parts.push(json!({
            "type": "tool_call_response",
            "id": message.tool_call_id,
            "response": message.content,
        })),
        _ if !message.content.is_empty() => {
            parts.push(json!({ "type": "text", "content": message.content }));
        }
        _ => {}
    }
    let calls = message.tool_calls.iter().map(|call| {
        json!({"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments})
    });
    parts.extend(calls);
    json!({ "role": message.role.as_str(), "parts": parts })
}

/// A token count as an OpenTelemetry integer: the layer records a `u64` as text, the GenAI
/// conventions want an int.
fn count(tokens: u64) -> i64 {
    i64::try_from(tokens).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_take_the_conventions_shape() {
        let call = ToolCall {
            id: "c1".into(),
            name: "read_file".into(),
            arguments: json!({"path": "README.md"}),
        };
        let asked = message_parts(&Message::assistant("", vec![call]));
        assert_eq!(
            asked,
            json!({"role": "assistant", "parts": [
                {"type": "tool_call", "id": "c1", "name": "read_file",
                 "arguments": {"path": "README.md"}}
            ]})
        );
        let answered = message_parts(&Message::tool_result("c1".to_string(), "# tah"));
        assert_eq!(
            answered,
            json!({"role": "tool", "parts": [
                {"type": "tool_call_response", "id": "c1", "response": "# tah"}
            ]})
        );
    }

    #[test]
    fn without_an_exporter_the_spans_are_disabled() {
        let call = ToolCall {
            id: "c1".into(),
            name: "read_file".into(),
            arguments: json!({}),
        };
        let id = Uuid::nil();
        assert!(run_span(&Span::none(), id, id, "mock", "mock", &Default::default()).is_disabled());
        assert!(chat_span(Some(id), ("mock", "mock", "default"), &[]).is_disabled());
        assert!(tool_span(Some(id), &call).is_disabled());
    }
}
