//! Context projection: what of a session's history is sent to the model.
//!
//! The stored history is append-only and never changed; every request is built from it by the
//! pure functions here — replace the system prompt, merge the newest compaction summary
//! ([`apply_summary`]), then trim to the character budget ([`project_context`]). Keeping them
//! pure and deterministic lets the loop record only *how* a request was built and rebuild the
//! exact request later. The module also owns the repair of tool calls left unanswered by an
//! interrupted turn, because it decides what the model may see. What a compaction summary is
//! made from lives in `compaction`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use crate::model::{Message, Role, SizeCache, ToolCall};

/// The content given to a dangling call before a new run.
pub const NOT_RUN_RESULT: &str = r#"{"error":"not run: the previous turn was interrupted"}"#;

/// A turn = from a user message up to (not including) the next user message. Returns the
/// positions (in the slice) of the user messages.
pub fn turn_starts(messages: &[Message]) -> Vec<usize> {
    messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::User)
        .map(|(i, _)| i)
        .collect()
}

/// Tool calls in `messages` that have no tool message with their id after them (dangling), in
/// the order they were made.
pub fn dangling_tool_calls(messages: &[Message]) -> Vec<ToolCall> {
    let mut answered: HashSet<&str> = HashSet::new();
    let mut dangling = Vec::new();
    for m in messages.iter().rev() {
        match m.role {
            Role::Tool => {
                if let Some(id) = m.tool_call_id.as_deref() {
                    answered.insert(id);
                }
            }
            Role::Assistant => {
                for call in m.tool_calls.iter().rev() {
                    if !answered.contains(call.id.as_str()) {
                        dangling.push(call.clone());
                    }
                }
            }
            _ => {}
        }
    }
    dangling.reverse();
    dangling
}

/// Total size: the sum of [`Message::size_chars`].
pub fn context_chars<M: AsRef<Message>>(messages: &[M]) -> usize {
    messages.iter().map(|m| m.as_ref().size_chars()).sum()
}

/// Merges the newest summary into the leading system message; messages before the summary
/// (other than the leading system message) are not sent. Returns the messages to send; the
/// clones keep their `index` fields, so the positions in the history stay visible (the merged
/// system message keeps the index of the leading system message). Without a leading system
/// message the summary itself leads. Without a summary the messages are returned as they are.
pub fn apply_summary(messages: &[Message]) -> Vec<Message> {
    apply_summary_cow(messages.iter().map(Cow::Borrowed).collect())
        .into_iter()
        .map(Cow::into_owned)
        .collect()
}

fn apply_summary_cow(mut messages: Vec<Cow<'_, Message>>) -> Vec<Cow<'_, Message>> {
    let Some(s) = messages.iter().rposition(|m| m.is_summary()) else {
        return messages;
    };
    let has_system = messages
        .first()
        .is_some_and(|m| m.role == Role::System && !m.is_summary());
    let rest = messages.split_off(s + 1);
    let summary = messages.pop();
    let mut out = Vec::with_capacity(rest.len() + 1);
    match (has_system, summary) {
        (true, Some(summary)) => {
            if let Some(system) = messages.into_iter().next() {
                let mut merged = system.into_owned();
                if merged.content.is_empty() {
                    merged.content = summary.content.clone();
                } else {
                    merged.content = format!("{}\n\n{}", merged.content, summary.content);
                }
                merged.size = SizeCache::default();
                out.push(Cow::Owned(merged));
            }
        }
        (false, Some(summary)) => out.push(summary),
        (_, None) => {}
    }
    out.extend(rest);
    out
}

pub use crate::model::TrimStats;

fn omitted_placeholder(chars: usize) -> String {
    format!("[tool output omitted to fit the context window: {chars} chars]")
}

fn dropped_note(turns: usize) -> String {
    format!("[{turns} earlier conversation turn(s) omitted to fit the context window.]")
}

/// Trims to the budget; the input is what [`apply_summary`] returned. `None`: the
/// messages are returned unchanged, as they are when they fit.
///
/// Only while over budget, and re-checking after every change: (1) tool outputs of older turns
/// become a placeholder, oldest first; (2) whole oldest turns are dropped and the leading
/// system message gets a note with their number; (3) tool outputs of the current turn before
/// its last assistant message become a placeholder, oldest first. The leading system message,
/// messages before the first user message, the current turn and the tool results after its last
/// assistant message always stay; a tool call never loses its tool message (turns are only cut
/// where no call is waiting for its result). A placeholder that would not be shorter than the
/// output is not used. Still over budget after all rules: the best effort is returned.
/// Linear in the number of messages.
pub fn project_context(
    messages: &[Message],
    budget_chars: Option<usize>,
) -> (Vec<Message>, TrimStats) {
    let cows: Vec<Cow<'_, Message>> = messages.iter().map(Cow::Borrowed).collect();
    let (projected, stats) = project_cow(cows, budget_chars);
    (projected.into_iter().map(Cow::into_owned).collect(), stats)
}

/// The whole pipeline the loop uses: replace the leading system message's content with
/// `system_prompt` (insert one at the front if the history has none), [`apply_summary`], then
/// [`project_context`]. The messages the projection leaves as they are stay borrowed from
/// `history`: a request is built from them without copying the conversation.
pub fn prepare_context<'a>(
    history: &'a [Message],
    system_prompt: &str,
    budget_chars: Option<usize>,
) -> (Vec<Cow<'a, Message>>, TrimStats) {
    let mut cows: Vec<Cow<'_, Message>> = Vec::with_capacity(history.len() + 1);
    match history.first() {
        Some(first) if first.role == Role::System && !first.is_summary() => {
            cows.push(Cow::Owned(Message {
                index: first.index,
                role: Role::System,
                content: system_prompt.to_string(),
                thinking: Vec::new(),
                tool_calls: Vec::new(),
                tool_call_id: None,
                created_at: first.created_at,
                size: SizeCache::default(),
            }));
            cows.extend(history[1..].iter().map(Cow::Borrowed));
        }
        _ => {
            cows.push(Cow::Owned(Message::new(Role::System, system_prompt)));
            cows.extend(history.iter().map(Cow::Borrowed));
        }
    }
    let sendable = apply_summary_cow(cows);
    project_cow(sendable, budget_chars)
}

fn project_cow(
    messages: Vec<Cow<'_, Message>>,
    budget_chars: Option<usize>,
) -> (Vec<Cow<'_, Message>>, TrimStats) {
    let n = messages.len();
    let mut sizes: Vec<usize> = messages.iter().map(|m| m.size_chars()).collect();
    let chars_before: usize = sizes.iter().sum();
    let budget = match budget_chars {
        Some(b) if chars_before > b => b,
        other => {
            let stats = TrimStats {
                budget: other.unwrap_or(0),
                chars_before,
                chars_after: chars_before,
                ..TrimStats::default()
            };
            return (messages, stats);
        }
    };

    let has_system = messages.first().is_some_and(|m| m.role == Role::System);
    let body_start = usize::from(has_system);
    let boundaries = turn_boundaries(&messages, body_start);
    let cur_start = boundaries.last().copied().unwrap_or(body_start);

    let mut total = chars_before;
    let mut elided = vec![false; n];
    let mut elide = |i: usize, total: &mut usize, sizes: &mut [usize]| {
        let m = &messages[i];
        if m.role != Role::Tool {
            return;
        }
        let content = m.content.chars().count();
        let placeholder = omitted_placeholder(content).chars().count();
        if placeholder < content {
            *total -= content - placeholder;
            sizes[i] -= content - placeholder;
            elided[i] = true;
        }
    };

    // (1) Tool outputs before the current turn, oldest first.
    for i in body_start..cur_start {
        if total <= budget {
            break;
        }
        elide(i, &mut total, &mut sizes);
    }

    // (2) Whole oldest turns; the note grows the system message.
    let mut dropped_turns = 0;
    let mut keep_from = body_start; // first position kept after the prefix
    if total > budget && boundaries.len() > 1 {
        let mut prefix_sums = Vec::with_capacity(n + 1);
        let mut acc = 0usize;
        prefix_sums.push(0);
        for s in &sizes {
            acc += s;
            prefix_sums.push(acc);
        }
        let base = total;
        for j in 0..boundaries.len() - 1 {
            let dropped_chars = prefix_sums[boundaries[j + 1]] - prefix_sums[boundaries[0]];
            dropped_turns = j + 1;
            keep_from = boundaries[j + 1];
            total = base - dropped_chars + note_chars(dropped_turns, has_system);
            if total <= budget {
                break;
            }
        }
    }

    // (3) Current-turn tool outputs the model has already answered, oldest first.
    if total > budget {
        if let Some(last_assistant) = (cur_start..n)
            .rev()
            .find(|&i| messages[i].role == Role::Assistant)
        {
            for i in cur_start..last_assistant {
                if total <= budget {
                    break;
                }
                elide(i, &mut total, &mut sizes);
            }
        }
    }

    let first_turn = boundaries.first().copied().unwrap_or(n);
    let mut out = Vec::with_capacity(n + 1);
    let note = (dropped_turns > 0).then(|| dropped_note(dropped_turns));
    if let Some(note) = &note {
        if !has_system {
            out.push(Cow::Owned(Message::new(Role::System, note.clone())));
        }
    }
    let mut elided_tool_results = 0;
    for (i, m) in messages.into_iter().enumerate() {
        if dropped_turns > 0 && i >= first_turn && i < keep_from {
            continue;
        }
        if i == 0 && has_system {
            if let Some(note) = &note {
                let mut system = m.into_owned();
                system.content = format!("{}\n\n{}", system.content, note);
                system.size = SizeCache::default();
                out.push(Cow::Owned(system));
                continue;
            }
        }
        if elided[i] {
            elided_tool_results += 1;
            out.push(Cow::Owned(Message {
                index: m.index,
                role: m.role,
                content: omitted_placeholder(m.content.chars().count()),
                thinking: m.thinking.clone(),
                tool_calls: m.tool_calls.clone(),
                tool_call_id: m.tool_call_id.clone(),
                created_at: m.created_at,
                size: SizeCache::default(),
            }));
        } else {
            out.push(m);
        }
    }

    let stats = TrimStats {
        budget,
        chars_before,
        chars_after: total,
        dropped_turns,
        elided_tool_results,
    };
    (out, stats)
}

fn note_chars(turns: usize, has_system: bool) -> usize {
    let note = dropped_note(turns).chars().count();
    if has_system {
        note + 2
    } else {
        note
    }
}

/// Positions of the user messages (at or after `body_start`) where the history may be cut
/// between turns: those with no tool call before them whose result comes at or after them.
/// In a well-formed history that is every user message.
fn turn_boundaries(messages: &[Cow<'_, Message>], body_start: usize) -> Vec<usize> {
    let n = messages.len();
    let mut call_at: HashMap<&str, usize> = HashMap::new();
    // open[i] > 0 ⇔ some call at a position < i has its result at a position >= i.
    let mut open = vec![0i64; n + 2];
    for (p, m) in messages.iter().enumerate() {
        match m.role {
            Role::Assistant => {
                for call in &m.tool_calls {
                    call_at.insert(call.id.as_str(), p);
                }
            }
            Role::Tool => {
                if let Some(&c) = m.tool_call_id.as_deref().and_then(|id| call_at.get(id)) {
                    open[c + 1] += 1;
                    open[p + 1] -= 1;
                }
            }
            _ => {}
        }
    }
    let mut running = 0i64;
    let mut out = Vec::new();
    for (p, m) in messages.iter().enumerate() {
        running += open[p];
        if p >= body_start && m.role == Role::User && running == 0 {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::compaction::{summary_content, summary_input};
    use crate::agent::fixtures::{calls, reply, sys, tool, user};
    use crate::model::SUMMARY_PREFIX;
    use std::time::Instant;

    fn big(n: usize) -> String {
        "x".repeat(n)
    }
    /// Sets `index` to the position, as in a stored history.
    fn indexed(mut v: Vec<Message>) -> Vec<Message> {
        for (i, m) in v.iter_mut().enumerate() {
            m.index = i as i64;
        }
        v
    }
    fn placeholder(n: usize) -> String {
        omitted_placeholder(n)
    }
    fn contents(v: &[Message]) -> Vec<&str> {
        v.iter().map(|m| m.content.as_str()).collect()
    }
    fn indices<M: AsRef<Message>>(v: &[M]) -> Vec<i64> {
        v.iter().map(|m| m.as_ref().index).collect()
    }
    /// Every tool call in `v` has a tool message with its id after it, and every tool message
    /// answers a call made before it.
    fn assert_paired(v: &[Message]) {
        for (i, m) in v.iter().enumerate() {
            for c in &m.tool_calls {
                assert!(
                    v[i + 1..]
                        .iter()
                        .any(|t| t.role == Role::Tool && t.tool_call_id.as_deref() == Some(&c.id)),
                    "call {} lost its result",
                    c.id
                );
            }
            if m.role == Role::Tool {
                let id = m.tool_call_id.as_deref();
                assert!(
                    v[..i]
                        .iter()
                        .any(|a| a.tool_calls.iter().any(|c| Some(c.id.as_str()) == id)),
                    "result {id:?} lost its call"
                );
            }
        }
    }

    /// sys, three older turns each with one 1,000-char tool output, then the current turn.
    fn history() -> Vec<Message> {
        indexed(vec![
            sys("SYSTEM"),
            user("q1"),
            calls(&["c1"]),
            tool("c1", &big(1000)),
            reply("a1"),
            user("q2"),
            calls(&["c2"]),
            tool("c2", &big(1000)),
            reply("a2"),
            user("q3"),
            calls(&["c3"]),
            tool("c3", &big(1000)),
            reply("a3"),
            user("q4"),
        ])
    }

    #[test]
    fn turn_starts_are_user_positions() {
        assert_eq!(turn_starts(&history()), vec![1, 5, 9, 13]);
        assert!(turn_starts(&[sys("s")]).is_empty());
        assert!(turn_starts(&[]).is_empty());
    }

    #[test]
    fn none_budget_returns_unchanged() {
        let h = history();
        let (out, stats) = project_context(&h, None);
        assert_eq!(out, h);
        assert!(!stats.trimmed());
        assert_eq!(stats.budget, 0);
        assert_eq!(stats.chars_before, context_chars(&h));
        assert_eq!(stats.chars_after, stats.chars_before);
    }

    #[test]
    fn under_or_at_budget_returns_unchanged() {
        let h = history();
        let total = context_chars(&h);
        for budget in [total, total + 1, usize::MAX] {
            let (out, stats) = project_context(&h, Some(budget));
            assert_eq!(out, h);
            assert!(!stats.trimmed());
            assert_eq!(stats.budget, budget);
            assert_eq!(stats.chars_after, total);
        }
    }

    #[test]
    fn empty_input_is_fine() {
        let (out, stats) = project_context(&[], Some(0));
        assert!(out.is_empty());
        assert!(!stats.trimmed());
        assert!(apply_summary(&[]).is_empty());
        assert!(dangling_tool_calls(&[]).is_empty());
        assert_eq!(summary_input(&[]), "");
    }

    #[test]
    fn old_tool_outputs_are_omitted_oldest_first_before_any_turn_is_dropped() {
        let h = history();
        let total = context_chars(&h);
        let saved = 1000 - placeholder(1000).chars().count();
        // One elision is enough.
        let (out, stats) = project_context(&h, Some(total - 1));
        assert_eq!(out[3].content, placeholder(1000));
        assert_eq!(out[7].content, big(1000));
        assert_eq!(out[11].content, big(1000));
        assert_eq!(out.len(), h.len());
        assert_eq!(stats.dropped_turns, 0);
        assert_eq!(stats.elided_tool_results, 1);
        assert_eq!(stats.chars_after, total - saved);
        // All three older outputs, still no turn dropped.
        let (out, stats) = project_context(&h, Some(total - 3 * saved));
        assert_eq!(stats.dropped_turns, 0);
        assert_eq!(stats.elided_tool_results, 3);
        for i in [3, 7, 11] {
            assert_eq!(out[i].content, placeholder(1000));
            assert_eq!(out[i].tool_call_id, h[i].tool_call_id);
            assert_eq!(out[i].index, h[i].index);
        }
        assert_eq!(stats.chars_after, total - 3 * saved);
        assert_eq!(context_chars(&out), stats.chars_after);
        assert_eq!(out[0].content, "SYSTEM");
    }

    #[test]
    fn oldest_turns_are_dropped_with_a_note_and_count() {
        let h = history();
        let total = context_chars(&h);
        let saved = 1000 - placeholder(1000).chars().count();
        let elided_total = total - 3 * saved;
        let (out, stats) = project_context(&h, Some(elided_total - 1));
        assert_eq!(stats.dropped_turns, 1);
        assert_eq!(
            out[0].content,
            "SYSTEM\n\n[1 earlier conversation turn(s) omitted to fit the context window.]"
        );
        assert_eq!(indices(&out), vec![0, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
        assert_eq!(stats.elided_tool_results, 2);
        assert_eq!(context_chars(&out), stats.chars_after);
        assert!(stats.chars_after < elided_total);
        assert_paired(&out);

        // A budget only the system message and the current turn fit into.
        let (out, stats) = project_context(&h, Some(1));
        assert_eq!(stats.dropped_turns, 3);
        assert_eq!(indices(&out), vec![0, 13]);
        assert_eq!(
            out[0].content,
            "SYSTEM\n\n[3 earlier conversation turn(s) omitted to fit the context window.]"
        );
        assert_eq!(stats.elided_tool_results, 0);
        assert_eq!(context_chars(&out), stats.chars_after);
        assert!(stats.trimmed());
    }

    #[test]
    fn stats_numbers_are_exact() {
        let h = history();
        let sizes: Vec<usize> = h.iter().map(Message::size_chars).collect();
        let ph = placeholder(1000).chars().count();
        let note = "\n\n[2 earlier conversation turn(s) omitted to fit the context window.]"
            .chars()
            .count();
        // After eliding all three and dropping two turns:
        let expected = sizes[0] + note + sizes[9] + sizes[10] + ph + sizes[12] + sizes[13];
        let (out, stats) = project_context(&h, Some(expected));
        assert_eq!(
            stats,
            TrimStats {
                budget: expected,
                chars_before: sizes.iter().sum(),
                chars_after: expected,
                dropped_turns: 2,
                elided_tool_results: 1,
            }
        );
        assert_eq!(context_chars(&out), expected);
    }

    #[test]
    fn dropping_keeps_tool_calls_paired_at_every_budget() {
        let h = indexed(vec![
            sys("S"),
            user("q1"),
            calls(&["a", "b"]),
            tool("a", &big(300)),
            tool("b", &big(200)),
            calls(&["c"]),
            tool("c", &big(500)),
            reply("done"),
            user("q2"),
            calls(&["d"]),
            tool("d", &big(400)),
            user("q3"),
            calls(&["e", "f"]),
            tool("e", &big(300)),
            tool("f", &big(300)),
            calls(&["g"]),
            tool("g", &big(300)),
        ]);
        let total = context_chars(&h);
        for budget in (0..=total).step_by(37) {
            let (out, stats) = project_context(&h, Some(budget));
            assert_paired(&out);
            assert_eq!(context_chars(&out), stats.chars_after, "budget {budget}");
            assert_eq!(out[0].index, 0);
            // The current turn is always there, whole.
            assert_eq!(&indices(&out)[out.len() - 6..], &[11, 12, 13, 14, 15, 16]);
            // The newest batch keeps its content.
            assert_eq!(out.last().map(|m| m.content.clone()), Some(big(300)));
        }
    }

    #[test]
    fn current_turn_is_kept_even_when_it_alone_exceeds_the_budget() {
        let h = indexed(vec![
            sys("S"),
            user("old"),
            reply("old answer"),
            user(&big(5000)),
            calls(&["c"]),
            tool("c", &big(5000)),
        ]);
        let (out, stats) = project_context(&h, Some(100));
        assert_eq!(indices(&out), vec![0, 3, 4, 5]);
        assert_eq!(out[1].content, big(5000));
        assert_eq!(out[3].content, big(5000));
        assert_eq!(stats.dropped_turns, 1);
        assert_eq!(stats.elided_tool_results, 0);
        assert!(stats.chars_after > 100);
        assert_eq!(context_chars(&out), stats.chars_after);
    }

    #[test]
    fn rule_three_elides_seen_current_outputs_but_keeps_the_newest_batch() {
        let h = indexed(vec![
            sys("S"),
            user("q"),
            calls(&["c1"]),
            tool("c1", &big(1000)),
            calls(&["c2", "c3"]),
            tool("c2", &big(1000)),
            tool("c3", &big(1000)),
            calls(&["c4", "c5"]),
            tool("c4", &big(1000)),
            tool("c5", &big(1000)),
        ]);
        let total = context_chars(&h);
        // Just over: only the oldest output goes.
        let (out, stats) = project_context(&h, Some(total - 1));
        assert_eq!(out[3].content, placeholder(1000));
        assert_eq!(out[5].content, big(1000));
        assert_eq!(stats.elided_tool_results, 1);
        assert_eq!(stats.dropped_turns, 0);
        // Far over: everything before the last assistant message, not after it.
        let (out, stats) = project_context(&h, Some(10));
        assert_eq!(
            contents(&out)[3..],
            [
                placeholder(1000).as_str(),
                "",
                placeholder(1000).as_str(),
                placeholder(1000).as_str(),
                "",
                big(1000).as_str(),
                big(1000).as_str(),
            ]
        );
        assert_eq!(stats.elided_tool_results, 3);
        assert_eq!(out.len(), h.len());
        assert_paired(&out);
    }

    #[test]
    fn rule_three_runs_only_after_older_turns_are_gone() {
        let h = indexed(vec![
            sys("S"),
            user("q1"),
            reply(&big(500)),
            user("q2"),
            calls(&["c1"]),
            tool("c1", &big(1000)),
            calls(&["c2"]),
            tool("c2", &big(1000)),
        ]);
        let total = context_chars(&h);
        // Dropping the old turn is enough: the current turn's outputs stay.
        let (out, stats) = project_context(&h, Some(total - 400));
        assert_eq!(stats.dropped_turns, 1);
        assert_eq!(stats.elided_tool_results, 0);
        assert_eq!(out[out.len() - 3].content, big(1000));
    }

    #[test]
    fn messages_before_the_first_user_message_stay() {
        let h = indexed(vec![
            sys("S"),
            reply("greeting"),
            user("q1"),
            reply(&big(1000)),
            user("q2"),
        ]);
        let (out, stats) = project_context(&h, Some(10));
        assert_eq!(indices(&out), vec![0, 1, 4]);
        assert_eq!(stats.dropped_turns, 1);
    }

    #[test]
    fn without_a_system_message_the_note_becomes_one() {
        let h = indexed(vec![user("q1"), reply(&big(1000)), user("q2")]);
        let (out, stats) = project_context(&h, Some(10));
        assert_eq!(stats.dropped_turns, 1);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].role, Role::System);
        assert_eq!(
            out[0].content,
            "[1 earlier conversation turn(s) omitted to fit the context window.]"
        );
        assert_eq!(out[1].content, "q2");
        assert_eq!(context_chars(&out), stats.chars_after);
    }

    #[test]
    fn a_placeholder_longer_than_the_output_is_not_used() {
        let h = indexed(vec![
            sys("S"),
            user("q1"),
            calls(&["c1"]),
            tool("c1", "short"),
            reply("a"),
            user("q2"),
        ]);
        let (out, stats) = project_context(&h, Some(1));
        // Nothing to gain from the placeholder; the turn is dropped instead.
        assert_eq!(stats.elided_tool_results, 0);
        assert_eq!(stats.dropped_turns, 1);
        assert_eq!(indices(&out), vec![0, 5]);
    }

    #[test]
    fn a_user_message_between_a_call_and_its_result_is_no_cut() {
        // q2 arrived while c1 was running: turns 1 and 2 can only go together.
        let h = indexed(vec![
            sys("S"),
            user("q1"),
            calls(&["c1"]),
            user("q2"),
            tool("c1", &big(1000)),
            reply("a"),
            user("q3"),
            reply("b"),
        ]);
        let (out, stats) = project_context(&h, Some(10));
        assert_eq!(stats.dropped_turns, 1);
        assert_eq!(indices(&out), vec![0, 6, 7]);
        assert_paired(&out);
        // When the spanning pair reaches into the current turn, that turn starts earlier.
        let h = indexed(vec![
            sys("S"),
            user("q0"),
            reply(&big(1000)),
            user("q1"),
            calls(&["c1"]),
            user("q2"),
            tool("c1", &big(1000)),
        ]);
        let (out, stats) = project_context(&h, Some(10));
        assert_eq!(stats.dropped_turns, 1);
        assert_eq!(indices(&out), vec![0, 3, 4, 5, 6]);
        assert_eq!(out[4].content, big(1000));
        assert_paired(&out);
    }

    #[test]
    fn chinese_content_is_counted_in_chars() {
        let zh = "上下文".repeat(400); // 1,200 chars, 3,600 bytes
        let h = indexed(vec![
            sys("系统"),
            user("读取文件"),
            calls(&["c1"]),
            tool("c1", &zh),
            reply("好的"),
            user("继续"),
        ]);
        let total = context_chars(&h);
        assert_eq!(h[3].size_chars(), 1200);
        let (out, stats) = project_context(&h, Some(total - 1));
        assert_eq!(out[3].content, placeholder(1200));
        assert_eq!(stats.chars_before, total);
        assert_eq!(
            stats.chars_after,
            total - 1200 + placeholder(1200).chars().count()
        );
        assert_eq!(stats.dropped_turns, 0);
        // A budget that the byte count would miss but the char count meets: unchanged.
        let (out, stats) = project_context(&h, Some(total));
        assert_eq!(out, h);
        assert!(!stats.trimmed());
    }

    #[test]
    fn input_is_not_mutated() {
        let h = history();
        let copy = h.clone();
        let _ = project_context(&h, Some(1));
        let _ = prepare_context(&h, "new prompt", Some(1));
        let _ = apply_summary(&h);
        assert_eq!(h, copy);
    }

    #[test]
    fn apply_summary_without_a_summary_is_identity() {
        let h = history();
        assert_eq!(apply_summary(&h), h);
    }

    #[test]
    fn apply_summary_merges_the_newest_of_two_summaries_and_drops_what_precedes_it() {
        let h = indexed(vec![
            sys("SYSTEM"),
            user("q1"),
            reply("a1"),
            sys(&summary_content("first")),
            user("q2"),
            reply("a2"),
            sys(&summary_content("second")),
            user("q3"),
            reply("a3"),
        ]);
        let out = apply_summary(&h);
        assert_eq!(indices(&out), vec![0, 7, 8]);
        assert_eq!(out[0].role, Role::System);
        assert_eq!(
            out[0].content,
            format!("SYSTEM\n\n{SUMMARY_PREFIX}\nsecond")
        );
        assert!(!out.iter().any(|m| m.content.contains("first")));
        assert_eq!(contents(&out)[1..], ["q3", "a3"]);
    }

    #[test]
    fn apply_summary_at_the_end_leaves_only_the_system_message() {
        let h = indexed(vec![
            sys("SYSTEM"),
            user("q1"),
            reply("a1"),
            sys(&summary_content("all")),
        ]);
        let out = apply_summary(&h);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].content, format!("SYSTEM\n\n{SUMMARY_PREFIX}\nall"));
    }

    #[test]
    fn apply_summary_without_a_system_message_lets_the_summary_lead() {
        let h = indexed(vec![user("q1"), sys(&summary_content("s")), user("q2")]);
        let out = apply_summary(&h);
        assert_eq!(indices(&out), vec![1, 2]);
        assert!(out[0].is_summary());
    }

    #[test]
    fn prepare_context_replaces_the_system_prompt() {
        let h = history();
        let (out, stats) = prepare_context(&h, "NEW PROMPT", None);
        assert_eq!(out[0].content, "NEW PROMPT");
        assert_eq!(out[0].index, 0);
        assert!(!stats.trimmed());
        // What the projection leaves as it is, it borrows from the history: no copies.
        assert_eq!(out.len(), h.len());
        for (sent, stored) in out[1..].iter().zip(&h[1..]) {
            assert!(matches!(sent, Cow::Borrowed(m) if std::ptr::eq(*m, stored)));
        }
    }

    #[test]
    fn prepare_context_inserts_a_system_prompt_when_there_is_none() {
        let h = indexed(vec![user("q1"), reply("a1")]);
        let (out, _) = prepare_context(&h, "P", None);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].role, Role::System);
        assert_eq!(out[0].content, "P");
        assert!(out[1..].iter().map(AsRef::as_ref).eq(h.iter()));
        // A leading summary is not a system prompt to replace.
        let h = indexed(vec![sys(&summary_content("s")), user("q")]);
        let (out, _) = prepare_context(&h, "P", None);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].content, format!("P\n\n{SUMMARY_PREFIX}\ns"));
    }

    #[test]
    fn prepare_context_applies_summary_then_trims() {
        let h = indexed(vec![
            sys("old prompt"),
            user("q1"),
            reply(&big(1000)),
            sys(&summary_content("sum")),
            user("q2"),
            reply(&big(1000)),
            user("q3"),
        ]);
        let (out, stats) = prepare_context(&h, "P", Some(50));
        assert_eq!(indices(&out), vec![0, 6]);
        assert_eq!(
            out[0].content,
            format!(
                "P\n\n{SUMMARY_PREFIX}\nsum\n\n[1 earlier conversation turn(s) omitted to fit \
                 the context window.]"
            )
        );
        assert_eq!(stats.dropped_turns, 1);
        assert_eq!(context_chars(&out), stats.chars_after);
    }

    #[test]
    fn dangling_tool_calls_finds_only_unanswered_calls() {
        let h = indexed(vec![
            sys("S"),
            user("q1"),
            calls(&["a", "b"]),
            tool("a", "ok"),
            user("q2"),
            calls(&["c", "d", "e"]),
            tool("d", "ok"),
        ]);
        let ids: Vec<String> = dangling_tool_calls(&h).into_iter().map(|c| c.id).collect();
        assert_eq!(ids, vec!["b", "c", "e"]);
        // A result before its call does not answer it.
        let h = vec![tool("x", "early"), calls(&["x"])];
        assert_eq!(dangling_tool_calls(&h).len(), 1);
        assert!(dangling_tool_calls(&history()).is_empty());
        assert!(NOT_RUN_RESULT.contains("not run"));
        assert!(serde_json::from_str::<serde_json::Value>(NOT_RUN_RESULT).is_ok());
    }

    #[test]
    fn a_long_history_projects_in_linear_time() {
        let mut h = vec![sys("S")];
        for i in 0..2_500 {
            let id = format!("c{i}");
            h.push(user(&format!("q{i}")));
            h.push(calls(&[id.as_str()]));
            h.push(tool(&id, &big(200)));
            h.push(reply("ok"));
        }
        let h = indexed(h);
        assert_eq!(h.len(), 10_001);
        let started = Instant::now();
        let (out, stats) = project_context(&h, Some(20_000));
        let (out2, _) = prepare_context(&h, "P", Some(20_000));
        eprintln!(
            "projected {} messages twice in {:?}: {} kept, {} turns dropped",
            h.len(),
            started.elapsed(),
            out.len(),
            stats.dropped_turns
        );
        assert!(stats.chars_after <= 20_000);
        assert_eq!(context_chars(&out), stats.chars_after);
        assert_eq!(out.len(), out2.len());
        assert_paired(&out);
        let started = Instant::now();
        let text = summary_input(&h);
        eprintln!(
            "summary input of {} chars in {:?}",
            text.len(),
            started.elapsed()
        );
        let started = Instant::now();
        assert!(dangling_tool_calls(&h).is_empty());
        eprintln!("dangling check in {:?}", started.elapsed());
    }
}
