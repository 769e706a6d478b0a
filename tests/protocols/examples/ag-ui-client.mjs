// A minimal AG-UI client for tah: asks one question, prints the answer as it streams, runs a
// tool of its own when the model calls it, and asks you before tah runs a tool its policy
// wants approved.
//
//   npm install @ag-ui/client@1.0.0
//   node ag-ui-client.mjs http://127.0.0.1:8080 SESSION_ID "your question"
import { HttpAgent } from '@ag-ui/client';
import { createInterface } from 'node:readline/promises';

const [server, sessionId, question] = process.argv.slice(2);
const terminal = createInterface({ input: process.stdin, output: process.stderr });

const agent = new HttpAgent({
  url: `${server}/v1/sessions/${sessionId}/ag-ui`,
  threadId: sessionId,
  // headers: { authorization: `Bearer ${token}` },  // when tah runs with --api-token
});

// A tool this client runs: offered to the model for the run; its result goes back in the
// next run's messages.
const tools = [
  {
    name: 'ask_user',
    description: 'Ask the user a question and get their answer',
    parameters: {
      type: 'object',
      properties: { question: { type: 'string' } },
      required: ['question'],
    },
  },
];

agent.addMessage({ id: crypto.randomUUID(), role: 'user', content: question });
let resume;
for (;;) {
  let finished;
  await agent.runAgent(
    { tools, resume },
    {
      onTextMessageContentEvent: ({ event }) => void process.stdout.write(event.delta),
      onRunFinishedEvent: (finish) => void (finished = finish),
    },
  );
  resume = undefined;
  if (finished.outcome === 'interrupt') {
    // tah asks before running a call its policy does not allow by itself.
    resume = [];
    for (const interrupt of finished.interrupts) {
      const answer = await terminal.question(`${interrupt.message} [y/N] `);
      resume.push({
        interruptId: interrupt.id,
        status: 'resolved',
        payload: { approved: answer.trim().toLowerCase() === 'y' },
      });
    }
    continue;
  }
  const calls = agent.messages.flatMap((m) => m.toolCalls ?? []);
  const pending = calls.filter((c) => finished.pendingToolCallIds?.includes(c.id));
  if (pending.length === 0) break;
  for (const call of pending) {
    const { question: asked } = JSON.parse(call.function.arguments);
    const answer = await terminal.question(`${asked} `);
    agent.addMessage({ id: crypto.randomUUID(), role: 'tool', toolCallId: call.id, content: answer });
  }
}
process.stdout.write('\n');
terminal.close();
