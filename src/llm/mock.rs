//! The mock model: deterministic and offline, so the whole server runs and is tested without a
//! provider. Per turn it lists the workspace, reads its README when there is one, then answers
//! with a short summary that quotes the user's input. Without tools it echoes the input.
//!
//! A few inputs make it use the other tools, so that they (and their approvals) can be tried
//! with no provider key:
//! - "write a note …" calls `write_file` on `notes.md` (or on the path of "write a note to
//!   `PATH`") with the input as content;
//! - "edit the note: replace `OLD` with `NEW`" calls `edit_file` on `notes.md` (or on the path
//!   of a third backticked part, "… in `PATH`");
//! - "run `COMMAND`" calls `shell` with the command between the backticks;
//! - "ask the client …" calls the first tool offered that is not a built-in one (a session's
//!   client tool) with `{"question": input}`;
//! - "call `TOOL` with {…}" calls any tool offered (an MCP server's, say) with that JSON
//!   object.
//!
//! After the call it answers with what the call returned.
//!
//! When the turn's input mentions thinking ("think", "thinking", …), every reply of the turn
//! first streams a short piece of reasoning about its next move, as reasoning models do.

use std::borrow::Cow;
use std::time::Duration;

use futures::{stream, StreamExt};
use serde_json::{json, Value};

use super::{ModelClient, ModelReply, ModelRequest, ModelStream, Purpose, StreamItem};
use crate::model::{
    Message, Role, ThinkingBlock, ToolCall, Usage, BUILTIN_TOOLS, TRANSCRIPT_USER_MARKER,
};

pub struct MockModel {
    delay: Duration,
}

impl MockModel {
    pub fn new(delay: Duration) -> MockModel {
        MockModel { delay }
    }
}

impl ModelClient for MockModel {
    fn name(&self) -> &str {
        "mock"
    }

    fn model(&self) -> &str {
        "mock"
    }

    fn stream(&self, request: ModelRequest) -> ModelStream {
        let reply = reply_to(&request);
        let thinking = reply.thinking.iter().map(ThinkingBlock::text);
        let mut items: Vec<StreamItem> = thinking
            .flat_map(split_pieces)
            .map(StreamItem::Thinking)
            .chain(split_pieces(&reply.text).into_iter().map(StreamItem::Delta))
            .collect();
        items.push(StreamItem::Done(reply));
        let delay = self.delay;
        if delay.is_zero() {
            stream::iter(items.into_iter().map(Ok)).boxed()
        } else {
            stream::iter(items)
                .then(move |item| async move {
                    if matches!(item, StreamItem::Delta(_) | StreamItem::Thinking(_)) {
                        tokio::time::sleep(delay).await;
                    }
                    Ok(item)
                })
                .boxed()
        }
    }
}

/// Splits text into small pieces (a word and the space after it), as a model streams tokens.
fn split_pieces(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    for ch in text.chars() {
        current.push(ch);
        if ch == ' ' || ch == '\n' {
            pieces.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

fn reply_to(request: &ModelRequest) -> ModelReply {
    let input_chars: usize = request.messages.iter().map(|m| m.size_chars()).sum();
    let (text, tool_calls) = match request.purpose {
        Purpose::Summary => (summary_of(request), Vec::new()),
        Purpose::Turn => next_move(request),
    };
    let thinking = match request.purpose {
        Purpose::Turn => reasoning_about(request, &tool_calls),
        Purpose::Summary => None,
    };
    let finish_reason = if tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let output_chars = text.chars().count()
        + thinking.as_deref().map_or(0, |t| t.chars().count())
        + tool_calls
            .iter()
            .map(|c| c.arguments.to_string().len())
            .sum::<usize>();
    ModelReply {
        text,
        thinking: thinking
            .map(|thinking| ThinkingBlock::Thinking {
                thinking,
                signature: None,
            })
            .into_iter()
            .collect(),
        tool_calls,
        finish_reason: finish_reason.to_string(),
        usage: Usage {
            input_tokens: (input_chars as u64).div_ceil(4),
            output_tokens: (output_chars as u64).div_ceil(4).max(1),
        },
    }
}

/// The mock's reasoning about its move, when the turn's input asks it to think.
fn reasoning_about(request: &ModelRequest, calls: &[ToolCall]) -> Option<String> {
    let input = request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map(|m| m.content.as_str())?;
    if !input.to_lowercase().contains("think") {
        return None;
    }
    let next = match calls {
        [] => "I have what I need, so I answer now.".to_string(),
        calls => {
            let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
            format!("Before I answer I call {}.", names.join(", "))
        }
    };
    Some(format!("The user asked: \"{input}\". {next}"))
}

/// A deterministic summary: the user messages found in the transcript, one per line.
fn summary_of(request: &ModelRequest) -> String {
    let transcript = request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .unwrap_or("");
    let asks: Vec<&str> = transcript
        .lines()
        .filter_map(|l| l.strip_prefix(TRANSCRIPT_USER_MARKER))
        .collect();
    let mut out = format!(
        "The user made {} request(s) in the summarised turns.",
        asks.len()
    );
    for (i, ask) in asks.iter().enumerate() {
        out.push_str(&format!("\n{}. {}", i + 1, ask));
    }
    out
}

/// The mock's move in a turn, decided from the messages after the last user message.
fn next_move(request: &ModelRequest) -> (String, Vec<ToolCall>) {
    let last_user = request.messages.iter().rposition(|m| m.role == Role::User);
    let input = last_user
        .map(|i| request.messages[i].content.clone())
        .unwrap_or_default();
    let has_tool = |name: &str| request.tools.iter().any(|t| t.name == name);
    let turn = &request.messages[last_user.map(|i| i + 1).unwrap_or(0)..];
    let next_index = request.messages.last().map_or(0, |m| m.index + 1);
    let asked = Asked {
        input: &input,
        request,
        turn,
        next_index,
    };
    if let Some(reply) = delegation(asked).or_else(|| chosen_tool_move(asked)) {
        return reply;
    }
    if !has_tool("list_files") {
        return (format!("Echo: {input}"), Vec::new());
    }
    let call_name = |call_id: &str| {
        turn.iter()
            .flat_map(|m| &m.tool_calls)
            .find(|c| c.id == call_id)
            .map(|c| c.name.as_str())
    };
    let result_of = |name: &str| {
        turn.iter().find(|m| {
            m.role == Role::Tool && m.tool_call_id.as_deref().and_then(call_name) == Some(name)
        })
    };
    let calls_so_far = turn.iter().map(|m| m.tool_calls.len()).sum::<usize>();
    let call = |name: &str, arguments: serde_json::Value| ToolCall {
        // The history index the reply will get: unique within the session.
        id: format!("call_{}_{}", next_index, calls_so_far),
        name: name.to_string(),
        arguments,
    };

    let Some(listing) = result_of("list_files") else {
        return (
            String::new(),
            vec![call("list_files", json!({"path": "."}))],
        );
    };
    let entries: Vec<&str> = if listing_is_error(&listing.content) {
        Vec::new()
    } else {
        listing
            .content
            .lines()
            .filter(|l| !l.starts_with('['))
            .collect()
    };
    let readme = entries
        .iter()
        .find(|e| !e.ends_with('/') && e.to_ascii_lowercase().starts_with("readme"));
    let read = result_of("read_file");
    if let (Some(readme), None) = (readme, read) {
        if has_tool("read_file") {
            return (
                String::new(),
                vec![call("read_file", json!({"path": readme}))],
            );
        }
    }
    (
        summary_text(&input, &entries, readme.copied(), read.map(|m| m.as_ref())),
        Vec::new(),
    )
}

/// What a move of the mock is chosen from: the last user input, the request, the messages
/// after that input, and the history index the reply will get.
#[derive(Clone, Copy)]
struct Asked<'a> {
    input: &'a str,
    request: &'a ModelRequest<'a>,
    turn: &'a [Cow<'a, Message>],
    next_index: i64,
}

/// The call an input asks for by name ("call `…` with {…}", "write a note", "run `…`", "ask the
/// client"), then the
/// answer once its result is in; `None` for any other input.
fn chosen_tool_move(asked: Asked<'_>) -> Option<(String, Vec<ToolCall>)> {
    let lower = asked.input.to_lowercase();
    let offered = |name: &str| asked.request.tools.iter().any(|t| t.name == name);
    let quoted = backticked(asked.input);
    let (name, arguments) = if let Some(named) = named_call(asked.input).filter(|(n, _)| offered(n))
    {
        named
    } else if lower.contains("write a note") && offered("write_file") {
        let path = match lower.find("write a note to `") {
            Some(_) => quoted.first().cloned().unwrap_or_default(),
            None => "notes.md".to_string(),
        };
        (
            "write_file".to_string(),
            json!({"path": path, "content": format!("{}\n", asked.input)}),
        )
    } else if lower.contains("edit the note") && quoted.len() >= 2 && offered("edit_file") {
        let path = quoted.get(2).map_or("notes.md", String::as_str);
        (
            "edit_file".to_string(),
            json!({"path": path, "old_string": quoted[0], "new_string": quoted[1]}),
        )
    } else if let Some(command) = backticked_command(asked.input).filter(|_| offered("shell")) {
        ("shell".to_string(), json!({"command": command}))
    } else if lower.contains("ask the client") {
        let tool = asked
            .request
            .tools
            .iter()
            .find(|t| !BUILTIN_TOOLS.contains(&t.name.as_str()) && t.name != "task")?;
        (tool.name.clone(), json!({"question": asked.input}))
    } else {
        return None;
    };
    let result = asked.turn.iter().find(|m| m.role == Role::Tool);
    Some(match result {
        None => (
            String::new(),
            vec![ToolCall {
                id: format!("call_{}_0", asked.next_index),
                name,
                arguments,
            }],
        ),
        Some(result) => {
            let said = result.content.lines().last().unwrap_or("").trim();
            (format!("{name} answered: {said}"), Vec::new())
        }
    })
}

/// "delegate" (or "delegate N"): N `task` calls in one reply, each handing the input on as
/// part i of N, then one answer quoting every sub-agent once all their results are in.
fn delegation(asked: Asked<'_>) -> Option<(String, Vec<ToolCall>)> {
    let lower = asked.input.to_lowercase();
    let at = lower.find("delegate")?;
    if !asked.request.tools.iter().any(|t| t.name == "task") {
        return None;
    }
    let count = lower[at + "delegate".len()..]
        .split_whitespace()
        .next()
        .and_then(|w| w.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, 8);
    let results: Vec<&Message> = asked
        .turn
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.as_ref())
        .collect();
    if results.is_empty() {
        let calls = (0..count)
            .map(|i| ToolCall {
                id: format!("call_{}_{i}", asked.next_index),
                name: "task".to_string(),
                arguments: json!({
                    "description": format!("part {} of {count}", i + 1),
                    "prompt": format!("{} (part {} of {count})", asked.input, i + 1),
                }),
            })
            .collect();
        return Some((String::new(), calls));
    }
    let said: Vec<&str> = results
        .iter()
        .map(|r| r.content.lines().last().unwrap_or("").trim())
        .collect();
    Some((format!("task answered: {}", said.join(" | ")), Vec::new()))
}

/// The parts of `input` between pairs of backticks, in order.
fn backticked(input: &str) -> Vec<String> {
    input
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect::<Vec<_>>()
        // A backtick without its pair opens no part.
        .into_iter()
        .take(input.matches('`').count() / 2)
        .collect()
}

/// The tool and the input of "call `TOOL` with {JSON}".
fn named_call(input: &str) -> Option<(String, Value)> {
    let at = input.to_lowercase().find("call `")?;
    let rest = &input[at + "call `".len()..];
    let end = rest.find('`')?;
    let name = rest[..end].trim().to_string();
    let after = rest[end + 1..].trim_start().strip_prefix("with")?;
    let object = &after[after.find('{')?..];
    let arguments = serde_json::Deserializer::from_str(object)
        .into_iter::<Value>()
        .next()?
        .ok()
        .filter(Value::is_object)?;
    Some((name, arguments)).filter(|(name, _)| !name.is_empty())
}

/// The command of "run `COMMAND`".
fn backticked_command(input: &str) -> Option<String> {
    let at = input.to_lowercase().find("run `")?;
    let rest = &input[at + "run `".len()..];
    let end = rest.find('`')?;
    Some(rest[..end].to_string()).filter(|c| !c.trim().is_empty())
}

fn listing_is_error(content: &str) -> bool {
    content.starts_with("{\"error\"")
}

fn summary_text(
    input: &str,
    entries: &[&str],
    readme: Option<&str>,
    read: Option<&Message>,
) -> String {
    let dirs: Vec<&str> = entries
        .iter()
        .copied()
        .filter(|e| e.ends_with('/'))
        .collect();
    let files: Vec<&str> = entries
        .iter()
        .copied()
        .filter(|e| !e.ends_with('/'))
        .collect();
    let list = |items: &[&str]| {
        if items.is_empty() {
            "none".to_string()
        } else {
            items.join(", ")
        }
    };
    let mut text = format!(
        "You asked: \"{input}\". The workspace has {} top-level entries. Directories: {}. Files: {}.",
        entries.len(),
        list(&dirs),
        list(&files)
    );
    match (readme, read) {
        (Some(name), Some(msg)) if !listing_is_error(&msg.content) => {
            text.push_str(&format!(
                " {name} begins: \"{}\"",
                first_sentence(&msg.content)
            ));
        }
        _ => text.push_str(" There is no README to read."),
    }
    text
}

/// The README's first sentence: the first line of prose, up to its first full stop.
fn first_sentence(readme: &str) -> String {
    let lines: Vec<&str> = readme
        .lines()
        .map(without_line_number)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // Prose first; a README made only of headings falls back to them.
    let prose_lines: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.starts_with('#'))
        .collect();
    let chosen = if prose_lines.is_empty() {
        lines
    } else {
        prose_lines
    };
    let prose = chosen
        .iter()
        .map(|l| l.trim_start_matches('#').trim())
        .collect::<Vec<_>>()
        .join(" ");
    let end = prose
        .char_indices()
        .find(|&(i, c)| {
            matches!(c, '.' | '!' | '?' | '。')
                && prose[i + c.len_utf8()..]
                    .chars()
                    .next()
                    .is_none_or(char::is_whitespace)
        })
        .map(|(i, c)| i + c.len_utf8())
        .unwrap_or(prose.len());
    prose[..end].chars().take(300).collect()
}

/// A line of `read_file` output without its `cat -n` number (`   12\t`).
fn without_line_number(line: &str) -> &str {
    match line.split_once('\t') {
        Some((number, rest)) if number.trim_start().parse::<u64>().is_ok() => rest,
        _ => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolSchema;

    fn tools() -> Vec<ToolSchema> {
        ["list_files", "read_file"]
            .iter()
            .map(|n| ToolSchema {
                name: n.to_string(),
                description: String::new(),
                parameters: json!({}),
            })
            .collect()
    }

    /// A history that asks `input` after a system prompt.
    fn asked(input: &str) -> Vec<Message> {
        vec![
            Message::new(Role::System, "sys"),
            Message::new(Role::User, input),
        ]
    }

    /// Adds `reply` and the output of its first call to `history`.
    fn answer_first_call(history: &mut Vec<Message>, reply: &ModelReply, output: &str) {
        history.push(Message::assistant("", reply.tool_calls.clone()));
        history.push(Message::tool_result(&reply.tool_calls[0].id, output));
    }

    fn request(messages: Vec<Message>) -> ModelRequest<'static> {
        ModelRequest::owned(messages, tools(), Purpose::Turn)
    }

    #[test]
    fn a_turn_lists_then_reads_then_answers() {
        let mut history = asked("what is here?");
        let first = reply_to(&request(history.clone()));
        assert_eq!(first.tool_calls[0].name, "list_files");
        assert_eq!(first.finish_reason, "tool_calls");
        answer_first_call(&mut history, &first, "src/\nREADME.md\nCargo.toml");
        let second = reply_to(&request(history.clone()));
        assert_eq!(second.tool_calls[0].name, "read_file");
        assert_eq!(second.tool_calls[0].arguments["path"], "README.md");
        assert_ne!(second.tool_calls[0].id, first.tool_calls[0].id);
        answer_first_call(
            &mut history,
            &second,
            "# Demo\n\nDemo is a small project. It does things.",
        );
        let third = reply_to(&request(history));
        assert!(third.tool_calls.is_empty());
        assert_eq!(third.finish_reason, "stop");
        assert!(third.text.contains("what is here?"), "{}", third.text);
        assert!(third.text.contains("Directories: src/"), "{}", third.text);
        assert!(
            third.text.contains("begins: \"Demo is a small project.\""),
            "{}",
            third.text
        );
    }

    #[test]
    fn a_named_call_calls_that_tool_with_its_input_then_says_what_it_answered() {
        let input =
            r#"Please call `mcp__files__read_text_file` with {"path": "/srv/notes.txt"} now"#;
        let mut offered = tools();
        offered.push(ToolSchema {
            name: "mcp__files__read_text_file".into(),
            description: String::new(),
            parameters: json!({}),
        });
        let mut history = vec![Message::new(Role::User, input)];
        let ask = |history: &[Message]| {
            reply_to(&ModelRequest::owned(
                history.to_vec(),
                offered.clone(),
                Purpose::Turn,
            ))
        };
        let first = ask(&history);
        assert_eq!(first.tool_calls.len(), 1);
        assert_eq!(first.tool_calls[0].name, "mcp__files__read_text_file");
        assert_eq!(
            first.tool_calls[0].arguments,
            json!({"path": "/srv/notes.txt"})
        );
        answer_first_call(&mut history, &first, "ship on Friday");
        let second = ask(&history);
        assert!(second.tool_calls.is_empty());
        assert_eq!(
            second.text,
            "mcp__files__read_text_file answered: ship on Friday"
        );
        // A tool that is not offered, or an input that is not an object, is not called.
        assert_eq!(named_call("call `x` with [1]"), None);
        assert_eq!(named_call("call `` with {}"), None);
        let unknown = "call `mcp__nope__x` with {}";
        let reply = ask(&[Message::new(Role::User, unknown)]);
        assert!(
            reply.tool_calls.iter().all(|c| c.name != "mcp__nope__x"),
            "{:?}",
            reply.tool_calls
        );
    }

    #[test]
    fn numbered_readme_lines_are_read_as_text() {
        let numbered = "     1\t# Demo\n     2\t\n     3\tDemo is small. Really.\n";
        assert_eq!(first_sentence(numbered), "Demo is small.");
    }

    #[test]
    fn without_tools_it_echoes() {
        let req = ModelRequest::owned(
            vec![Message::new(Role::User, "héllo 世界")],
            vec![],
            Purpose::Turn,
        );
        assert_eq!(reply_to(&req).text, "Echo: héllo 世界");
    }

    #[test]
    fn notes_are_written_and_edited_on_request() {
        let offer = |names: &[&str]| {
            names
                .iter()
                .map(|n| ToolSchema {
                    name: n.to_string(),
                    description: String::new(),
                    parameters: json!({}),
                })
                .collect::<Vec<_>>()
        };
        let ask = |input: &str| {
            let req = ModelRequest::owned(
                vec![Message::new(Role::User, input)],
                offer(&["list_files", "write_file", "edit_file"]),
                Purpose::Turn,
            );
            reply_to(&req).tool_calls
        };
        let calls = ask("write a note please");
        assert_eq!(calls[0].name, "write_file");
        assert_eq!(calls[0].arguments["path"], "notes.md");
        assert_eq!(calls[0].arguments["content"], "write a note please\n");
        let calls = ask("Write a note to `docs/é.md`: hello");
        assert_eq!(calls[0].arguments["path"], "docs/é.md");
        let calls = ask("edit the note: replace `one` with `two`");
        assert_eq!(calls[0].name, "edit_file");
        assert_eq!(
            calls[0].arguments,
            json!({"path": "notes.md", "old_string": "one", "new_string": "two"})
        );
        let calls = ask("edit the note: replace `a` with `b` in `x/y.txt`");
        assert_eq!(calls[0].arguments["path"], "x/y.txt");
        // Without both parts it is an ordinary turn.
        assert_eq!(ask("edit the note: replace `a")[0].name, "list_files");
        assert_eq!(backticked("`a` and `b` and `c"), ["a", "b"]);
    }

    #[test]
    fn pieces_rebuild_the_text() {
        let text = "one two  three\nfour 世界";
        let pieces = split_pieces(text);
        assert!(pieces.len() >= 4);
        assert_eq!(pieces.concat(), text);
    }

    #[test]
    fn summaries_list_user_lines() {
        let req = ModelRequest::owned(
            vec![
                Message::new(Role::System, "summarise"),
                Message::new(
                    Role::User,
                    "user: first ask\nassistant: ok\nuser: second ask",
                ),
            ],
            vec![],
            Purpose::Summary,
        );
        let text = reply_to(&req).text;
        assert!(text.contains("2 request(s)"));
        assert!(text.contains("1. first ask") && text.contains("2. second ask"));
    }

    #[test]
    fn an_input_about_thinking_gets_reasoning_before_each_move() {
        let mut history = asked("Think hard: what is here?");
        let first = reply_to(&request(history.clone()));
        assert_eq!(first.tool_calls[0].name, "list_files");
        let [ThinkingBlock::Thinking {
            thinking,
            signature: None,
        }] = first.thinking.as_slice()
        else {
            panic!("one unsigned thinking block: {:?}", first.thinking);
        };
        assert_eq!(
            thinking,
            "The user asked: \"Think hard: what is here?\". Before I answer I call list_files."
        );
        answer_first_call(&mut history, &first, "src/");
        let answer = reply_to(&request(history));
        assert!(answer.tool_calls.is_empty());
        assert!(answer.thinking[0].text().ends_with("so I answer now."));
        let plain = reply_to(&request(vec![Message::new(Role::User, "what is here?")]));
        assert!(plain.thinking.is_empty());
    }

    #[tokio::test]
    async fn thinking_streams_before_the_text() {
        let model = MockModel::new(Duration::ZERO);
        let items: Vec<StreamItem> = model
            .stream(ModelRequest::owned(
                vec![Message::new(Role::User, "think, then echo")],
                vec![],
                Purpose::Turn,
            ))
            .map(|item| item.expect("no error"))
            .collect()
            .await;
        let kinds: Vec<&str> = items
            .iter()
            .map(|i| match i {
                StreamItem::Thinking(_) => "thinking",
                StreamItem::Delta(_) => "text",
                StreamItem::Done(_) => "done",
                StreamItem::Retry { .. } => "retry",
            })
            .collect();
        let first_text = kinds.iter().position(|k| *k == "text").expect("text");
        assert!(first_text > 0, "{kinds:?}");
        assert!(kinds[..first_text].iter().all(|k| *k == "thinking"));
        assert_eq!(kinds.last(), Some(&"done"));
        let streamed: String = items
            .iter()
            .filter_map(|i| match i {
                StreamItem::Thinking(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        let Some(StreamItem::Done(reply)) = items.last() else {
            unreachable!()
        };
        assert_eq!(streamed, reply.thinking[0].text());
        assert_eq!(reply.text, "Echo: think, then echo");
    }
}
