//! What the real providers' replies are held to before anything of them reaches the loop,
//! the store or a log: size limits (a hostile or broken endpoint cannot grow memory or the
//! database without bound), the removal of secrets from everything a provider sends back, and
//! the repair of UTF-16 surrogate pairs that a provider split across two chunks.

use std::borrow::Cow;

use reqwest::Url;

use super::ModelReply;

/// Bounds on one model reply, as it arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyLimits {
    /// Bytes of one attempt's response body (the provider's event stream).
    pub max_reply_bytes: usize,
    /// Bytes of one line of that stream.
    pub max_line_bytes: usize,
    /// Tool calls in one reply.
    pub max_tool_calls: usize,
    /// Bytes of one tool call's arguments (as JSON).
    pub max_argument_bytes: usize,
}

impl Default for ReplyLimits {
    fn default() -> ReplyLimits {
        ReplyLimits {
            max_reply_bytes: 8 * 1024 * 1024,
            max_line_bytes: 1024 * 1024,
            max_tool_calls: 64,
            max_argument_bytes: 1024 * 1024,
        }
    }
}

impl ReplyLimits {
    /// Why a complete reply is refused, if it is.
    pub fn check(&self, reply: &ModelReply) -> Result<(), String> {
        if reply.tool_calls.len() > self.max_tool_calls {
            return Err(format!(
                "the reply asked for {} tool calls; at most {} are allowed per reply \
                 (--max-tool-calls)",
                reply.tool_calls.len(),
                self.max_tool_calls
            ));
        }
        for call in &reply.tool_calls {
            let bytes = match &call.arguments {
                serde_json::Value::String(raw) => raw.len(),
                other => other.to_string().len(),
            };
            if bytes > self.max_argument_bytes {
                return Err(format!(
                    "the arguments of tool call {:?} are {bytes} bytes; at most {} are allowed \
                     (--max-tool-argument-bytes)",
                    call.name, self.max_argument_bytes
                ));
            }
        }
        Ok(())
    }
}

/// Counts the bytes of a response body as it streams, against [`ReplyLimits`].
#[derive(Debug, Default)]
pub struct BodyMeter {
    received: usize,
    since_newline: usize,
}

impl BodyMeter {
    /// Adds a chunk; says which limit it broke, if any.
    pub fn add(&mut self, chunk: &[u8], limits: &ReplyLimits) -> Result<(), String> {
        self.received = self.received.saturating_add(chunk.len());
        match chunk.iter().rposition(|&b| b == b'\n' || b == b'\r') {
            Some(at) => self.since_newline = chunk.len() - at - 1,
            None => self.since_newline = self.since_newline.saturating_add(chunk.len()),
        }
        if self.received > limits.max_reply_bytes {
            return Err(format!(
                "the reply is larger than {} bytes (--max-reply-bytes)",
                limits.max_reply_bytes
            ));
        }
        if self.since_newline > limits.max_line_bytes {
            return Err(format!(
                "a line of the event stream is longer than {} bytes (--max-sse-line-bytes)",
                limits.max_line_bytes
            ));
        }
        Ok(())
    }
}

/// The secrets a provider client knows (its API key, credentials in its base URL), to be
/// removed from every text that came from the provider or names its endpoint.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    values: Vec<String>,
}

const REDACTED: &str = "[redacted]";

/// The shortest header value scrubbed as a secret.
pub const MIN_HEADER_SECRET: usize = 8;

impl Secrets {
    pub fn new(api_key: Option<&str>, base_url: &str) -> Secrets {
        let mut values: Vec<String> = api_key
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .into_iter()
            .collect();
        if let Ok(url) = Url::parse(base_url.trim()) {
            if let Some(password) = url.password().filter(|p| !p.is_empty()) {
                values.push(password.to_string());
                if let Ok(decoded) = urlencoding_decode(password) {
                    values.push(decoded);
                }
            }
            if !url.username().is_empty() {
                values.push(format!("{}:", url.username()));
            }
        }
        // Longest first, so a secret containing another is removed whole.
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Secrets { values }
    }

    /// These secrets and the values of configured headers. A value shorter than
    /// [`MIN_HEADER_SECRET`] is left out: scrubbing `1` or `eu` would mangle any text and hide
    /// nothing worth hiding.
    pub fn and_header_values<'a>(mut self, values: impl IntoIterator<Item = &'a str>) -> Secrets {
        self.values.extend(
            values
                .into_iter()
                .map(str::trim)
                .filter(|v| v.len() >= MIN_HEADER_SECRET)
                .map(str::to_string),
        );
        self.values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        self.values.dedup();
        self
    }

    /// `text` without any known secret and without bearer tokens.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in &self.values {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), REDACTED);
            }
        }
        scrub_bearer(&out).into_owned()
    }
}

/// Percent-decoding of a URL's userinfo (`p%40ss` → `p@ss`).
fn urlencoding_decode(text: &str) -> Result<String, std::string::FromUtf8Error> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
}

/// Replaces the token after every `Bearer ` (any case) with `[redacted]`.
fn scrub_bearer(text: &str) -> Cow<'_, str> {
    const SCHEME: &str = "bearer ";
    let lower = text.to_ascii_lowercase();
    if !lower.contains(SCHEME) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    let mut from = 0;
    while let Some(found) = lower[from..].find(SCHEME) {
        let start = from + found + SCHEME.len();
        let token_end = text[start..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';' | '}'))
            .map_or(text.len(), |n| start + n);
        if token_end > start {
            out.push_str(&text[rest..start]);
            out.push_str(REDACTED);
            rest = token_end;
        }
        from = token_end.max(start);
    }
    out.push_str(&text[rest..]);
    Cow::Owned(out)
}

/// A URL as it may be shown in a log line or an error: its scheme, host and port, and `/…` in
/// place of anything after them. A user name and password, a path and a query may all hold a
/// credential (`user:pass@`, a webhook's token in its path, `?key=`), so none of them is shown.
pub fn shown_url(url: &Url) -> String {
    let origin = url.origin().ascii_serialization();
    let elided = url.path() != "/" || url.query().is_some() || url.fragment().is_some();
    match elided {
        true => format!("{origin}/…"),
        false => origin,
    }
}

// Lone surrogates. JSON may encode a character outside the Basic Multilingual Plane as a pair
// of `\uXXXX` escapes; a provider that cuts its text between the two sends each half in its own
// chunk, and neither half alone is valid. Before a chunk is parsed, every lone half is written
// as a stand-in character from the last 2,048 code points of Plane 16 (private use); the text
// of one stream is then passed through a [`Utf16Joiner`], which turns a high half followed by a
// low half back into the character and any other stand-in into U+FFFD.

const STAND_IN_BASE: u32 = 0x10_F800;

fn stand_in(unit: u16) -> char {
    // 0xD800..=0xDFFF maps onto 0x10F800..=0x10FFFF, all valid scalar values.
    char::from_u32(STAND_IN_BASE + u32::from(unit - 0xD800)).unwrap_or('\u{FFFD}')
}

fn unit_of(c: char) -> Option<u16> {
    let cp = c as u32;
    (cp >= STAND_IN_BASE).then(|| (cp - STAND_IN_BASE) as u16 + 0xD800)
}

fn is_high(unit: u16) -> bool {
    (0xD800..=0xDBFF).contains(&unit)
}

fn is_low(unit: u16) -> bool {
    (0xDC00..=0xDFFF).contains(&unit)
}

/// The JSON text with each lone surrogate escape replaced by its stand-in character.
pub fn escape_lone_surrogates(json: &str) -> Cow<'_, str> {
    let bytes = json.as_bytes();
    let escape_at = |i: usize| -> Option<u16> {
        if bytes.get(i) != Some(&b'\\') || bytes.get(i + 1) != Some(&b'u') {
            return None;
        }
        let hex = json.get(i + 2..i + 6)?;
        u16::from_str_radix(hex, 16).ok()
    };
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(unit) = escape_at(i) else {
            // `\\`, `\"` and the like: skip both bytes so an escaped backslash is not read as
            // the start of an escape.
            i += 2;
            continue;
        };
        if is_high(unit) && escape_at(i + 6).is_some_and(is_low) {
            i += 12;
            continue;
        }
        if is_high(unit) || is_low(unit) {
            let text = out.get_or_insert_with(|| String::with_capacity(json.len()));
            text.push_str(&json[copied..i]);
            text.push(stand_in(unit));
            copied = i + 6;
        }
        i += 6;
    }
    match out {
        Some(mut text) => {
            text.push_str(&json[copied..]);
            Cow::Owned(text)
        }
        None => Cow::Borrowed(json),
    }
}

/// Joins the surrogate halves of one text stream (see [`escape_lone_surrogates`]); a high half
/// at the end of a piece waits for the next piece.
#[derive(Debug, Default)]
pub struct Utf16Joiner {
    pending: Option<u16>,
}

impl Utf16Joiner {
    /// The piece with its halves joined; a trailing high half is held back.
    pub fn push<'a>(&mut self, piece: &'a str) -> Cow<'a, str> {
        // Stand-ins are encoded as F4 8F A0..BF ..: without an F4 byte there is none.
        if self.pending.is_none() && !piece.as_bytes().contains(&0xF4) {
            return Cow::Borrowed(piece);
        }
        let mut out = String::with_capacity(piece.len());
        for c in piece.chars() {
            match unit_of(c) {
                Some(unit) if is_high(unit) => {
                    if self.pending.replace(unit).is_some() {
                        out.push('\u{FFFD}');
                    }
                }
                Some(low) => match self.pending.take() {
                    Some(high) => {
                        let cp = 0x1_0000
                            + ((u32::from(high) - 0xD800) << 10)
                            + (u32::from(low) - 0xDC00);
                        out.push(char::from_u32(cp).unwrap_or('\u{FFFD}'));
                    }
                    None => out.push('\u{FFFD}'),
                },
                None => {
                    if self.pending.take().is_some() {
                        out.push('\u{FFFD}');
                    }
                    out.push(c);
                }
            }
        }
        Cow::Owned(out)
    }

    /// What is left at the end of the stream: a high half that never got its low half.
    pub fn finish(&mut self) -> &'static str {
        match self.pending.take() {
            Some(_) => "\u{FFFD}",
            None => "",
        }
    }
}

/// A whole text with its halves joined.
pub fn join_halves(text: &str) -> String {
    let mut joiner = Utf16Joiner::default();
    let mut out = joiner.push(text).into_owned();
    out.push_str(joiner.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolCall;

    fn parsed(json: &str) -> String {
        let value: serde_json::Value =
            serde_json::from_str(&escape_lone_surrogates(json)).expect("valid JSON");
        value["t"].as_str().expect("a string").to_string()
    }

    #[test]
    fn a_pair_split_across_chunks_is_joined() {
        let mut joiner = Utf16Joiner::default();
        let first = parsed(r#"{"t":"smile \ud83d"}"#);
        let second = parsed(r#"{"t":"\ude00 done"}"#);
        let mut text = joiner.push(&first).into_owned();
        assert_eq!(text, "smile ");
        text.push_str(&joiner.push(&second));
        text.push_str(joiner.finish());
        assert_eq!(text, "smile 😀 done");
    }

    #[test]
    fn whole_pairs_and_escaped_backslashes_are_left_alone() {
        let json = r#"{"t":"\ud83d\ude00 and \\ud83d"}"#;
        assert!(matches!(escape_lone_surrogates(json), Cow::Borrowed(_)));
        assert_eq!(parsed(json), "😀 and \\ud83d");
    }

    #[test]
    fn lone_halves_become_replacement_characters() {
        assert_eq!(join_halves(&parsed(r#"{"t":"a\ude00b"}"#)), "a\u{FFFD}b");
        assert_eq!(join_halves(&parsed(r#"{"t":"a\ud83db"}"#)), "a\u{FFFD}b");
        assert_eq!(join_halves(&parsed(r#"{"t":"end\ud83d"}"#)), "end\u{FFFD}");
        assert_eq!(
            join_halves(&parsed(r#"{"t":"\ud83d\ud83d\ude00"}"#)),
            "\u{FFFD}😀"
        );
    }

    #[test]
    fn text_without_stand_ins_is_borrowed() {
        let mut joiner = Utf16Joiner::default();
        assert!(matches!(joiner.push("héllo 世界 🦀"), Cow::Borrowed(_)));
    }

    #[test]
    fn secrets_and_bearer_tokens_are_scrubbed() {
        let secrets = Secrets::new(Some("sk-live-123"), "https://bob:p%40ss@llm.example/v1");
        let text = "key sk-live-123, auth Bearer abc.def, url https://bob:p%40ss@llm.example \
                    and p@ss; BEARER xyz";
        let clean = secrets.scrub(text);
        for leaked in ["sk-live-123", "abc.def", "p%40ss", "p@ss", "bob:", "xyz"] {
            assert!(!clean.contains(leaked), "{leaked} in {clean}");
        }
        assert!(clean.contains("Bearer [redacted]"), "{clean}");
        let headers = Secrets::new(None, "http://h").and_header_values(["org-0123456789", "eu"]);
        assert_eq!(
            headers.scrub("org-0123456789 in eu"),
            "[redacted] in eu",
            "short values are kept"
        );
    }

    #[test]
    fn shown_urls_carry_no_credentials() {
        let shown = |url: &str| shown_url(&Url::parse(url).unwrap());
        assert_eq!(
            shown("http://user:pass@host:8080/v1/chat"),
            "http://host:8080/…"
        );
        assert_eq!(
            shown("https://hooks.example/services/T0/B0/s3cr3t?token=t0k3n#x"),
            "https://hooks.example/…"
        );
        assert_eq!(shown("https://user@host:443/"), "https://host");
        assert_eq!(shown("http://[::1]:9/?key=k"), "http://[::1]:9/…");
    }

    #[test]
    fn the_meter_counts_bytes_and_line_lengths() {
        let limits = ReplyLimits {
            max_reply_bytes: 100,
            max_line_bytes: 10,
            ..ReplyLimits::default()
        };
        let mut meter = BodyMeter::default();
        assert!(meter.add(b"data: 1\n", &limits).is_ok());
        assert!(meter.add(b"data: ", &limits).is_ok());
        let error = meter.add(b"12345", &limits).unwrap_err();
        assert!(error.contains("--max-sse-line-bytes"), "{error}");
        let mut meter = BodyMeter::default();
        for _ in 0..12 {
            let _ = meter.add(b"data: 1\n", &limits);
        }
        let error = meter.add(b"data: 1\n", &limits).unwrap_err();
        assert!(error.contains("--max-reply-bytes"), "{error}");
    }

    #[test]
    fn replies_over_the_call_limits_are_refused() {
        let limits = ReplyLimits {
            max_tool_calls: 2,
            max_argument_bytes: 10,
            ..ReplyLimits::default()
        };
        let call = |args: serde_json::Value| ToolCall {
            id: "c".into(),
            name: "read_file".into(),
            arguments: args,
        };
        let reply = |calls| ModelReply {
            tool_calls: calls,
            ..ModelReply::default()
        };
        assert!(limits
            .check(&reply(vec![call(serde_json::json!({}))]))
            .is_ok());
        let three = vec![call(serde_json::json!({})); 3];
        assert!(limits
            .check(&reply(three))
            .unwrap_err()
            .contains("3 tool calls"));
        let big = vec![call(serde_json::json!({"path": "a-long-path.txt"}))];
        assert!(limits.check(&reply(big)).unwrap_err().contains("bytes"));
    }
}
