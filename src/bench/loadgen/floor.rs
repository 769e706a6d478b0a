//! The floor: the same workload sent straight to the fake model — T turns per conversation,
//! each the tool-call replies and then the text reply, with the history growing as the
//! server's would — so that the report can say what the server adds per turn.

use std::sync::Arc;

use anyhow::bail;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header::AUTHORIZATION;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tah::cli::{BenchArgs, DEFAULT_SYSTEM_PROMPT};
use tah::llm::wire::cut_into_lines;
use tokio::time::Instant;

use super::client::{expect_status, Errors};
use super::report::Floor;
use super::{micros, TURN_TIMEOUT};
use crate::bench::stats::Summary;

/// The tool schemas sent with every floor request (what the server offers the model).
fn floor_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "list_files",
            "description": "List the files and directories at a path inside the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        }},
        {"type": "function", "function": {
            "name": "read_file",
            "description": "Read a text file inside the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                           "required": ["path"]},
        }},
    ])
}

/// One streamed reply, as a client reads it.
#[derive(Default)]
struct FloorReply {
    text: String,
    tool_calls: Vec<Value>,
    done: bool,
}

pub async fn floor(args: &BenchArgs, url: &str, errors: &Errors) -> anyhow::Result<Floor> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency + 8)
        .tcp_nodelay(true)
        .no_proxy()
        .build()?;
    let endpoint = format!("{url}/chat/completions");
    let tools = Arc::new(floor_tools());
    if args.warmup_turns > 0 {
        floor_session(&http, &endpoint, &tools, args.warmup_turns, errors).await;
    }
    let started = Instant::now();
    let sessions = futures::future::join_all(
        (0..args.concurrency).map(|_| floor_session(&http, &endpoint, &tools, args.turns, errors)),
    )
    .await;
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    let mut latencies: Vec<u64> = sessions.into_iter().flatten().collect();
    Ok(Floor {
        wall_s: wall,
        turns_per_s: latencies.len() as f64 / wall,
        turn_latency: Summary::of_micros(&mut latencies),
    })
}

/// T turns of one conversation, each: tool-call replies then the text reply, with the history
/// growing as the server's would. Returns the turn latencies in µs.
async fn floor_session(
    http: &reqwest::Client,
    endpoint: &str,
    tools: &Value,
    turns: usize,
    errors: &Errors,
) -> Vec<u64> {
    let mut messages = vec![json!({"role": "system", "content": DEFAULT_SYSTEM_PROMPT})];
    let mut latencies = Vec::with_capacity(turns);
    'turns: for turn in 1..=turns {
        messages.push(json!({"role": "user", "content": format!("bench turn {turn}")}));
        let start = Instant::now();
        // The server's default step limit.
        for _ in 0..20 {
            let body = json!({
                "model": "fake",
                "messages": messages,
                "stream": true,
                "stream_options": {"include_usage": true},
                "tools": tools,
            });
            let reply = match floor_request(http, endpoint, &body).await {
                Ok(reply) => reply,
                Err(error) => {
                    errors.record(format!("floor: {error:#}"));
                    continue 'turns;
                }
            };
            if reply.tool_calls.is_empty() {
                messages.push(json!({"role": "assistant", "content": reply.text}));
                latencies.push(micros(start.elapsed()));
                continue 'turns;
            }
            let ids: Vec<String> = reply
                .tool_calls
                .iter()
                .map(|c| c["id"].as_str().unwrap_or("call").to_string())
                .collect();
            messages.push(
                json!({"role": "assistant", "content": null, "tool_calls": reply.tool_calls}),
            );
            for id in ids {
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": id,
                    "content": "Cargo.toml\nREADME.md\nsrc/",
                }));
            }
        }
        errors.record("floor: a turn did not end within 20 model calls");
    }
    latencies
}

async fn floor_request(
    http: &reqwest::Client,
    endpoint: &str,
    body: &Value,
) -> anyhow::Result<FloorReply> {
    let response = http
        .post(endpoint)
        .header(AUTHORIZATION, "Bearer bench")
        .json(body)
        .timeout(TURN_TIMEOUT)
        .send()
        .await?;
    let response = expect_status(response, StatusCode::OK, "POST /chat/completions").await?;
    let mut reply = FloorReply::default();
    // Cut into lines as the server's client cuts them, so that both decode a reply of many
    // events in one read at the same cost.
    let mut events = cut_into_lines(response.bytes_stream()).eventsource();
    while let Some(event) = events.next().await {
        floor_event(&event?.data, &mut reply)?;
        if reply.done {
            break;
        }
    }
    if !reply.done {
        bail!("the model's stream ended without [DONE]");
    }
    Ok(reply)
}

/// One `data:` payload of the model's stream: a chunk, or `[DONE]`.
fn floor_event(data: &str, reply: &mut FloorReply) -> anyhow::Result<()> {
    if data == "[DONE]" {
        reply.done = true;
        return Ok(());
    }
    let chunk: Value = serde_json::from_str(data)?;
    let delta = &chunk["choices"][0]["delta"];
    if let Some(text) = delta["content"].as_str() {
        reply.text.push_str(text);
    }
    if let Some(calls) = delta["tool_calls"].as_array() {
        reply.tool_calls.extend(
            calls
                .iter()
                .map(|c| json!({"id": c["id"], "type": "function", "function": c["function"]})),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_frames_collect_text_and_tool_calls() {
        let mut reply = FloorReply::default();
        let frames = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"a "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"list_files","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
            "[DONE]",
        ];
        for f in frames {
            floor_event(f, &mut reply).unwrap();
        }
        assert_eq!(reply.text, "a ");
        assert_eq!(reply.tool_calls.len(), 1);
        assert_eq!(reply.tool_calls[0]["id"], "c1");
        assert!(reply.done);
    }
}
