//! A server's tools as [`Tool`]s: `mcp__<server>__<tool>` with the server's description and
//! input schema, called through the server's [`Link`]; and what a call's result becomes. Text
//! is the output; `isError` makes it a tool error; images, audio and embedded resources are
//! described in the output in a line each (a text resource's text follows its line, so the
//! model can read it), and each is made into an [`Artifact`] of the result in one place,
//! [`media`], for the session layer to keep once it records artifacts (§11.3).

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::{json, Value};

use super::server::Link;
use crate::tools::{Artifact, Availability, Tool, ToolContext, ToolError, ToolResult, ToolSource};

/// Longest tool name the model providers accept.
const MAX_NAME: usize = 64;

/// The prefix of every MCP tool's name; client tools may not use it.
pub const PREFIX: &str = "mcp__";

/// One tool of one server.
pub struct McpTool {
    name: String,
    /// The server's own name for it.
    remote: String,
    description: String,
    schema: Value,
    link: Arc<Link>,
}

/// The name the model calls a server's tool by: characters providers refuse become `_`.
pub fn tool_name(server: &str, remote: &str) -> String {
    let clean: String = remote
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    format!("{PREFIX}{server}__{clean}")
}

/// The tools a server listed, as tah offers them. A tool whose name would be too long, or would
/// be another's once cleaned, is left out with a warning.
pub fn from_listing(link: &Arc<Link>, listed: Vec<rmcp::model::Tool>) -> Vec<Arc<dyn Tool>> {
    let mut seen = HashSet::new();
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    for tool in listed {
        let name = tool_name(link.server(), &tool.name);
        if name.len() > MAX_NAME || !seen.insert(name.clone()) {
            tracing::warn!(
                server = link.server(),
                tool = %tool.name,
                "MCP tool left out: its name as {name} is too long or taken"
            );
            continue;
        }
        let description = match tool.description.as_deref().map(str::trim) {
            Some(text) if !text.is_empty() => text.to_string(),
            _ => format!("{} (a tool of MCP server {})", tool.name, link.server()),
        };
        tools.push(Arc::new(McpTool {
            name,
            remote: tool.name.to_string(),
            description,
            schema: Value::Object((*tool.input_schema).clone()),
            link: link.clone(),
        }));
    }
    tools
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn input_schema(&self) -> Value {
        self.schema.clone()
    }

    fn source(&self) -> ToolSource {
        ToolSource::Mcp
    }

    fn server(&self) -> Option<&str> {
        Some(self.link.server())
    }

    fn availability(&self) -> Availability {
        self.link.availability()
    }

    async fn call(&self, _ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let result = self.link.call(&self.name, &self.remote, input).await?;
        let tag = crate::model::new_id().simple().to_string();
        convert(self.link.server(), &self.remote, &tag, result)
    }
}

/// What `GET /v1/tools` lists for a server that has not listed its tools yet: never offered,
/// and its reason says why.
pub struct Placeholder {
    name: String,
    link: Arc<Link>,
}

impl Placeholder {
    pub fn new(link: Arc<Link>) -> Placeholder {
        Placeholder {
            name: format!("{PREFIX}{}__*", link.server()),
            link,
        }
    }
}

#[async_trait]
impl Tool for Placeholder {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> String {
        format!(
            "The tools of MCP server {}, listed once it answers.",
            self.link.server()
        )
    }

    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }

    fn source(&self) -> ToolSource {
        ToolSource::Mcp
    }

    fn server(&self) -> Option<&str> {
        Some(self.link.server())
    }

    fn availability(&self) -> Availability {
        match self.link.availability() {
            Availability::Available => Availability::Unavailable {
                reason: format!("MCP server {} is listing its tools", self.link.server()),
            },
            unavailable => unavailable,
        }
    }

    async fn call(&self, _ctx: &ToolContext, _input: &Value) -> Result<ToolResult, ToolError> {
        Err(ToolError(format!("{} is not a tool", self.name)))
    }
}

/// A call's result as a tool's answer. `tag` keeps the artifact names of one call apart from
/// another's.
pub fn convert(
    server: &str,
    tool: &str,
    tag: &str,
    result: CallToolResult,
) -> Result<ToolResult, ToolError> {
    let mut parts = Vec::new();
    let mut artifacts = Vec::new();
    for block in result.content {
        let mut keep = |media_type: &str, content: Bytes, what: &str| {
            media(
                &mut artifacts,
                (server, tool, tag),
                media_type,
                content,
                what,
            )
        };
        match block {
            ContentBlock::Text(text) => parts.push(text.text),
            ContentBlock::Image(image) => parts.push(match decode(&image.data) {
                Some(data) => keep(&image.mime_type, data, "image"),
                None => format!("[image ({}) whose data is not base64]", image.mime_type),
            }),
            ContentBlock::Audio(audio) => parts.push(match decode(&audio.data) {
                Some(data) => keep(&audio.mime_type, data, "audio"),
                None => format!("[audio ({}) whose data is not base64]", audio.mime_type),
            }),
            ContentBlock::Resource(embedded) => match embedded.resource {
                ResourceContents::TextResourceContents {
                    uri,
                    mime_type,
                    text,
                    ..
                } => {
                    let media_type = mime_type.unwrap_or_else(|| "text/plain".to_string());
                    let note = keep(
                        &media_type,
                        Bytes::from(text.clone()),
                        &format!("resource {uri}"),
                    );
                    parts.push(format!("{note}\n{text}"));
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let media_type =
                        mime_type.unwrap_or_else(|| "application/octet-stream".to_string());
                    parts.push(match decode(&blob) {
                        Some(data) => keep(&media_type, data, &format!("resource {uri}")),
                        None => format!("[resource {uri} ({media_type}) whose data is not base64]"),
                    });
                }
                other => parts.push(unknown(&other)),
            },
            ContentBlock::ResourceLink(link) => {
                parts.push(format!("[resource link: {} ({})]", link.uri, link.name))
            }
            other => parts.push(unknown(&other)),
        }
    }
    if parts.is_empty() {
        if let Some(structured) = &result.structured_content {
            parts.push(structured.to_string());
        }
    }
    let output = parts.join("\n");
    if result.is_error == Some(true) {
        return Err(ToolError(if output.is_empty() {
            format!("{tool} reported an error")
        } else {
            output
        }));
    }
    Ok(ToolResult { output, artifacts })
}

/// The one place where what an MCP tool returned beside text (an image, audio, an embedded
/// resource) becomes an artifact: it is added to the call's `artifacts` under
/// `mcp/<server>/<tool>/<tag>-<n>.<ext>`, and the line answered describes it for the output
/// and names that path, the artifact's `path` in the session, so that the model can refer to
/// it. (One over `--max-artifact-bytes` is not kept; the session then adds a line saying so.)
fn media(
    artifacts: &mut Vec<Artifact>,
    (server, tool, tag): (&str, &str, &str),
    media_type: &str,
    content: Bytes,
    what: &str,
) -> String {
    let path = format!(
        "mcp/{server}/{tool}/{tag}-{}.{}",
        artifacts.len() + 1,
        extension(media_type)
    );
    let line = format!(
        "[{what} ({media_type}, {} bytes), artifact {path}]",
        content.len()
    );
    artifacts.push(Artifact {
        path,
        media_type: media_type.to_string(),
        content,
    });
    line
}

/// A note for content of a kind newer than this version of tah.
fn unknown(content: &impl serde::Serialize) -> String {
    let json = serde_json::to_value(content).unwrap_or_default();
    match json.get("type").and_then(Value::as_str) {
        Some(kind) => format!("[{kind} content, which tah does not read]"),
        None => "[content tah does not read]".to_string(),
    }
}

fn decode(data: &str) -> Option<Bytes> {
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()
        .map(Bytes::from)
}

/// A file extension for an artifact of this media type.
fn extension(media_type: &str) -> &'static str {
    match media_type.split(';').next().unwrap_or("").trim() {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/svg+xml" => "svg",
        "audio/wav" | "audio/x-wav" => "wav",
        "audio/mpeg" => "mp3",
        "audio/ogg" => "ogg",
        "text/plain" => "txt",
        "text/markdown" => "md",
        "text/html" => "html",
        "text/csv" => "csv",
        "application/json" => "json",
        "application/pdf" => "pdf",
        _ => "bin",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(content: Vec<ContentBlock>, is_error: Option<bool>) -> CallToolResult {
        let mut result = CallToolResult::success(content);
        result.is_error = is_error;
        result
    }

    #[test]
    fn names_are_prefixed_and_cleaned() {
        assert_eq!(tool_name("fs", "read_file"), "mcp__fs__read_file");
        assert_eq!(
            tool_name("gh", "issues.list/all"),
            "mcp__gh__issues_list_all"
        );
        assert_eq!(tool_name("x", "get-sum"), "mcp__x__get-sum");
    }

    #[test]
    fn text_is_the_output_and_is_error_a_tool_error() {
        let ok = convert(
            "s",
            "echo",
            "t",
            result(
                vec![ContentBlock::text("one"), ContentBlock::text("two")],
                None,
            ),
        )
        .expect("ok");
        assert_eq!(ok.output, "one\ntwo");
        assert!(ok.artifacts.is_empty());
        let err = convert(
            "s",
            "fail",
            "t",
            result(vec![ContentBlock::text("no such file")], Some(true)),
        )
        .expect_err("an error");
        assert_eq!(err.0, "no such file");
        let bare = convert("s", "fail", "t", result(vec![], Some(true))).expect_err("error");
        assert_eq!(bare.0, "fail reported an error");
        let mut structured = result(vec![], Some(false));
        structured.structured_content = Some(json!({"sum": 3}));
        let out = convert("s", "add", "t", structured).expect("ok");
        assert_eq!(out.output, r#"{"sum":3}"#);
    }

    #[test]
    fn images_and_resources_are_described_and_made_artifacts() {
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake");
        let out = convert(
            "pics",
            "draw",
            "c1",
            result(
                vec![
                    ContentBlock::text("here it is"),
                    ContentBlock::image(png, "image/png"),
                    ContentBlock::embedded_text("file:///notes.txt", "hello notes"),
                    ContentBlock::image("not base64!", "image/gif"),
                ],
                None,
            ),
        )
        .expect("ok");
        assert_eq!(out.artifacts.len(), 2);
        assert_eq!(out.artifacts[0].path, "mcp/pics/draw/c1-1.png");
        assert_eq!(out.artifacts[0].media_type, "image/png");
        assert_eq!(&out.artifacts[0].content[..], b"\x89PNG fake");
        assert_eq!(out.artifacts[1].path, "mcp/pics/draw/c1-2.txt");
        assert_eq!(&out.artifacts[1].content[..], b"hello notes");
        let lines: Vec<&str> = out.output.lines().collect();
        assert_eq!(
            lines,
            [
                "here it is",
                "[image (image/png, 9 bytes), artifact mcp/pics/draw/c1-1.png]",
                "[resource file:///notes.txt (text/plain, 11 bytes), artifact mcp/pics/draw/c1-2.txt]",
                "hello notes",
                "[image (image/gif) whose data is not base64]",
            ]
        );
    }
}
