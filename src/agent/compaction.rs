//! Compaction: summarising earlier turns with the model into a summary message
//! that later requests use instead of the turns themselves. The full history is never changed;
//! the summary is one more `system` message in it. This module owns what the summariser is
//! given (its prompt and the transcript of the turns) and the format of its output.

use std::borrow::Cow;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::context;
use super::AgentDeps;
use crate::llm::{LlmError, LlmErrorKind, ModelRequest, Purpose, StreamItem};
use crate::model::{Message, Role, Usage, SUMMARY_PREFIX, TRANSCRIPT_USER_MARKER};

/// The summariser's system prompt.
pub const SUMMARY_PROMPT: &str = "You compact the history of a conversation between a user and \
an AI agent that uses tools, so that the agent can continue the work from your summary alone. \
The user message holds a transcript: maybe a previous summary, then the user's messages, the \
agent's replies, its tool calls and the tool results, in order. Write a concise summary that \
merges the previous summary (if any) with the new turns and covers: the user's goals and \
requests; decisions made and why; files created, changed or deleted (with paths); commands run \
and their results; open items and next steps; key facts (names, values, errors, constraints) \
needed later. Use short bullet points under those headings, omit headings with nothing to say, \
and do not invent anything. Write in the same language the user wrote in.";

/// Each item of the summariser's input is cut to this many characters.
pub const SUMMARY_ITEM_MAX_CHARS: usize = 4_000;
/// The summariser's whole input is at most this many characters.
pub const SUMMARY_INPUT_MAX_CHARS: usize = 200_000;

const TRUNCATION_MARK: &str = " […]";
const CONTINUATION: &str = "\n  ";

/// A summary ready to be appended to the history.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The summary message's content (starts with the summary prefix).
    pub content: String,
    /// Turns summarised (user messages since the previous summary).
    pub turns: u64,
    /// Characters of the summary.
    pub chars: u64,
    pub usage: Usage,
}

#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error("cancelled")]
    Cancelled,
    #[error(transparent)]
    Model(#[from] LlmError),
}

/// The part of the history a new summary covers: from the newest summary (which the summariser
/// merges) to the end.
pub fn compactable(history: &[Message]) -> &[Message] {
    let from = history.iter().rposition(Message::is_summary).unwrap_or(0);
    &history[from..]
}

/// Turns in the part a summary would cover (0 = nothing to compact).
pub fn compactable_turns(history: &[Message]) -> u64 {
    context::turn_starts(compactable(history)).len() as u64
}

/// Summarises the turns since the last summary (and that summary) with the model.
pub async fn summarize(
    deps: &AgentDeps,
    history: &[Message],
    cancel: &CancellationToken,
) -> Result<Summary, CompactError> {
    let part = compactable(history);
    let turns = context::turn_starts(part).len() as u64;
    let request = ModelRequest::owned(
        vec![
            Message::new(Role::System, SUMMARY_PROMPT),
            Message::new(Role::User, summary_input(part)),
        ],
        Vec::new(),
        Purpose::Summary,
    );
    let mut stream = deps.model.stream(request);
    let reply = loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = cancel.cancelled() => return Err(CompactError::Cancelled),
        };
        match item {
            Some(Ok(StreamItem::Done(reply))) => break reply,
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error.into()),
            None => {
                return Err(LlmError::new(
                    deps.model.name(),
                    LlmErrorKind::Protocol,
                    "the summary ended without completing",
                )
                .into())
            }
        }
    };
    let text = reply.text.trim();
    if text.is_empty() {
        return Err(LlmError::new(
            deps.model.name(),
            LlmErrorKind::Protocol,
            "the model returned an empty summary",
        )
        .into());
    }
    Ok(Summary {
        content: summary_content(text),
        turns,
        chars: text.chars().count() as u64,
        usage: reply.usage,
    })
}

/// Builds the summary message content: [`SUMMARY_PREFIX`] + "\n" + text.
pub fn summary_content(text: &str) -> String {
    format!("{SUMMARY_PREFIX}\n{text}")
}

/// Compaction input: the text the summariser gets as its user message. `messages` are the
/// turns to summarise; the newest summary among them is "the previous summary" and only what
/// follows it is transcribed.
///
/// The previous summary comes first, then one item per user message (`user: …`), assistant
/// reply (`assistant: …`), tool call (`tool call: name(args)`) and tool result
/// (`tool result: …`). Each item's text is cut to [`SUMMARY_ITEM_MAX_CHARS`] (marked ` […]`)
/// and its line breaks become indented continuation lines, so every user message is exactly
/// one line starting with [`TRANSCRIPT_USER_MARKER`] and no other line does. The whole is at
/// most [`SUMMARY_INPUT_MAX_CHARS`]: the oldest items are left out first (noted in their place);
/// the previous summary is kept.
pub fn summary_input(messages: &[Message]) -> String {
    let summary_at = messages.iter().rposition(Message::is_summary);
    let since = summary_at.map_or(0, |s| s + 1);

    let mut head = String::new();
    if let Some(s) = summary_at {
        let content = &messages[s].content;
        let body = content
            .strip_prefix(SUMMARY_PREFIX)
            .unwrap_or(content)
            .trim();
        let label = "previous summary: ";
        let mark = TRUNCATION_MARK.chars().count();
        let room = SUMMARY_INPUT_MAX_CHARS.saturating_sub(label.len() + mark);
        head = format!("{label}{}", continuation(&truncate(body, room)));
        if head.chars().count() > SUMMARY_INPUT_MAX_CHARS {
            // Only when the indentation of continuation lines pushed it over.
            head = truncate(&head, SUMMARY_INPUT_MAX_CHARS - mark).into_owned();
        }
    }

    let mut items: Vec<String> = Vec::new();
    for m in &messages[since..] {
        match m.role {
            Role::User => items.push(item(TRANSCRIPT_USER_MARKER, &m.content)),
            Role::Assistant => {
                if !m.content.trim().is_empty() {
                    items.push(item("assistant: ", &m.content));
                }
                for call in &m.tool_calls {
                    let text = format!("{}({})", call.name, call.arguments);
                    items.push(item("tool call: ", &text));
                }
            }
            Role::Tool => items.push(item("tool result: ", &m.content)),
            Role::System => {}
        }
    }

    // Size of the joined lines: their characters plus one newline between each two.
    let head_chars = head.chars().count();
    let head_lines = usize::from(!head.is_empty());
    let sizes: Vec<usize> = items.iter().map(|s| s.chars().count()).collect();
    let joined = |chars: usize, lines: usize| chars + lines.saturating_sub(1);
    let mut rest_chars: usize = head_chars + sizes.iter().sum::<usize>();
    let mut skip = 0;
    let mut note = String::new();
    if joined(rest_chars, head_lines + items.len()) > SUMMARY_INPUT_MAX_CHARS {
        while skip < items.len() {
            rest_chars -= sizes[skip];
            skip += 1;
            note = format!("[{skip} earlier item(s) left out to fit the input limit]");
            let lines = head_lines + 1 + items.len() - skip;
            if joined(rest_chars + note.chars().count(), lines) <= SUMMARY_INPUT_MAX_CHARS {
                break;
            }
        }
        let lines = head_lines + 1 + items.len() - skip;
        if joined(rest_chars + note.chars().count(), lines) > SUMMARY_INPUT_MAX_CHARS {
            note.clear(); // no room even for the note: the previous summary fills the input
        }
    }

    let mut lines: Vec<&str> = Vec::with_capacity(items.len() - skip + 2);
    if !head.is_empty() {
        lines.push(&head);
    }
    if !note.is_empty() {
        lines.push(&note);
    }
    lines.extend(items[skip..].iter().map(String::as_str));
    lines.join("\n")
}

/// One transcript item: `label` + the text cut to the item limit, on continuation lines.
fn item(label: &str, text: &str) -> String {
    format!(
        "{label}{}",
        continuation(&truncate(text, SUMMARY_ITEM_MAX_CHARS))
    )
}

/// The first `max` characters of `text`, plus ` […]` when anything was cut.
fn truncate(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        Some((cut, _)) => Cow::Owned(format!("{}{TRUNCATION_MARK}", &text[..cut])),
        None => Cow::Borrowed(text),
    }
}

/// `text` with every line after the first indented, so it reads as one item.
fn continuation(text: &str) -> String {
    let mut lines = text.lines();
    let mut out = String::with_capacity(text.len());
    if let Some(first) = lines.next() {
        out.push_str(first);
    }
    for line in lines {
        out.push_str(CONTINUATION);
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::fixtures::{call, reply, sys, tool, user};
    #[test]
    fn summary_content_has_the_prefix() {
        let c = summary_content("text");
        assert_eq!(c, format!("{SUMMARY_PREFIX}\ntext"));
        assert!(sys(&c).is_summary());
    }

    #[test]
    fn summary_prompt_asks_for_everything() {
        for word in [
            "goals",
            "decisions",
            "files",
            "commands",
            "open items",
            "key facts",
            "language",
            "concise",
        ] {
            assert!(SUMMARY_PROMPT.contains(word), "{word}");
        }
    }

    #[test]
    fn summary_input_lists_every_kind_of_item() {
        let h = vec![
            sys("SYSTEM PROMPT"),
            user("list the files"),
            Message::assistant("looking", vec![call("c1")]),
            tool("c1", "a.txt\nb.txt"),
            reply("two files"),
        ];
        let text = summary_input(&h);
        assert_eq!(
            text,
            "user: list the files\n\
             assistant: looking\n\
             tool call: read_file({\"path\":\"a.txt\"})\n\
             tool result: a.txt\n  b.txt\n\
             assistant: two files"
        );
        assert!(!text.contains("SYSTEM PROMPT"));
    }

    #[test]
    fn summary_input_puts_each_user_message_on_one_marked_line() {
        let h = vec![
            user("first line\nuser: not a new message\r\nthird"),
            reply("user: quoted\nuser: again"),
            tool("c", "\nuser: in a tool result"),
            user("second"),
        ];
        let text = summary_input(&h);
        let marked: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(TRANSCRIPT_USER_MARKER))
            .collect();
        assert_eq!(marked, vec!["user: first line", "user: second",]);
        assert!(text.contains("user: first line\n  user: not a new message\n  third"));
    }

    #[test]
    fn summary_input_keeps_the_previous_summary_and_skips_what_precedes_it() {
        let h = vec![
            sys("SYSTEM"),
            user("before"),
            sys(&summary_content("old facts\nmore facts")),
            user("after"),
        ];
        let text = summary_input(&h);
        assert_eq!(
            text,
            "previous summary: old facts\n  more facts\nuser: after"
        );
        assert!(!text.contains("before"));
        assert!(!text.contains(SUMMARY_PREFIX));
    }

    #[test]
    fn summary_input_truncates_each_item() {
        let long = "长".repeat(SUMMARY_ITEM_MAX_CHARS + 10);
        let exact = "y".repeat(SUMMARY_ITEM_MAX_CHARS);
        let h = vec![user(&long), tool("c", &exact)];
        let text = summary_input(&h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            format!(
                "user: {}{TRUNCATION_MARK}",
                "长".repeat(SUMMARY_ITEM_MAX_CHARS)
            )
        );
        assert_eq!(lines[1], format!("tool result: {exact}"));
    }

    #[test]
    fn summary_input_caps_the_whole_dropping_the_oldest_items_first() {
        let mut h = vec![sys(&summary_content("keep me"))];
        for i in 0..100 {
            h.push(user(&format!("ask {i} {}", "z".repeat(5000))));
        }
        let text = summary_input(&h);
        assert!(text.chars().count() <= SUMMARY_INPUT_MAX_CHARS);
        assert!(text.starts_with("previous summary: keep me\n["));
        assert!(text.contains("earlier item(s) left out"));
        assert!(text.ends_with(&format!("ask 99 {}{TRUNCATION_MARK}", "z".repeat(3993))));
        assert!(!text.contains("ask 0 "));
        // As many of the newest as fit.
        let kept = text.lines().filter(|l| l.starts_with("user: ")).count();
        let item = 6 + SUMMARY_ITEM_MAX_CHARS + 4 + 1;
        assert_eq!(kept, (SUMMARY_INPUT_MAX_CHARS - 100) / item);
    }

    #[test]
    fn summary_input_cuts_an_oversized_previous_summary() {
        let h = vec![
            sys(&summary_content(&"s".repeat(SUMMARY_INPUT_MAX_CHARS + 5))),
            user("later"),
        ];
        let text = summary_input(&h);
        assert!(text.chars().count() <= SUMMARY_INPUT_MAX_CHARS);
        assert!(text.starts_with("previous summary: sss"));
    }
}
