//! How long the context projection takes over a long history (BENCHMARKS.md, target ≤ 5 ms
//! over 10,000 messages).
//!
//! Builds a 10,000-message history — a system message, then turns of a user message, an
//! assistant message with one tool call, the tool's output and the assistant's answer, the last
//! turn stopped after its tool result (where the loop calls the model again) — and times
//! `prepare_context` (system prompt, summary, trim to the budget) with no budget, a budget that
//! only needs old tool outputs elided, and a small budget. Prints the median of 20 runs.
//!
//! ```sh
//! cargo run --release --example project_context
//! ```

use std::time::{Duration, Instant};

use serde_json::json;
use tah::agent::context::{context_chars, prepare_context};
use tah::model::{Message, Role, ToolCall};

const MESSAGES: usize = 10_000;
const RUNS: usize = 20;

/// Text of about `len` characters (words of prose, newlines every ~80 characters).
fn text(seed: usize, len: usize) -> String {
    const PROSE: &str =
        "the session writer commits events to SQLite and streams deltas file src/main.rs function returns an error";
    let words: Vec<&str> = PROSE.split(' ').collect();
    let mut out = String::with_capacity(len + 16);
    let mut i = seed;
    let mut line = 0;
    while out.len() < len {
        let word = words[i % words.len()];
        out.push_str(word);
        line += word.len() + 1;
        if line > 80 {
            out.push('\n');
            line = 0;
        } else {
            out.push(' ');
        }
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

fn history() -> Vec<Message> {
    let mut messages = vec![Message::new(Role::System, text(0, 1_200))];
    let mut turn = 0;
    while messages.len() < MESSAGES {
        let call_id = format!("call_{turn:06}");
        let turn_messages = [
            Message::new(Role::User, text(turn, 240)),
            Message::assistant(
                text(turn + 1, 60),
                vec![ToolCall {
                    id: call_id.clone(),
                    name: "read_file".into(),
                    arguments: json!({ "path": format!("src/module_{}.rs", turn % 97) }),
                }],
            ),
            Message::tool_result(call_id, text(turn + 2, 2_400)),
            Message::assistant(text(turn + 3, 700), Vec::new()),
        ];
        for m in turn_messages {
            if messages.len() == MESSAGES {
                break;
            }
            messages.push(m);
        }
        turn += 1;
    }
    for (i, m) in messages.iter_mut().enumerate() {
        m.index = i as i64;
    }
    messages
}

fn median_ms(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    let mid = samples.len() / 2;
    let median = if samples.len().is_multiple_of(2) {
        (samples[mid - 1] + samples[mid]) / 2
    } else {
        samples[mid]
    };
    median.as_secs_f64() * 1e3
}

fn main() {
    let history = history();
    let total = context_chars(&history);
    println!(
        "history: {} messages, {} turns, {:.1} M characters",
        history.len(),
        history.iter().filter(|m| m.role == Role::User).count(),
        total as f64 / 1e6
    );
    let cases: [(&str, Option<usize>); 3] = [
        ("no budget", None),
        ("half the history", Some(total / 2)),
        ("small budget (100,000 chars)", Some(100_000)),
    ];
    for (name, budget) in cases {
        // One unmeasured run to warm the allocator and caches.
        let (warm, _) = prepare_context(&history, "system prompt", budget);
        drop(warm);
        let mut samples = Vec::with_capacity(RUNS);
        let mut last = None;
        for _ in 0..RUNS {
            let start = Instant::now();
            let (sent, stats) = prepare_context(&history, "system prompt", budget);
            samples.push(start.elapsed());
            last = Some((sent.len(), stats));
        }
        let min = samples.iter().min().copied().unwrap_or_default();
        let max = samples.iter().max().copied().unwrap_or_default();
        let Some((sent, stats)) = last else { continue };
        println!(
            "prepare_context, {name}: median {:.2} ms (min {:.2}, max {:.2}, {RUNS} runs); \
             {sent} messages sent, {} chars, {} turns dropped, {} tool outputs elided",
            median_ms(samples),
            min.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
            stats.chars_after,
            stats.dropped_turns,
            stats.elided_tool_results,
        );
    }
}
