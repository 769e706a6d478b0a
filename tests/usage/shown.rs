//! How an answer is shown in the manual: JSON exactly as the server wrote it (key order
//! included, which `serde_json::Value` would sort), with chosen fields left out as `…`; SSE
//! frames as curl prints them, their `data:` shortened the same way; and the comparison of a
//! shown block with what the server answered, blind only to ids and times.

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

/// A JSON value that keeps its keys in the order they were written.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Object(Vec<(String, Json)>),
    Array(Vec<Json>),
    Scalar(Value),
    /// Something left out, shown as `…`.
    Elided,
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Scalar(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Scalar(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Scalar(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Scalar(Value::from(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Scalar(Value::String(v.to_string())))
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Scalar(Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            entries.push((key, value));
        }
        Ok(Json::Object(entries))
    }
}

/// How entries are separated: as the server writes JSON, or as Python's `json.dumps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Compact,
    Python,
}

impl Json {
    pub fn parse(text: &str) -> Json {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    /// As the server writes it: compact, keys in their order.
    pub fn render(&self) -> String {
        self.render_as(Style::Compact)
    }

    pub fn render_as(&self, style: Style) -> String {
        let (comma, colon) = match style {
            Style::Compact => (",", ":"),
            Style::Python => (", ", ": "),
        };
        match self {
            Json::Scalar(value) => scalar(value, style),
            Json::Elided => "…".to_string(),
            Json::Array(items) => {
                let items: Vec<String> = merge_elided(items.iter().map(|i| i.render_as(style)));
                format!("[{}]", items.join(comma))
            }
            Json::Object(entries) => {
                let entries = entries.iter().map(|(key, value)| match value {
                    Json::Elided if key.is_empty() => "…".to_string(),
                    value => format!("{}{colon}{}", scalar(&Value::from(key.as_str()), style), {
                        value.render_as(style)
                    }),
                });
                format!("{{{}}}", merge_elided(entries).join(comma))
            }
        }
    }

    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn str(&self) -> Option<&str> {
        match self {
            Json::Scalar(Value::String(s)) => Some(s),
            _ => None,
        }
    }

    /// Leaves out every entry named in `keys`, at any depth (shown as `…`).
    pub fn drop_keys(mut self, keys: &[&str]) -> Json {
        self.walk(&mut |key, value| {
            if keys.contains(&key) {
                *value = Json::Elided;
            }
        });
        self.hide_elided_keys();
        self
    }

    /// Shortens the strings under `keys` (at any depth) to their first `words` words and `…`.
    pub fn shorten(mut self, keys: &[&str], words: usize) -> Json {
        self.walk(&mut |key, value| {
            if let (true, Json::Scalar(Value::String(s))) = (keys.contains(&key), &mut *value) {
                let kept: Vec<&str> = s.split(' ').take(words).collect();
                if kept.len() < s.split(' ').count() {
                    *s = format!("{} …", kept.join(" "));
                }
            }
        });
        self
    }

    /// Keeps only the entries named in `keep` of this object.
    pub fn keep(mut self, keep: &[&str]) -> Json {
        if let Json::Object(entries) = &mut self {
            for (name, value) in entries.iter_mut() {
                if !keep.contains(&name.as_str()) {
                    *value = Json::Elided;
                }
            }
        }
        self.hide_elided_keys();
        self
    }

    /// Keeps only the entries named in `keep` of the objects in the arrays under `key`.
    pub fn keep_in_items(mut self, key: &str, keep: &[&str]) -> Json {
        self.walk(&mut |k, value| {
            if k != key {
                return;
            }
            if let Json::Array(items) = value {
                for item in items {
                    if let Json::Object(entries) = item {
                        for (name, v) in entries.iter_mut() {
                            if !keep.contains(&name.as_str()) {
                                *v = Json::Elided;
                            }
                        }
                    }
                }
            }
        });
        self.hide_elided_keys();
        self
    }

    /// Keeps the first `n` items of the arrays under `key`, then `…`.
    pub fn first_items(mut self, key: &str, n: usize) -> Json {
        self.walk(&mut |k, value| {
            if let (true, Json::Array(items)) = (k == key, &mut *value) {
                if items.len() > n {
                    items.truncate(n);
                    items.push(Json::Elided);
                }
            }
        });
        self
    }

    /// Calls `f` with every (key, value) pair, depth first, parents before children.
    fn walk(&mut self, f: &mut dyn FnMut(&str, &mut Json)) {
        match self {
            Json::Object(entries) => {
                for (key, value) in entries.iter_mut() {
                    f(key, value);
                    value.walk(f);
                }
            }
            Json::Array(items) => items.iter_mut().for_each(|item| item.walk(f)),
            Json::Scalar(_) | Json::Elided => {}
        }
    }

    /// An entry left out shows as a bare `…`, not as `"key":…`.
    fn hide_elided_keys(&mut self) {
        match self {
            Json::Object(entries) => {
                for (key, value) in entries.iter_mut() {
                    if *value == Json::Elided {
                        key.clear();
                    } else {
                        value.hide_elided_keys();
                    }
                }
            }
            Json::Array(items) => items.iter_mut().for_each(Json::hide_elided_keys),
            Json::Scalar(_) | Json::Elided => {}
        }
    }
}

fn scalar(value: &Value, style: Style) -> String {
    let compact = value.to_string();
    match (style, value) {
        // json.dumps escapes every non-ASCII character.
        (Style::Python, Value::String(_)) => compact
            .chars()
            .map(|c| {
                if c.is_ascii() {
                    c.to_string()
                } else {
                    let mut units = [0u16; 2];
                    c.encode_utf16(&mut units)
                        .iter()
                        .map(|u| format!("\\u{u:04x}"))
                        .collect()
                }
            })
            .collect(),
        _ => compact,
    }
}

/// Neighbouring `…` say the same thing once.
fn merge_elided(parts: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in parts {
        if part == "…" && out.last().is_some_and(|last| last == "…") {
            continue;
        }
        out.push(part);
    }
    out
}

/// One SSE frame as the server wrote it: its lines, without the blank line that ends it.
#[derive(Debug, Clone)]
pub struct Frame {
    pub lines: Vec<String>,
}

impl Frame {
    pub fn field(&self, name: &str) -> Option<&str> {
        let prefix = format!("{name}: ");
        self.lines.iter().find_map(|l| l.strip_prefix(&prefix))
    }

    pub fn seq(&self) -> Option<u64> {
        self.field("id").and_then(|id| id.parse().ok())
    }

    pub fn event_type(&self) -> Option<&str> {
        self.field("event")
    }

    /// The frame as curl prints it, with the event's `session_id` and every `created_at` (the
    /// event's and those of the messages inside it) left out.
    pub fn shown(&self) -> String {
        let lines: Vec<String> = self
            .lines
            .iter()
            .map(|line| match line.strip_prefix("data: ") {
                Some(data) => format!("data: {}", event_json(data)),
                None => line.clone(),
            })
            .collect();
        format!("{}\n", lines.join("\n"))
    }
}

/// An event's JSON as the manual shows it.
pub fn event_json(data: &str) -> String {
    let mut event = Json::parse(data).drop_keys(&["created_at"]);
    if let Json::Object(entries) = &mut event {
        for (key, value) in entries.iter_mut() {
            if key == "session_id" {
                key.clear();
                *value = Json::Elided;
            }
        }
    }
    event.render()
}

/// Splits an SSE body into frames (comments such as heartbeats are frames too).
pub fn frames(body: &str) -> Vec<Frame> {
    body.split("\n\n")
        .filter(|chunk| !chunk.trim().is_empty())
        .map(|chunk| Frame {
            lines: chunk.lines().map(str::to_string).collect(),
        })
        .collect()
}

/// What a comparison is blind to: a UUID becomes `<id N>` (N counts distinct ids in order of
/// appearance, so the same id must come back where it came before) and an RFC 3339 time
/// becomes `<time>`.
pub fn normalise(text: &str) -> String {
    let mut ids: Vec<String> = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if let Some(len) = uuid_at(&chars[i..]) {
            let id: String = chars[i..i + len].iter().collect();
            let n = match ids.iter().position(|known| *known == id) {
                Some(n) => n,
                None => {
                    ids.push(id);
                    ids.len() - 1
                }
            };
            out.push_str(&format!("<id {}>", n + 1));
            i += len;
        } else if let Some(len) = time_at(&chars[i..]) {
            out.push_str("<time>");
            i += len;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

fn uuid_at(s: &[char]) -> Option<usize> {
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];
    let mut i = 0;
    for (n, len) in GROUPS.iter().enumerate() {
        if n > 0 {
            (s.get(i) == Some(&'-')).then_some(())?;
            i += 1;
        }
        let group = s.get(i..i + len)?;
        group
            .iter()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(c))
            .then_some(())?;
        i += len;
    }
    Some(i)
}

fn time_at(s: &[char]) -> Option<usize> {
    // 2026-12-01T10:56:08[.157772]Z
    let pattern = "dddd-dd-ddTdd:dd:dd";
    for (p, c) in pattern.chars().zip(s) {
        let ok = if p == 'd' {
            c.is_ascii_digit()
        } else {
            p == *c
        };
        ok.then_some(())?;
    }
    let mut i = pattern.len();
    (s.len() > i).then_some(())?;
    if s[i] == '.' {
        i += 1;
        while s.get(i).is_some_and(char::is_ascii_digit) {
            i += 1;
        }
    }
    (s.get(i) == Some(&'Z')).then_some(i + 1)
}

#[test]
fn json_is_shown_in_the_servers_order_with_fields_left_out() {
    let raw = r#"{"z":1,"a":{"created_at":"x","b":[1,2,3],"é":"ü"},"session_id":"s","t":"one two three"}"#;
    assert_eq!(
        Json::parse(raw).render(),
        raw,
        "a round trip changes nothing"
    );
    let shown = Json::parse(raw)
        .drop_keys(&["created_at", "session_id"])
        .first_items("b", 2)
        .shorten(&["t"], 2);
    assert_eq!(
        shown.render(),
        r#"{"z":1,"a":{…,"b":[1,2,…],"é":"ü"},…,"t":"one two …"}"#
    );
    assert_eq!(
        Json::parse(r#"{"a":true,"b":"é"}"#).render_as(Style::Python),
        r#"{"a": true, "b": "\u00e9"}"#
    );
}

#[test]
fn normalising_keeps_which_id_is_which() {
    let a = "01a2313f-640c-722d-abc4-128762e213d4";
    let b = "01a2313f-65d8-73a2-91b9-790fe077c7e6";
    assert_eq!(
        normalise(&format!(
            "{a} {b} {a} at 2026-12-01T10:56:08.157772Z, 2026-12-01T10:56:08Z"
        )),
        "<id 1> <id 2> <id 1> at <time>, <time>"
    );
    assert_ne!(
        normalise(&format!("{a} {b} {a}")),
        normalise(&format!("{a} {b} {b}"))
    );
}
