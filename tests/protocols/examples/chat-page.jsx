// A minimal chat page on tah with the Vercel AI SDK's useChat: one tah session is one chat;
// text and reasoning stream in, tool calls show their state, and calls that tah's policy wants
// approved get Allow / Deny buttons (the answer goes back with the next request). The chat
// opens on the session's history, so a reload loses nothing.
//
//   npm install ai@7.0.173 @ai-sdk/react@4.0.177 react@19.3.1 react-dom@19.3.1
import { useChat } from '@ai-sdk/react';
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } from 'ai';
import { useEffect, useState } from 'react';
import { createRoot } from 'react-dom/client';

// const headers = { authorization: `Bearer ${token}` };  // when tah runs with --api-token
const headers = {};

export function TahChat({ server, sessionId }) {
  // The session's history as UI messages: the chat's first messages.
  const [history, setHistory] = useState();
  const [failed, setFailed] = useState();
  useEffect(() => {
    fetch(`${server}/v1/sessions/${sessionId}/ai-sdk/messages`, { headers })
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`history: HTTP ${r.status}`))))
      .then(setHistory, setFailed);
  }, [server, sessionId]);
  if (failed) return <p role="alert">{failed.message}</p>;
  if (!history) return <p>Loading…</p>;
  return <Chat server={server} sessionId={sessionId} history={history} />;
}

function Chat({ server, sessionId, history }) {
  const { messages, sendMessage, addToolApprovalResponse, status, error } = useChat({
    id: sessionId,
    messages: history,
    transport: new DefaultChatTransport({ api: `${server}/v1/sessions/${sessionId}/ai-sdk/chat`, headers }),
    // Once every approval asked is answered, send the answers: the run goes on.
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    // The run in progress, if any, is replayed into its message and followed
    // (GET …/ai-sdk/chat/{id}/stream).
    resume: true,
  });
  const [input, setInput] = useState('');

  return (
    <main>
      {messages.map((message) => (
        <section key={message.id} className={message.role}>
          {message.parts.map((part, i) => {
            if (part.type === 'text') return <p key={i}>{part.text}</p>;
            if (part.type === 'reasoning') return <details key={i}><summary>thinking</summary>{part.text}</details>;
            if (!part.type.startsWith('tool-')) return null;
            return (
              <div key={i} className="tool" data-state={part.state}>
                {part.type.slice('tool-'.length)}: {part.state}
                {part.state === 'approval-requested' && (
                  <>
                    <button onClick={() => addToolApprovalResponse({ id: part.approval.id, approved: true })}>Allow</button>
                    <button onClick={() => addToolApprovalResponse({ id: part.approval.id, approved: false })}>Deny</button>
                  </>
                )}
              </div>
            );
          })}
        </section>
      ))}
      {error && <p role="alert">{error.message}</p>}
      <form
        onSubmit={(e) => {
          e.preventDefault();
          sendMessage({ text: input });
          setInput('');
        }}
      >
        <input value={input} onChange={(e) => setInput(e.target.value)} disabled={status !== 'ready'} />
      </form>
    </main>
  );
}

/** Renders the chat into `element`; returns its React root (`unmount()` takes it away). */
export function mount(element, props) {
  const root = createRoot(element);
  root.render(<TahChat {...props} />);
  return root;
}
