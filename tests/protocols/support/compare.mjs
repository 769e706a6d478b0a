// What the protocol clients reconstruct, checked against tah's own record of the run (its
// messages and events): the same text, reasoning, tool calls, inputs and results.

import assert from 'node:assert/strict';

/** The readable reasoning of a stored message (its thinking blocks, one paragraph each). */
export function thinkingText(message) {
  return (message.thinking ?? [])
    .map((b) => b.thinking ?? '')
    .filter((t) => t.length > 0)
    .join('\n\n');
}

/** The tool result messages of a turn, by call id. */
function resultsByCall(turn) {
  return new Map(turn.filter((m) => m.role === 'tool').map((m) => [m.tool_call_id, m.content]));
}

/**
 * An AI SDK assistant UI message against the stored messages of the turn it shows (from the
 * user's message on): one text part per assistant message with text, one reasoning part per
 * one with reasoning, one tool part per call with its input and its result.
 */
export function assertUiMessageIsTurn(uiMessage, turn, { denied = [] } = {}) {
  assert.equal(uiMessage.role, 'assistant');
  const assistants = turn.filter((m) => m.role === 'assistant');
  const texts = uiMessage.parts.filter((p) => p.type === 'text').map((p) => p.text);
  assert.deepEqual(texts, assistants.map((m) => m.content).filter((t) => t.length > 0), 'text parts');
  const reasoning = uiMessage.parts.filter((p) => p.type === 'reasoning').map((p) => p.text);
  assert.deepEqual(reasoning, assistants.map(thinkingText).filter((t) => t.length > 0), 'reasoning parts');
  const calls = assistants.flatMap((m) => m.tool_calls ?? []);
  const tools = uiMessage.parts.filter((p) => p.type.startsWith('tool-'));
  assert.deepEqual(
    tools.map((p) => [p.toolCallId, p.type.slice('tool-'.length)]),
    calls.map((c) => [c.id, c.name]),
    'tool parts',
  );
  const results = resultsByCall(turn);
  for (const [i, part] of tools.entries()) {
    assert.deepEqual(part.input, calls[i].arguments, `input of ${part.toolCallId}`);
    if (denied.includes(part.toolCallId)) {
      assert.equal(part.state, 'output-denied', `state of ${part.toolCallId}`);
      assert.match(results.get(part.toolCallId), /denied/);
    } else if (part.state === 'output-available') {
      // tah keeps a result as text: JSON a client gave is kept as its JSON text.
      const output = typeof part.output === 'string' ? part.output : JSON.stringify(part.output);
      assert.equal(output, results.get(part.toolCallId), `output of ${part.toolCallId}`);
    } else {
      assert.equal(part.state, 'output-error', `state of ${part.toolCallId}`);
      assert.equal(part.errorText, results.get(part.toolCallId), `error of ${part.toolCallId}`);
    }
  }
  assert.equal(uiMessage.parts.filter((p) => p.type === 'step-start').length, assistants.length, 'steps');
}

/** AG-UI messages in a comparable form (reasoning and activity messages left out). */
export function agUiConversation(messages) {
  return messages
    .filter((m) => ['user', 'assistant', 'tool'].includes(m.role))
    .map((m) => ({
      role: m.role,
      content: typeof m.content === 'string' ? m.content : '',
      toolCalls: (m.toolCalls ?? []).map((c) => ({
        id: c.id,
        name: c.function.name,
        arguments: JSON.parse(c.function.arguments),
      })),
      toolCallId: m.toolCallId ?? null,
    }));
}

/** Stored messages in the same form. */
export function storedConversation(messages) {
  return messages
    .filter((m) => m.role !== 'system')
    .map((m) => ({
      role: m.role,
      content: m.content,
      toolCalls: (m.tool_calls ?? []).map((c) => ({ id: c.id, name: c.name, arguments: c.arguments })),
      toolCallId: m.tool_call_id ?? null,
    }));
}
