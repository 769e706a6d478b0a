// A2A v1.0 with its own client (`@a2a-js/sdk` 1.3.0's ClientFactory: the agent card, then the
// JSON-RPC transport it prefers, or the HTTP+JSON one), pinned, against tah: a context is a
// session, a task is a run, approvals and client tools are INPUT_REQUIRED, a stream resumes
// exactly from tah's seq, push notifications are signed as tah's webhooks are.

import assert from 'node:assert/strict';
import { createHmac, randomBytes, randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { describe, test } from 'node:test';

import { Role, TaskState } from '@a2a-js/sdk';
import {
  ClientFactory,
  ClientFactoryOptions,
  DefaultAgentCardResolver,
  JsonRpcTransportFactory,
  RestTransportFactory,
} from '@a2a-js/sdk/client';

import { startTah, suiteServer, until } from './support/server.mjs';

/** A client of the agent card under `base` (`…/a2a/{agent}/`, with its trailing slash, or the server). */
async function clientOf(base, { token, transport = 'JSONRPC' } = {}) {
  const fetchImpl = (url, init = {}) => {
    const headers = new Headers(init.headers);
    if (token) headers.set('authorization', `Bearer ${token}`);
    return fetch(url, { ...init, headers });
  };
  const factory = new ClientFactory(
    ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl }), new RestTransportFactory({ fetchImpl })],
      cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
      preferredTransports: [transport],
    }),
  );
  return factory.createFromUrl(base);
}

function userMessage(text, extra = {}) {
  return {
    messageId: randomUUID(),
    role: Role.ROLE_USER,
    parts: [{ content: { $case: 'text', value: text } }],
    ...extra,
  };
}

function dataMessage(data, extra) {
  return {
    messageId: randomUUID(),
    role: Role.ROLE_USER,
    parts: [{ content: { $case: 'data', value: data } }],
    ...extra,
  };
}

/** Every event of a stream, as `{case, value}`. */
async function collect(stream) {
  const all = [];
  for await (const event of stream) all.push({ case: event.payload.$case, value: event.payload.value });
  return all;
}

const seqOf = (event) => event.value.metadata?.tah_seq;
const stateOf = (event) => (event.case === 'task' ? event.value.status.state : event.value.status?.state);
const textOf = (message) => message.parts.map((p) => p.content?.value).join('');

describe('@a2a-js/sdk client against tah (mock model)', () => {
  const server = suiteServer({ mockDelayMs: 5, extraArgs: ['--a2a-allow-private-push'] });

  test('the cards describe the agents and their interfaces', async () => {
    const client = await clientOf(server.url);
    const card = client.agentCard;
    assert.equal(card.name, 'default');
    assert.deepEqual(
      card.supportedInterfaces.map((i) => [i.protocolBinding, i.url, i.protocolVersion]),
      [
        ['JSONRPC', `${server.url}/a2a/default`, '1.0'],
        ['HTTP+JSON', `${server.url}/a2a/default`, '1.0'],
      ],
    );
    assert.equal(card.capabilities.streaming, true);
    assert.equal(card.capabilities.pushNotifications, true);
    assert.ok(card.skills.some((s) => s.id === 'read_file'));
    const own = await clientOf(`${server.url}/a2a/default/`);
    assert.deepEqual(own.agentCard, card);
    const missing = await fetch(`${server.url}/a2a/${randomUUID()}/.well-known/agent-card.json`);
    assert.equal(missing.status, 404);
  });

  for (const transport of ['JSONRPC', 'HTTP+JSON']) {
    test(`a blocking send answers the completed task; get and list find it (${transport})`, async () => {
      const client = await clientOf(`${server.url}/a2a/default/`, { transport });
      const task = await client.sendMessage({ message: userMessage('what is in this workspace?') });
      assert.equal(task.status.state, TaskState.TASK_STATE_COMPLETED);
      const runs = (await server.api('GET', `/v1/sessions/${task.contextId}/runs`)).body.data;
      assert.deepEqual(runs.map((r) => r.id), [task.id]);
      assert.equal(textOf(task.status.message), runs[0].text);
      assert.deepEqual(task.history.map((m) => [m.role, textOf(m)]), [
        [Role.ROLE_USER, 'what is in this workspace?'],
        [Role.ROLE_AGENT, runs[0].text],
      ]);
      assert.equal(task.artifacts.length, 1);
      assert.equal(task.artifacts[0].parts[0].content.value, runs[0].text);

      // A second message in the same context is a second task of the same session.
      const second = await client.sendMessage({ message: userMessage('and now?', { contextId: task.contextId }) });
      assert.equal(second.contextId, task.contextId);
      assert.notEqual(second.id, task.id);

      const got = await client.getTask({ id: task.id, historyLength: 1 });
      assert.equal(got.status.state, TaskState.TASK_STATE_COMPLETED);
      assert.deepEqual(got.history.map((m) => m.role), [Role.ROLE_AGENT]);
      const listed = await client.listTasks({ contextId: task.contextId, pageSize: 1 });
      assert.deepEqual(listed.tasks.map((t) => t.id), [second.id]);
      assert.equal(listed.totalSize, 2);
      const rest = await client.listTasks({ contextId: task.contextId, pageToken: listed.nextPageToken });
      assert.deepEqual(rest.tasks.map((t) => t.id), [task.id]);
      assert.equal(rest.nextPageToken, '');
      const completed = await client.listTasks({ contextId: task.contextId, status: TaskState.TASK_STATE_WORKING });
      assert.deepEqual(completed.tasks, []);
      await assert.rejects(client.getTask({ id: randomUUID() }), { name: 'TaskNotFoundError' });
    });
  }

  test('a streaming send gives the task, its artifacts and its states, each with its seq', async () => {
    const client = await clientOf(`${server.url}/a2a/default/`);
    const events = await collect(client.sendMessageStream({ message: userMessage('think: look around') }));
    assert.equal(events[0].case, 'task');
    assert.equal(stateOf(events[0]), TaskState.TASK_STATE_WORKING);
    assert.equal(events.at(-1).case, 'statusUpdate');
    assert.equal(stateOf(events.at(-1)), TaskState.TASK_STATE_COMPLETED);
    assert.ok(events.some((e) => e.case === 'artifactUpdate'));
    const seqs = events.map(seqOf);
    assert.ok(seqs.every((s, i) => Number.isInteger(s) && (i === 0 || s > seqs[i - 1])), `${seqs}`);
    const taskId = events[0].value.id;
    const log = await server.events(events[0].value.contextId);
    assert.equal(log.find((e) => e.seq === seqs[0]).type, 'agent.started');
    assert.equal(log.find((e) => e.seq === seqs.at(-1)).type, 'agent.finished');
    assert.equal(log.find((e) => e.seq === seqs.at(-1)).data.run_id, taskId);
  });

  test('a subscription dropped and resumed from Last-Event-ID misses and repeats nothing', async () => {
    const client = await clientOf(`${server.url}/a2a/default/`);
    const started = await client.sendMessage({
      message: userMessage('think: what is in here?'),
      configuration: { returnImmediately: true },
    });
    const first = [];
    const controller = new AbortController();
    try {
      for await (const event of client.resubscribeTask({ id: started.id }, { signal: controller.signal })) {
        first.push({ case: event.payload.$case, value: event.payload.value });
        if (first.length === 1) break;
      }
    } finally {
      controller.abort();
    }
    const last = seqOf(first.at(-1));
    const rest = await collect(
      client.resubscribeTask({ id: started.id }, { serviceParameters: { 'Last-Event-ID': String(last) } }),
    );
    assert.equal(stateOf(rest.at(-1)), TaskState.TASK_STATE_COMPLETED);
    const whole = await collect(client.resubscribeTask({ id: started.id }));
    assert.equal(whole[0].case, 'task');
    assert.deepEqual([...first, ...rest].map(seqOf), whole.map(seqOf));
    assert.deepEqual([...first, ...rest].map((e) => e.case), whole.map((e) => e.case));
  });

  test('cancel ends a task in progress; a finished task is not cancelable', async () => {
    const client = await clientOf(`${server.url}/a2a/default/`, { transport: 'HTTP+JSON' });
    const started = await client.sendMessage({
      message: userMessage('write a note about cancelling'),
      configuration: { returnImmediately: true },
    });
    // The write waits for an approval: the task is in progress until it is answered.
    await until(async () => (await client.getTask({ id: started.id })).status.state === TaskState.TASK_STATE_INPUT_REQUIRED, 'input required');
    const canceled = await client.cancelTask({ id: started.id });
    assert.equal(canceled.status.state, TaskState.TASK_STATE_CANCELED);
    await assert.rejects(client.cancelTask({ id: started.id }), { name: 'TaskNotCancelableError' });
  });

  test('an approval is INPUT_REQUIRED, answered by a data part on the same task', async () => {
    const client = await clientOf(`${server.url}/a2a/default/`);
    const events = await collect(client.sendMessageStream({ message: userMessage('write a note about approvals') }));
    const waiting = events.at(-1);
    assert.equal(stateOf(waiting), TaskState.TASK_STATE_INPUT_REQUIRED);
    const [text, call] = waiting.value.status.message.parts;
    assert.match(text.content.value, /write_file/);
    assert.equal(call.content.value.tool, 'write_file');
    assert.equal(call.content.value.kind, 'approval');
    const { taskId, contextId } = waiting.value;
    const pending = (await server.api('GET', `/v1/sessions/${contextId}/approvals`)).body.data;
    assert.deepEqual(pending.map((p) => p.call_id), [call.content.value.call_id]);

    const answered = await client.sendMessage({
      message: dataMessage({ call_id: call.content.value.call_id, decision: 'allow' }, { taskId, contextId }),
    });
    assert.equal(answered.id, taskId);
    assert.equal(answered.status.state, TaskState.TASK_STATE_COMPLETED);
    assert.ok(existsSync(join(server.workspace, 'notes.md')));
    assert.ok(answered.artifacts.some((a) => a.name === 'notes.md' && a.parts[0].content.$case === 'url'));
    const resolved = (await server.events(contextId)).filter((e) => e.type === 'tool.approval-resolved');
    assert.deepEqual(resolved.map((e) => [e.data.decision, e.data.by]), [['allow', 'user']]);
  });

  test("a client tool's call is INPUT_REQUIRED, answered by its output", async () => {
    // A session of the default agent that declares a client tool, continued as a context.
    const contextId = await server.createSession({
      client_tools: [{ name: 'ask_user', description: 'Ask the user', input_schema: { type: 'object' } }],
    });
    const client = await clientOf(`${server.url}/a2a/default/`);
    let task = await client.sendMessage({ message: userMessage('ask the client what colour it likes', { contextId }) });
    assert.equal(task.contextId, contextId);
    assert.equal(task.status.state, TaskState.TASK_STATE_INPUT_REQUIRED);
    let call = task.status.message.parts[1].content.value;
    if (call.kind === 'approval') {
      // The policy may ask before a client tool is called: then the output comes second.
      task = await client.sendMessage({
        message: dataMessage({ call_id: call.call_id, decision: 'allow' }, { taskId: task.id, contextId }),
      });
      assert.equal(task.status.state, TaskState.TASK_STATE_INPUT_REQUIRED);
      call = task.status.message.parts[1].content.value;
    }
    assert.deepEqual([call.tool, call.kind], ['ask_user', 'client_tool']);
    assert.deepEqual(call.input, { question: 'ask the client what colour it likes' });
    const stream = client.sendMessageStream({
      message: dataMessage({ call_id: call.call_id, output: 'green' }, { taskId: task.id, contextId }),
    });
    const events = await collect(stream);
    assert.equal(events[0].case, 'task');
    assert.equal(stateOf(events.at(-1)), TaskState.TASK_STATE_COMPLETED);
    assert.match(textOf(events.at(-1).value.status.message), /ask_user answered: green/);
    const finished = (await server.events(contextId)).filter((e) => e.type === 'tool.finished' && e.data.call_id === call.call_id);
    assert.deepEqual(finished.map((e) => [e.data.output, e.data.is_error]), [['green', false]]);
    // A client of another agent does not reach this context's tasks.
    const { body: agent } = await server.api('POST', '/v1/agents', { name: 'other', model: 'mock' });
    const other = await clientOf(`${server.url}/a2a/${agent.id}/`);
    assert.equal(other.agentCard.name, 'other');
    await assert.rejects(other.getTask({ id: task.id }), { name: 'TaskNotFoundError' });
  });

  test('a push notification config gets the task updates, signed', async () => {
    const secret = randomBytes(32);
    const token = `whsec_${secret.toString('base64')}`;
    const received = [];
    const receiver = createServer((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        received.push({ headers: req.headers, body });
        res.writeHead(204).end();
      });
    });
    await new Promise((r) => receiver.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${receiver.address().port}/hook`;
      const client = await clientOf(`${server.url}/a2a/default/`);
      const task = await client.sendMessage({ message: userMessage('write a note about pushes') });
      assert.equal(task.status.state, TaskState.TASK_STATE_INPUT_REQUIRED);
      const config = await client.createTaskPushNotificationConfig({ taskId: task.id, id: 'hook', url, token });
      assert.deepEqual([config.id, config.taskId, config.url], ['hook', task.id, url]);
      const listed = await client.listTaskPushNotificationConfig({ taskId: task.id });
      assert.deepEqual(listed.configs.map((c) => c.id), ['hook']);
      const got = await client.getTaskPushNotificationConfig({ taskId: task.id, id: 'hook' });
      assert.equal(got.url, url);

      const call = task.status.message.parts[1].content.value;
      await client.sendMessage({
        message: dataMessage({ call_id: call.call_id, decision: 'deny', reason: 'not now' }, { taskId: task.id, contextId: task.contextId }),
      });
      await until(() => received.some((r) => JSON.parse(r.body).statusUpdate?.status.state === 'TASK_STATE_COMPLETED'), 'the completed push');
      for (const { headers, body } of received) {
        const expected = createHmac('sha256', secret)
          .update(`${headers['webhook-id']}.${headers['webhook-timestamp']}.${body}`)
          .digest('base64');
        assert.equal(headers['webhook-signature'], `v1,${expected}`);
        assert.equal(headers['x-a2a-notification-token'], token);
        assert.equal(headers['webhook-id'], `${task.id}:${JSON.parse(body)[Object.keys(JSON.parse(body))[0]].metadata.tah_seq}`);
      }
      const states = received.map((r) => JSON.parse(r.body).statusUpdate?.status.state).filter(Boolean);
      assert.deepEqual(states, ['TASK_STATE_WORKING', 'TASK_STATE_COMPLETED']);
      await client.deleteTaskPushNotificationConfig({ taskId: task.id, id: 'hook' });
      assert.deepEqual((await client.listTaskPushNotificationConfig({ taskId: task.id })).configs, []);

      // A config given with the message gets its task's updates from the task's start.
      received.length = 0;
      const sent = await client.sendMessage({
        message: userMessage('think: what is here?'),
        configuration: { taskPushNotificationConfig: { id: 'with-send', url, token } },
      });
      assert.equal(sent.status.state, TaskState.TASK_STATE_COMPLETED);
      await until(() => received.some((r) => JSON.parse(r.body).statusUpdate?.status.state === 'TASK_STATE_COMPLETED'), 'the push of a send');
      const kinds = received.map((r) => Object.keys(JSON.parse(r.body))[0]);
      assert.deepEqual(kinds, ['artifactUpdate', 'statusUpdate']);
      assert.ok(received.every((r) => r.headers['webhook-id'].startsWith(`${sent.id}:`)));
    } finally {
      receiver.close();
    }
  });
});

describe('A2A with authentication: keys, tenants, session tokens', () => {
  const server = suiteServer({ extraArgs: ['--api-token', 'operator-token-0123456789'] });

  async function key(tenant) {
    const response = await fetch(`${server.url}/v1/keys`, {
      method: 'POST',
      headers: { authorization: 'Bearer operator-token-0123456789', 'content-type': 'application/json' },
      body: JSON.stringify({ tenant, role: 'member', name: `a2a-${tenant}` }),
    });
    const body = await response.json();
    assert.equal(response.status, 201, JSON.stringify(body));
    return body.key ?? body.secret ?? body.token;
  }

  test("the card says how to authenticate; another tenant's task and context are not found", async () => {
    const anonymous = await fetch(`${server.url}/.well-known/agent-card.json`);
    assert.equal(anonymous.status, 401);
    const acme = await key('acme');
    const globex = await key('globex');
    const client = await clientOf(`${server.url}/a2a/default/`, { token: acme });
    assert.ok(client.agentCard.securitySchemes.bearer);
    const task = await client.sendMessage({ message: userMessage('hello') });
    assert.equal(task.status.state, TaskState.TASK_STATE_COMPLETED);

    for (const transport of ['JSONRPC', 'HTTP+JSON']) {
      const other = await clientOf(`${server.url}/a2a/default/`, { token: globex, transport });
      await assert.rejects(other.getTask({ id: task.id }), { name: 'TaskNotFoundError' });
      await assert.rejects(other.cancelTask({ id: task.id }), { name: 'TaskNotFoundError' });
      await assert.rejects(
        other.sendMessage({ message: userMessage('mine now', { contextId: task.contextId }) }),
        { name: 'TaskNotFoundError' },
      );
      assert.deepEqual((await other.listTasks({})).tasks, []);
    }
    const own = await client.listTasks({});
    assert.deepEqual(own.tasks.map((t) => t.id), [task.id]);
  });
});
