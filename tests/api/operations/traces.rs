//! Traces: with `OTEL_EXPORTER_OTLP_ENDPOINT` the server exports OpenTelemetry spans over
//! OTLP/HTTP to a receiver of the test's own, which decodes them with the protocol's protobuf
//! types. A run is an `invoke_agent` span with one `chat {model}` child per LLM call and one
//! `execute_tool {tool}` child per tool call, attributed with the GenAI conventions; content
//! goes into spans only with `--trace-content`; a failed call has an error status; a
//! sub-agent's run is a child of its parent's `task` call; a graceful stop sends what is
//! still queued.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode as AxumStatus;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message as _;
use serde_json::{json, Value};

use crate::support::scripted::{self, call};
use crate::support::*;

/// The attributes of the conventions that carry content.
const CONTENT: [&str; 4] = [
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
];

/// One span as received, its attributes as text (arrays joined with commas).
#[derive(Debug, Clone)]
struct Received {
    name: String,
    kind: i32,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent: Vec<u8>,
    attributes: HashMap<String, String>,
    /// The attributes sent as OpenTelemetry integers.
    ints: HashMap<String, i64>,
    status: i32,
    service: String,
}

impl Received {
    fn attr(&self, key: &str) -> &str {
        self.attributes
            .get(key)
            .unwrap_or_else(|| panic!("{} has no {key}: {:#?}", self.name, self.attributes))
    }

    fn is_child_of(&self, parent: &Received) -> bool {
        self.parent == parent.span_id && self.trace_id == parent.trace_id
    }
}

fn text(value: Option<&Any>) -> String {
    match value {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(n)) => n.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        Some(Any::ArrayValue(array)) => array
            .values
            .iter()
            .map(|v| text(v.value.as_ref()))
            .collect::<Vec<_>>()
            .join(","),
        other => format!("{other:?}"),
    }
}

fn ints(list: &[KeyValue]) -> HashMap<String, i64> {
    list.iter()
        .filter_map(
            |kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::IntValue(n)) => Some((kv.key.clone(), *n)),
                _ => None,
            },
        )
        .collect()
}

fn attributes(list: &[KeyValue]) -> HashMap<String, String> {
    list.iter()
        .map(|kv| {
            let value = kv.value.as_ref().and_then(|v| v.value.as_ref());
            (kv.key.clone(), text(value))
        })
        .collect()
}

/// An OTLP/HTTP trace receiver on 127.0.0.1.
struct Collector {
    endpoint: String,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let kept = spans.clone();
        let receive = move |body: Bytes| {
            let kept = kept.clone();
            async move {
                let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                    return AxumStatus::BAD_REQUEST;
                };
                let mut kept = kept.lock().unwrap();
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .map(|r| attributes(&r.attributes))
                        .and_then(|a| a.get("service.name").cloned())
                        .unwrap_or_default();
                    for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                        kept.push(Received {
                            name: span.name,
                            kind: span.kind,
                            trace_id: span.trace_id,
                            span_id: span.span_id,
                            parent: span.parent_span_id,
                            attributes: attributes(&span.attributes),
                            ints: ints(&span.attributes),
                            status: span.status.map_or(0, |s| s.code),
                            service: service.clone(),
                        });
                    }
                }
                AxumStatus::OK
            }
        };
        let app = axum::Router::new().route("/v1/traces", axum::routing::post(receive));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Collector { endpoint, spans }
    }

    /// A server process that exports its spans here within 100 ms.
    fn options(&self, options: ServerOptions) -> ServerOptions {
        options
            .process()
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &self.endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
    }

    /// Waits until `done` holds of the spans received; returns them.
    async fn until(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let spans = self.spans.lock().unwrap().clone();
            if done(&spans) {
                return spans;
            }
            assert!(Instant::now() < deadline, "{what}: got {spans:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The spans of the run `run_id` once its `invoke_agent` span and `children` children
    /// have arrived: the run's span, then its children.
    async fn run(&self, run_id: &str, children: usize) -> (Received, Vec<Received>) {
        let spans = self
            .until(&format!("the spans of run {run_id}"), |spans| {
                spans
                    .iter()
                    .find(|s| s.attributes.get("tah.run.id").map(String::as_str) == Some(run_id))
                    .is_some_and(|run| {
                        spans.iter().filter(|s| s.is_child_of(run)).count() >= children
                    })
            })
            .await;
        let run = spans
            .iter()
            .find(|s| s.attributes.get("tah.run.id").map(String::as_str) == Some(run_id))
            .cloned()
            .unwrap();
        let children = spans.into_iter().filter(|s| s.is_child_of(&run)).collect();
        (run, children)
    }
}

fn of_operation<'a>(spans: &'a [Received], operation: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|s| {
            s.attributes
                .get("gen_ai.operation.name")
                .map(String::as_str)
                == Some(operation)
        })
        .collect()
}

fn str_of<'a>(value: &'a Value, field: &str) -> &'a str {
    value[field]
        .as_str()
        .unwrap_or_else(|| panic!("no {field} in {value}"))
}

#[tokio::test]
async fn a_turn_is_a_run_span_with_a_chat_span_per_llm_call_and_a_tool_span_per_call() {
    let collector = Collector::start().await;
    let server = TestServer::start(collector.options(ServerOptions::new())).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "what is in here?").await;
    assert_eq!(result["status"], "completed", "{result}");
    let steps = server.steps(&id).await;
    let llm_steps = steps.iter().filter(|s| s["type"] == "llm").count();
    let tool_steps: Vec<&Value> = steps.iter().filter(|s| s["type"] == "tool").collect();
    assert!(!tool_steps.is_empty(), "the mock calls tools: {steps:?}");

    let run_id = str_of(&result, "run_id");
    let (run, children) = collector.run(run_id, llm_steps + tool_steps.len()).await;
    assert_eq!(run.name, "invoke_agent");
    assert_eq!(run.kind, SpanKind::Internal as i32);
    assert!(run.parent.is_empty(), "a client's run is a root: {run:?}");
    assert_eq!(run.service, "tah");
    assert_eq!(run.attr("gen_ai.operation.name"), "invoke_agent");
    assert_eq!(run.attr("gen_ai.conversation.id"), id);
    assert_eq!(run.attr("gen_ai.provider.name"), "mock");
    assert_eq!(run.attr("gen_ai.request.model"), "mock");
    assert_eq!(run.attr("gen_ai.agent.name"), "default");
    assert_eq!(run.attr("gen_ai.agent.id"), "default");
    assert_eq!(run.attr("tah.run.status"), "completed");
    let usage = &result["usage"];
    assert_eq!(
        run.attr("gen_ai.usage.input_tokens"),
        usage["input_tokens"].to_string()
    );
    assert_eq!(
        run.attr("gen_ai.usage.output_tokens"),
        usage["output_tokens"].to_string()
    );
    assert_ne!(run.status, StatusCode::Error as i32);
    for span in std::iter::once(&run).chain(of_operation(&children, "chat")) {
        for key in ["gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"] {
            assert!(
                span.ints.contains_key(key),
                "{} sends {key} as an integer: {:?}",
                span.name,
                span.attributes.get(key)
            );
        }
    }

    let chats = of_operation(&children, "chat");
    assert_eq!(chats.len(), llm_steps, "{children:#?}");
    let (mut input, mut output) = (0, 0);
    for chat in &chats {
        assert_eq!(chat.name, "chat mock");
        assert_eq!(chat.kind, SpanKind::Client as i32);
        assert_eq!(chat.attr("gen_ai.provider.name"), "mock");
        assert_eq!(chat.attr("gen_ai.request.model"), "mock");
        assert_eq!(chat.attr("gen_ai.agent.name"), "default");
        assert_eq!(chat.attr("gen_ai.conversation.id"), id);
        assert!(!chat.attr("gen_ai.response.finish_reasons").is_empty());
        input += chat
            .attr("gen_ai.usage.input_tokens")
            .parse::<u64>()
            .unwrap();
        output += chat
            .attr("gen_ai.usage.output_tokens")
            .parse::<u64>()
            .unwrap();
    }
    assert_eq!(
        input,
        usage["input_tokens"].as_u64().unwrap(),
        "the run's total"
    );
    assert_eq!(
        output,
        usage["output_tokens"].as_u64().unwrap(),
        "the run's total"
    );

    let tools = of_operation(&children, "execute_tool");
    assert_eq!(tools.len(), tool_steps.len(), "{children:#?}");
    for step in &tool_steps {
        let call_id = str_of(step, "call_id");
        let span = tools
            .iter()
            .find(|s| s.attr("gen_ai.tool.call.id") == call_id)
            .unwrap_or_else(|| panic!("no execute_tool span for {call_id}: {tools:#?}"));
        let tool = span.attr("gen_ai.tool.name");
        assert_eq!(span.name, format!("execute_tool {tool}"));
        assert_eq!(span.attr("gen_ai.conversation.id"), id);
        assert_ne!(span.status, StatusCode::Error as i32);
    }
    for span in children.iter().chain([&run]) {
        for key in CONTENT {
            assert!(
                !span.attributes.contains_key(key),
                "{key} without --trace-content: {span:#?}"
            );
        }
    }
}

#[tokio::test]
async fn trace_content_puts_messages_and_tool_io_into_spans() {
    let collector = Collector::start().await;
    let options = ServerOptions::new().arg("--trace-content");
    let server = TestServer::start(collector.options(options)).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "tell me about the readme").await;
    assert_eq!(result["status"], "completed", "{result}");
    let steps = server.steps(&id).await;
    let llm_steps = steps.iter().filter(|s| s["type"] == "llm").count();
    let tool_steps = steps.iter().filter(|s| s["type"] == "tool").count();
    let (_, children) = collector
        .run(str_of(&result, "run_id"), llm_steps + tool_steps)
        .await;

    let chats = of_operation(&children, "chat");
    let first: Value = serde_json::from_str(chats[0].attr("gen_ai.input.messages")).unwrap();
    let asked = first
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["role"] == "user" && m["parts"][0]["content"] == "tell me about the readme");
    assert!(asked, "the user's message: {first}");
    let answers: Vec<Value> = chats
        .iter()
        .map(|c| serde_json::from_str(c.attr("gen_ai.output.messages")).unwrap())
        .collect();
    let text = answers
        .iter()
        .flat_map(|a| a[0]["parts"].as_array().cloned().unwrap_or_default())
        .find(|p| p["type"] == "text")
        .unwrap_or_else(|| panic!("a text answer: {answers:?}"));
    assert_eq!(text["content"], result["text"]);
    let tools = of_operation(&children, "execute_tool");
    let read = tools
        .iter()
        .find(|t| t.attr("gen_ai.tool.name") == "read_file")
        .unwrap_or_else(|| panic!("the mock reads the README: {tools:#?}"));
    let arguments: Value = serde_json::from_str(read.attr("gen_ai.tool.call.arguments")).unwrap();
    assert!(
        arguments["path"].as_str().unwrap().contains("README"),
        "{arguments}"
    );
    assert!(read
        .attr("gen_ai.tool.call.result")
        .contains(README_FIRST_SENTENCE));
}

#[tokio::test]
async fn failed_calls_have_an_error_status() {
    let collector = Collector::start().await;
    let model =
        scripted::model_calling(vec![call("c1", "read_file", json!({"path": "nope.md"}))]).await;
    let options = scripted::options(&model, &[]);
    let server = TestServer::start(collector.options(options)).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "read it").await;
    assert_eq!(result["status"], "completed", "{result}");
    let (_, children) = collector.run(str_of(&result, "run_id"), 3).await;
    let tool = of_operation(&children, "execute_tool")[0].clone();
    assert_eq!(tool.attr("gen_ai.tool.call.id"), "c1");
    assert_eq!(tool.status, StatusCode::Error as i32, "{tool:#?}");
    assert_eq!(tool.attr("error.type"), "tool_error");
    for chat in of_operation(&children, "chat") {
        assert_eq!(chat.name, "chat fake");
        assert_eq!(chat.attr("gen_ai.provider.name"), "openai");
    }

    // A model that refuses the request: the chat span and the run's fail.
    model.push(fakes::Reply::status(400, r#"{"error":{"message":"no"}}"#));
    let result = server.run_wait(&id, "again").await;
    assert_eq!(result["status"], "failed", "{result}");
    let (run, children) = collector.run(str_of(&result, "run_id"), 1).await;
    assert_eq!(run.status, StatusCode::Error as i32, "{run:#?}");
    assert_eq!(run.attr("tah.run.status"), "failed");
    let chat = of_operation(&children, "chat")[0].clone();
    assert_eq!(chat.status, StatusCode::Error as i32, "{chat:#?}");
    assert_eq!(chat.attr("error.type"), "rejected");
}

#[tokio::test]
async fn a_subagent_run_is_a_child_of_its_parents_task_call() {
    let collector = Collector::start().await;
    let server = TestServer::start(collector.options(ServerOptions::new())).await;
    let session = server
        .create_session_with(&json!({"tool_policy": [{"tool": "task", "action": "allow"}]}))
        .await;
    let id = str_of(&session, "id").to_string();
    let result = server.run_wait(&id, "delegate").await;
    assert_eq!(result["status"], "completed", "{result}");
    let spans = collector
        .until("the parent's and the child's run", |spans| {
            of_operation(spans, "invoke_agent").len() >= 2
                && spans.iter().any(|s| s.name == "execute_tool task")
        })
        .await;
    let task = spans
        .iter()
        .find(|s| s.name == "execute_tool task")
        .unwrap();
    let parent = of_operation(&spans, "invoke_agent")
        .into_iter()
        .find(|s| s.attr("gen_ai.conversation.id") == id)
        .unwrap();
    assert!(task.is_child_of(parent), "{task:#?} under {parent:#?}");
    let child = of_operation(&spans, "invoke_agent")
        .into_iter()
        .find(|s| s.attr("gen_ai.conversation.id") != id)
        .unwrap();
    assert!(child.is_child_of(task), "{child:#?} under {task:#?}");
}

#[tokio::test]
async fn a_graceful_stop_exports_the_spans_still_queued() {
    let collector = Collector::start().await;
    // A batch delay of a minute: only the stop sends the spans within the test.
    let options = ServerOptions::new()
        .process()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "60000");
    let mut server = TestServer::start(options).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "and then stop").await;
    assert_eq!(result["status"], "completed", "{result}");
    assert!(
        collector.spans.lock().unwrap().is_empty(),
        "nothing sent yet"
    );
    assert!(server.stop().await.success());
    let spans = collector.spans.lock().unwrap().clone();
    let runs = of_operation(&spans, "invoke_agent");
    assert_eq!(runs.len(), 1, "sent before the process ended: {spans:#?}");
    assert_eq!(runs[0].attr("tah.run.id"), str_of(&result, "run_id"));
    assert!(!of_operation(&spans, "chat").is_empty());
}

#[test]
fn a_grpc_protocol_is_refused_at_start() {
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ];
    let (status, log) = serve_expecting_exit(&[], &env);
    assert!(!status.success(), "it started: {log}");
    assert!(log.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{log}");
}
