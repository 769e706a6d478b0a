//! The subscribers' SSE client, made cheap so that the load generator takes as little as it can
//! of the CPUs it shares with the server: one TCP connection per stream, the `GET` written by
//! hand, the chunked body decoded in place, and each event handed over as borrowed slices of
//! one buffer (no allocation per event). It parses what the SSE format allows (fields with or
//! without the space after the colon, comments, `\n`, `\r\n` or `\r` line ends, data split over
//! several lines) and what HTTP/1.1 gives a streamed body (chunked, or read to the close).

use anyhow::{anyhow, bail, Context as _};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The response head may be at most this long.
const MAX_HEAD: usize = 16 * 1024;
/// Bytes read per `read` at most.
const READ: usize = 16 * 1024;

/// One event of the stream, borrowed from the parser's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The `id` field as sent (the last one seen on the stream, as the format says).
    pub id: &'a str,
    /// The `event` field (`message` when the event has none).
    pub event: &'a str,
    /// The `data` lines joined by `\n`.
    pub data: &'a str,
}

/// An SSE event stream over one HTTP/1.1 response.
pub struct SseStream {
    tcp: TcpStream,
    body: BodyDecoder,
    parser: SseParser,
    raw: Vec<u8>,
}

/// Where `base` (`http://host:port[/prefix]`) is, as `host:port`, and its path prefix.
fn split_base(base: &str) -> anyhow::Result<(&str, &str)> {
    let rest = base
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("the subscribers speak plain http://, not {base}"))?;
    Ok(match rest.find('/') {
        Some(slash) => (&rest[..slash], rest[slash..].trim_end_matches('/')),
        None => (rest, ""),
    })
}

impl SseStream {
    /// Opens `GET {base}{path}` as an event stream (with `Last-Event-ID` when `after` > 0) and
    /// reads its head: fails unless the answer is `200`.
    pub async fn open(
        base: &str,
        path: &str,
        token: Option<&str>,
        after: i64,
    ) -> anyhow::Result<SseStream> {
        let (host, prefix) = split_base(base)?;
        let mut tcp = TcpStream::connect(host)
            .await
            .with_context(|| format!("connecting to {host}"))?;
        tcp.set_nodelay(true)?;
        let mut request =
            format!("GET {prefix}{path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n");
        if let Some(token) = token {
            request.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        if after > 0 {
            request.push_str(&format!("Last-Event-ID: {after}\r\n"));
        }
        request.push_str("\r\n");
        tcp.write_all(request.as_bytes()).await?;

        let mut raw = Vec::with_capacity(READ);
        let head_end = loop {
            if let Some(end) = find(&raw, b"\r\n\r\n") {
                break end + 4;
            }
            if raw.len() > MAX_HEAD {
                bail!("GET {path}: a response head of over {MAX_HEAD} bytes");
            }
            if read_more(&mut tcp, &mut raw).await? == 0 {
                bail!("GET {path}: the connection closed before the response head");
            }
        };
        let head = std::str::from_utf8(&raw[..head_end])
            .map_err(|_| anyhow!("GET {path}: a response head that is not UTF-8"))?;
        let status = head.split(' ').nth(1).unwrap_or("");
        let body = BodyDecoder::for_head(head);
        if status != "200" {
            let start: String = String::from_utf8_lossy(&raw[head_end..])
                .chars()
                .take(300)
                .collect();
            bail!("GET {path} (SSE): HTTP {status}: {start}");
        }
        raw.drain(..head_end);
        let mut stream = SseStream {
            tcp,
            body,
            parser: SseParser::default(),
            raw,
        };
        stream.decode();
        Ok(stream)
    }

    /// Waits for more of the stream, then hands each complete event to `on_event`. Returns
    /// `false` once the body has ended (the server closed the stream). Cancel-safe: a read
    /// that is dropped before it completes loses nothing.
    pub async fn read(&mut self, on_event: &mut impl FnMut(SseEvent<'_>)) -> anyhow::Result<bool> {
        self.parser.events(on_event)?;
        if self.body.done {
            return Ok(false);
        }
        let n = read_more(&mut self.tcp, &mut self.raw).await?;
        if n == 0 {
            // Closed: a chunked body closed before its last chunk ended early too.
            self.body.done = true;
        }
        self.decode();
        self.parser.events(on_event)?;
        Ok(!self.body.done)
    }

    /// Moves the body's bytes from `raw` to the parser.
    fn decode(&mut self) {
        let used = self.body.decode(&self.raw, &mut self.parser.text);
        self.raw.drain(..used);
    }
}

async fn read_more(tcp: &mut TcpStream, raw: &mut Vec<u8>) -> std::io::Result<usize> {
    raw.reserve(READ);
    tcp.read_buf(raw).await
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// Decodes a response body: chunked, or everything up to the close.
#[derive(Debug)]
struct BodyDecoder {
    chunked: bool,
    /// Bytes left in the current chunk (chunked bodies).
    left: usize,
    /// The `\r\n` after a chunk's data is still to be skipped.
    trailer: bool,
    done: bool,
}

impl BodyDecoder {
    fn for_head(head: &str) -> BodyDecoder {
        let chunked = head.lines().any(|line| {
            line.split_once(':').is_some_and(|(name, value)| {
                name.trim().eq_ignore_ascii_case("transfer-encoding")
                    && value.to_ascii_lowercase().contains("chunked")
            })
        });
        BodyDecoder {
            chunked,
            left: 0,
            trailer: false,
            done: false,
        }
    }

    /// Appends the body bytes found in `raw` to `out`; returns how many bytes of `raw` were
    /// used (what is left is an incomplete chunk header, to be completed by the next read).
    fn decode(&mut self, raw: &[u8], out: &mut Vec<u8>) -> usize {
        if !self.chunked {
            out.extend_from_slice(raw);
            return raw.len();
        }
        let mut at = 0;
        while at < raw.len() && !self.done {
            if self.left > 0 {
                let take = self.left.min(raw.len() - at);
                out.extend_from_slice(&raw[at..at + take]);
                at += take;
                self.left -= take;
                if self.left == 0 {
                    self.trailer = true;
                }
                continue;
            }
            let Some(line_end) = find(&raw[at..], b"\r\n") else {
                break;
            };
            let line = &raw[at..at + line_end];
            at += line_end + 2;
            if self.trailer {
                // The empty line that closes a chunk's data.
                self.trailer = false;
                continue;
            }
            let digits = line
                .iter()
                .take_while(|b| b.is_ascii_hexdigit())
                .fold(0usize, |n, b| {
                    n.saturating_mul(16)
                        .saturating_add((*b as char).to_digit(16).unwrap_or(0) as usize)
                });
            if digits == 0 {
                self.done = true;
            }
            self.left = digits;
        }
        at
    }
}

/// The SSE format's line parser, over the decoded body.
#[derive(Debug, Default)]
struct SseParser {
    /// Decoded body not parsed yet (an incomplete line at most, after [`SseParser::events`]).
    text: Vec<u8>,
    id: String,
    event: String,
    data: String,
    /// The event being built has at least one `data` field.
    has_data: bool,
    /// The previous line ended in `\r`: a `\n` right after it belongs to it.
    after_cr: bool,
}

impl SseParser {
    /// Parses every complete line of `text`, handing each complete event to `on_event`.
    fn events(&mut self, on_event: &mut impl FnMut(SseEvent<'_>)) -> anyhow::Result<()> {
        let text = std::mem::take(&mut self.text);
        let mut at = 0;
        while at < text.len() {
            if self.after_cr && text[at] == b'\n' {
                self.after_cr = false;
                at += 1;
                continue;
            }
            let Some(len) = memchr::memchr2(b'\n', b'\r', &text[at..]) else {
                break;
            };
            self.after_cr = text[at + len] == b'\r';
            let line = std::str::from_utf8(&text[at..at + len])
                .map_err(|_| anyhow!("an SSE line that is not UTF-8"))?;
            at += len + 1;
            self.line(line, on_event);
        }
        self.text = text;
        self.text.drain(..at);
        Ok(())
    }

    fn line(&mut self, line: &str, on_event: &mut impl FnMut(SseEvent<'_>)) {
        if line.is_empty() {
            if self.has_data {
                on_event(SseEvent {
                    id: &self.id,
                    event: if self.event.is_empty() {
                        "message"
                    } else {
                        &self.event
                    },
                    data: &self.data,
                });
            }
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line.starts_with(':') {
            return; // a comment (heartbeats)
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "id" if !value.contains('\0') => {
                self.id.clear();
                self.id.push_str(value);
            }
            "event" => {
                self.event.clear();
                self.event.push_str(value);
            }
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {} // `retry` and unknown fields
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `body` (already decoded) fed in pieces of `step` bytes.
    fn parse(body: &[u8], step: usize) -> Vec<(String, String, String)> {
        let mut parser = SseParser::default();
        let mut seen = Vec::new();
        for piece in body.chunks(step) {
            parser.text.extend_from_slice(piece);
            parser
                .events(&mut |e: SseEvent<'_>| {
                    seen.push((e.id.to_string(), e.event.to_string(), e.data.to_string()))
                })
                .expect("valid UTF-8");
        }
        seen
    }

    #[test]
    fn events_are_parsed_across_any_split() {
        let body = "retry: 1000\n\nid: 1\nevent: a\ndata: {\"x\":\"⏱12⏱ é\"}\n\n: heartbeat\n\n\
                    id:2\r\nevent:b\r\ndata: one\r\ndata:two\r\n\r\nid: 3\rdata: plain\r\r";
        let expected = vec![
            ("1".into(), "a".into(), "{\"x\":\"⏱12⏱ é\"}".into()),
            ("2".into(), "b".into(), "one\ntwo".into()),
            ("3".into(), "message".into(), "plain".into()),
        ];
        for step in [1, 2, 3, 7, body.len()] {
            assert_eq!(
                parse(body.as_bytes(), step),
                expected,
                "split every {step} bytes"
            );
        }
    }

    #[test]
    fn chunked_bodies_are_decoded_across_any_split() {
        let chunks = [
            "retry: 1000\n\n",
            "id: 1\ndata: ⏱5⏱\n\n",
            "id: 2\ndata: x\n\n",
        ];
        let mut raw = Vec::new();
        for chunk in chunks {
            raw.extend_from_slice(format!("{:X};ext=1\r\n{chunk}\r\n", chunk.len()).as_bytes());
        }
        raw.extend_from_slice(b"0\r\n\r\n");
        for step in [1, 2, 5, 11, raw.len()] {
            let mut decoder =
                BodyDecoder::for_head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked");
            let mut pending = Vec::new();
            let mut out = Vec::new();
            for piece in raw.chunks(step) {
                pending.extend_from_slice(piece);
                let used = decoder.decode(&pending, &mut out);
                pending.drain(..used);
            }
            assert!(
                decoder.done,
                "the last chunk ends the body (split every {step})"
            );
            assert_eq!(
                String::from_utf8(out).ok(),
                Some(chunks.concat()),
                "split every {step}"
            );
        }
    }

    #[test]
    fn a_body_without_chunks_is_read_as_it_comes() {
        let mut decoder =
            BodyDecoder::for_head("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream");
        let mut out = Vec::new();
        assert_eq!(decoder.decode(b"id: 1\n", &mut out), 6);
        assert_eq!(out, b"id: 1\n");
        assert!(!decoder.done);
    }

    #[test]
    fn bases_are_split_into_address_and_prefix() {
        assert_eq!(
            split_base("http://127.0.0.1:8081").ok(),
            Some(("127.0.0.1:8081", ""))
        );
        assert_eq!(split_base("http://h:1/tah/").ok(), Some(("h:1", "/tah")));
        assert!(split_base("https://h:1").is_err());
    }
}
