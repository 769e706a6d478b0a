//! The messages a stdio server sends, one a line, each at most [`MAX_MESSAGE`] bytes: what rmcp
//! reads in one line (and its HTTP client in one answer). rmcp drops a longer line and keeps
//! the connection, so the call that line answered would wait for its timeout.
//!
//! [`Limited`] sits between the server's stdout and rmcp. It hands every line on as it comes;
//! a line that proves too long is cut at the limit (rmcp then drops it) and followed by an
//! error answer to the same request, so that call fails at once and says why. It holds no more
//! than one read of the pipe: the request's id is picked out of the line as the line passes.
//! A too-long message that answers nothing (a notification, a request of the server's own) is
//! dropped with a warning.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rmcp::model::ErrorData;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, ReadBuf};

/// The most bytes one message may have: its line, newline included (rmcp's limit).
pub const MAX_MESSAGE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;
/// The key in the `data` of the error answered for a too-long message: its line's length in
/// bytes.
const TOO_LONG: &str = "tah_message_bytes";
/// Bytes read from the pipe at a time.
const READ: usize = 64 * 1024;
/// The longest `id` picked out of a line; a longer one is no id tah sent.
const MAX_ID: usize = 64;

/// A server's stdout with every message longer than [`MAX_MESSAGE`] answered as an error.
pub struct Limited<R> {
    inner: R,
    lines: Lines,
    read: Box<[u8]>,
    /// What is to be handed on, from `handed`.
    out: Vec<u8>,
    handed: usize,
}

impl<R> Limited<R> {
    pub fn new(server: &str, inner: R) -> Limited<R> {
        Limited {
            inner,
            lines: Lines::new(server, MAX_MESSAGE),
            read: vec![0; READ].into_boxed_slice(),
            out: Vec::new(),
            handed: 0,
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Limited<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.handed < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.handed);
                buf.put_slice(&this.out[this.handed..this.handed + n]);
                this.handed += n;
                return Poll::Ready(Ok(()));
            }
            this.out.clear();
            this.handed = 0;
            let mut read = ReadBuf::new(&mut this.read);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // The end of the pipe.
                return Poll::Ready(Ok(()));
            }
            this.lines.push(read.filled(), &mut this.out);
        }
    }
}

/// The length in bytes of a call's answer that was too long, if `error` is the one [`Limited`]
/// made for it.
pub fn too_long(error: &ErrorData) -> Option<u64> {
    error.data.as_ref()?.get(TOO_LONG)?.as_u64()
}

/// Where the stream of lines is: how long the current line is so far, and what of it was read.
struct Lines {
    server: String,
    /// The most bytes of a line, its newline included.
    max: usize,
    /// Bytes of the current line so far, without its newline (past `max`, not handed on).
    len: usize,
    fields: Fields,
}

impl Lines {
    fn new(server: &str, max: usize) -> Lines {
        Lines {
            server: server.to_string(),
            max,
            len: 0,
            fields: Fields::default(),
        }
    }

    /// Hands `input` on to `out`, each line whole while it is at most `max` bytes with its
    /// newline; a longer one is cut after `max` bytes and its newline added (more than rmcp
    /// reads, so it drops it), then the error answer to its request follows.
    fn push(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        while !input.is_empty() {
            let end = input.iter().position(|b| *b == b'\n');
            let piece = &input[..end.unwrap_or(input.len())];
            self.fields.read(piece);
            let room = self.max.saturating_sub(self.len);
            out.extend_from_slice(&piece[..piece.len().min(room)]);
            self.len += piece.len();
            let Some(end) = end else {
                return;
            };
            out.push(b'\n');
            if self.len >= self.max {
                self.refuse(out);
            }
            self.len = 0;
            self.fields = Fields::default();
            input = &input[end + 1..];
        }
    }

    /// After a line longer than `max`: the error answer to its request.
    fn refuse(&self, out: &mut Vec<u8>) {
        let bytes = self.len + 1;
        let id = match (self.fields.method, self.fields.id()) {
            (false, Some(id)) => id,
            _ => {
                tracing::warn!(server = %self.server, bytes, max = self.max, "an MCP server sent a message longer than tah reads; it answered no call and is dropped");
                return;
            }
        };
        tracing::warn!(server = %self.server, bytes, max = self.max, "an MCP server answered a call with a message longer than tah reads; the call fails");
        let answer = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": -32603,
                "message": format!(
                    "the answer is a line of {bytes} bytes, more than the {} bytes of one MCP \
                     message",
                    self.max
                ),
                "data": { TOO_LONG: bytes },
            },
        });
        if let Ok(line) = serde_json::to_vec(&answer) {
            out.extend_from_slice(&line);
            out.push(b'\n');
        }
    }
}

/// What is known of a message's top-level object while its line passes: its `id` (raw JSON
/// text) and whether it has a `method` (a request or notification, not an answer).
#[derive(Default)]
struct Fields {
    /// Nesting of objects and arrays.
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a key.
    expect_key: bool,
    /// The top-level key being read, or last read (its first bytes).
    key: Vec<u8>,
    reading_key: bool,
    /// The raw text of the `id` value, while and after it is read.
    id: Vec<u8>,
    reading_id: bool,
    /// The id is longer than [`MAX_ID`]: no id tah sent.
    id_too_long: bool,
    method: bool,
}

impl Fields {
    fn read(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        if self.reading_id && !(self.depth == 1 && !self.in_string && matches!(b, b',' | b'}')) {
            self.keep_id(b);
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                self.reading_key = false;
            } else if self.reading_key && self.key.len() < 8 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.key.clear();
                    self.reading_key = true;
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                self.expect_key = self.depth == 1 && b == b'{';
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.reading_id = false;
                }
            }
            b':' if self.depth == 1 => {
                self.expect_key = false;
                match self.key.as_slice() {
                    b"id" => {
                        self.id.clear();
                        self.reading_id = true;
                    }
                    b"method" => self.method = true,
                    _ => {}
                }
            }
            b',' if self.depth == 1 => {
                self.expect_key = true;
                self.reading_id = false;
            }
            _ => {}
        }
    }

    fn keep_id(&mut self, b: u8) {
        if self.id.len() < MAX_ID {
            self.id.push(b);
        } else {
            self.id_too_long = true;
        }
    }

    /// The message's `id`, when it is one tah could have sent (a string or an integer).
    fn id(&self) -> Option<Value> {
        if self.id_too_long {
            return None;
        }
        match serde_json::from_slice::<Value>(&self.id).ok()? {
            Value::String(id) => Some(Value::String(id)),
            Value::Number(id) if id.is_i64() || id.is_u64() => Some(Value::Number(id)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// What `input` becomes with lines of at most `max` bytes, pushed in pieces of `step`.
    fn limited(input: &[u8], max: usize, step: usize) -> Vec<Value> {
        let mut lines = Lines::new("test", max);
        let mut out = Vec::new();
        for piece in input.chunks(step) {
            lines.push(piece, &mut out);
        }
        out.split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_slice(line).unwrap_or(Value::Null))
            .collect()
    }

    fn answer(id: &str, text: &str) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"text":"{text}"}}}}"#) + "\n"
    }

    #[test]
    fn lines_within_the_limit_pass_whole() {
        let input = answer("1", "short") + &answer("\"b\"", "also short");
        for step in [1, 7, input.len()] {
            let mut lines = Lines::new("test", 64);
            let mut out = Vec::new();
            for piece in input.as_bytes().chunks(step) {
                lines.push(piece, &mut out);
            }
            assert_eq!(out, input.as_bytes(), "in pieces of {step}");
        }
    }

    #[test]
    fn a_long_answer_becomes_an_error_to_its_request_wherever_its_id_is() {
        let long = "x".repeat(100);
        let id_last =
            format!(r#"{{"result":{{"text":"{long}","id":7}},"jsonrpc":"2.0","id":"req-\"9\""}}"#)
                + "\n";
        for input in [answer("42", &long), id_last] {
            for step in [1, 10, input.len()] {
                let seen = limited(input.as_bytes(), 64, step);
                // The cut line is not JSON (rmcp drops it); the error answer follows it.
                assert_eq!(seen.len(), 2, "{seen:?}");
                assert_eq!(seen[0], Value::Null);
                let error = &seen[1]["error"];
                assert_eq!(error["data"][TOO_LONG], input.len());
                assert!(error["message"].as_str().unwrap_or("").contains("64 bytes"));
            }
        }
        assert_eq!(limited(answer("42", &long).as_bytes(), 64, 5)[1]["id"], 42);
        let seen = limited(
            format!(r#"{{"result":{{"text":"{long}","id":7}},"id":"req-\"9\""}}"#).as_bytes(),
            64,
            3,
        );
        assert_eq!(
            seen,
            [Value::Null],
            "no newline yet: the cut line, and nothing after it"
        );
    }

    #[test]
    fn exactly_at_the_limit_passes_and_one_more_is_refused() {
        let fits = answer("1", &"x".repeat(64 - answer("1", "").len()));
        assert_eq!(fits.len(), 64, "with its newline");
        assert_eq!(limited(fits.as_bytes(), 64, 9)[0]["id"], 1);
        let over = answer("1", &"x".repeat(64 - answer("1", "").len() + 1));
        let seen = limited(over.as_bytes(), 64, 9);
        assert_eq!(seen[1]["error"]["data"][TOO_LONG], 65);
    }

    #[test]
    fn a_long_request_or_notification_is_dropped_without_an_answer() {
        let long = "x".repeat(100);
        let request = format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{{"t":"{long}"}}}}"#
        ) + "\n";
        let notification = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"t":"{long}"}}}}"#
        ) + "\n";
        for input in [request, notification] {
            assert_eq!(limited(input.as_bytes(), 64, 11), [Value::Null]);
        }
        // And the next line is whole again.
        let next = answer("5", "fine");
        let input = format!(r#"{{"id":1,"method":"x","params":"{long}"}}"#) + "\n" + &next;
        assert_eq!(limited(input.as_bytes(), 64, 4)[1]["id"], 5);
    }

    #[tokio::test]
    async fn the_reader_hands_on_what_the_lines_make() {
        let long = "x".repeat(MAX_MESSAGE);
        let input = answer("1", "before") + &answer("2", &long) + &answer("3", "after");
        let mut reader = Limited::new("test", input.as_bytes());
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.expect("read");
        let lines: Vec<&[u8]> = out.split(|b| *b == b'\n').collect();
        assert_eq!(lines.len(), 5, "four lines and the end");
        assert_eq!(
            lines[1].len(),
            MAX_MESSAGE,
            "cut: with its newline, one byte too long"
        );
        let refused: Value = serde_json::from_slice(lines[2]).expect("JSON");
        assert_eq!(refused["id"], 2);
        let error: ErrorData = serde_json::from_value(refused["error"].clone()).expect("error");
        assert_eq!(too_long(&error), Some(answer("2", &long).len() as u64));
        assert_eq!(lines[3], answer("3", "after").trim_end().as_bytes());
    }

    #[tokio::test]
    async fn rmcp_reads_a_line_that_just_fits_and_the_error_for_one_byte_more() {
        use rmcp::model::{JsonRpcMessage, NumberOrString};
        use rmcp::transport::async_rw::AsyncRwTransport;
        use rmcp::transport::Transport;
        // A tool's answer whose line is `len` bytes, its newline included.
        let line = |id: u32, len: usize| {
            let head = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":""#
            );
            let tail = r#""}]}}"#;
            let text = "x".repeat(len - head.len() - tail.len() - 1);
            format!("{head}{text}{tail}\n")
        };
        let input = line(1, MAX_MESSAGE) + &line(2, MAX_MESSAGE + 1) + &line(3, 100);
        let reader = Limited::new("test", std::io::Cursor::new(input.into_bytes()));
        let mut transport =
            AsyncRwTransport::<rmcp::RoleClient, _, _>::new(reader, tokio::io::sink());
        match transport.receive().await {
            Some(JsonRpcMessage::Response(answer)) => {
                assert_eq!(answer.id, NumberOrString::Number(1))
            }
            other => panic!("the line that fits: {other:?}"),
        }
        match transport.receive().await {
            Some(JsonRpcMessage::Error(refused)) => {
                assert_eq!(refused.id, Some(NumberOrString::Number(2)));
                assert_eq!(too_long(&refused.error), Some(MAX_MESSAGE as u64 + 1));
            }
            other => panic!("the line one byte too long: {other:?}"),
        }
        match transport.receive().await {
            Some(JsonRpcMessage::Response(answer)) => {
                assert_eq!(answer.id, NumberOrString::Number(3))
            }
            other => panic!("the line after: {other:?}"),
        }
    }
}
