//! The `--providers` file: named providers beside `default`, in JSON, or in TOML when the
//! file's name ends in `.toml`:
//!
//! ```json
//! {"providers": {"<name>": {"type": "openai"|"anthropic"|"mock", "base_url"?, "api_key_env"?,
//!   "api_key"?, "headers"?: {"<name>": "<value>"}, "max_output_tokens"?,
//!   "prices"?: {"<model>": {"input_per_mtok", "output_per_mtok", "cache_read_per_mtok"?}}}}}
//! ```
//!
//! Everything is checked here, before the server starts: a refusal names the field
//! (`providers.<name>.<field>`) and never shows a key or a header's value. Keys come from the
//! environment (`api_key_env`) or from a vault: `api_key` takes only a reference,
//! `${vault:VAULT/NAME}` (of the tenant `default`), which the runtime resolves once the store
//! is open.

use std::collections::BTreeMap;
use std::fmt;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

use super::{Price, ProviderKind, DEFAULT};

/// One provider as the file describes it, checked.
#[derive(Clone)]
pub struct FileProvider {
    pub name: String,
    pub kind: ProviderKind,
    /// `None`: the provider's public endpoint.
    pub base_url: Option<String>,
    /// The key read from the environment variable `api_key_env` names. Never shown.
    pub api_key: Option<String>,
    /// `api_key`'s vault reference (`${vault:VAULT/NAME}`), for the runtime to resolve.
    pub api_key_ref: Option<String>,
    /// Sent with every request; the values are never shown.
    pub headers: Vec<(String, String)>,
    /// `None`: the `--max-output-tokens` of the flags.
    pub max_output_tokens: Option<u32>,
    pub prices: BTreeMap<String, Price>,
}

impl fmt::Debug for FileProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("FileProvider")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url.as_ref().map(|_| "<set>"))
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("api_key_ref", &self.api_key_ref)
            .field("headers", &headers)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("prices", &self.prices)
            .finish()
    }
}

/// The two formats a providers file is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Toml,
}

impl Format {
    /// TOML when the file's name ends in `.toml` (any case), JSON otherwise.
    pub fn of(path: &std::path::Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("toml") => Format::Toml,
            _ => Format::Json,
        }
    }
}

/// Why a providers file was refused: the field (`providers.<name>.<field>`; empty for the
/// file's syntax) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    pub field: String,
    pub why: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.field.is_empty() {
            true => f.write_str(&self.why),
            false => write!(f, "{}: {}", self.field, self.why),
        }
    }
}

impl std::error::Error for FileError {}

impl FileError {
    fn at(field: impl Into<String>, why: impl Into<String>) -> FileError {
        FileError {
            field: field.into(),
            why: why.into(),
        }
    }
}

const PROVIDER_FIELDS: &[&str] = &[
    "type",
    "base_url",
    "api_key_env",
    "api_key",
    "headers",
    "max_output_tokens",
    "prices",
];
const PRICE_FIELDS: &[&str] = &["input_per_mtok", "output_per_mtok", "cache_read_per_mtok"];

/// The providers of a file's `text`, in name order; `env` reads an environment variable.
pub fn parse(
    text: &str,
    format: Format,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<FileProvider>, FileError> {
    let root = match format {
        Format::Json => serde_json::from_str::<Value>(text)
            .map_err(|e| FileError::at("", format!("not valid JSON: {e}")))?,
        Format::Toml => toml::from_str::<Value>(text).map_err(|e| toml_error(text, &e))?,
    };
    let root = object(&root, "the file")?;
    known_fields(root, &["providers"], "")?;
    let providers = root
        .get("providers")
        .ok_or_else(|| FileError::at("providers", "missing: the file lists its providers there"))?;
    let mut providers = object(providers, "providers")?
        .iter()
        .map(|(name, value)| provider(name, value, &env))
        .collect::<Result<Vec<_>, _>>()?;
    providers.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(providers)
}

/// A TOML syntax error with its line and column, without the file's text: the line could
/// hold a header's value.
fn toml_error(text: &str, error: &toml::de::Error) -> FileError {
    let place = error.span().map(|span| {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!(" at line {line}, column {column}")
    });
    let message = error.message().trim_end();
    FileError::at(
        "",
        format!("not valid TOML{}: {message}", place.unwrap_or_default()),
    )
}

fn object<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>, FileError> {
    value
        .as_object()
        .ok_or_else(|| FileError::at(field, "must be a table of named entries (a JSON object)"))
}

/// Refuses the fields of `object` that are not `known`; `at` is the object's own field.
fn known_fields(object: &Map<String, Value>, known: &[&str], at: &str) -> Result<(), FileError> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(FileError::at(
            join(at, unknown),
            format!("unknown field (known: {})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

fn join(at: &str, field: &str) -> String {
    match at.is_empty() {
        true => field.to_string(),
        false => format!("{at}.{field}"),
    }
}

fn provider(
    name: &str,
    value: &Value,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<FileProvider, FileError> {
    let at = format!("providers.{name}");
    check_name(name, &at)?;
    let fields = object(value, &at)?;
    known_fields(fields, PROVIDER_FIELDS, &at)?;
    let field = |key: &str| join(&at, key);
    let kind = match fields.get("type") {
        None => return Err(FileError::at(field("type"), "missing")),
        Some(Value::String(kind)) => match kind.as_str() {
            "openai" => ProviderKind::Openai,
            "anthropic" => ProviderKind::Anthropic,
            "mock" => ProviderKind::Mock,
            other => {
                return Err(FileError::at(
                    field("type"),
                    format!("unknown type {other:?}: expected openai, anthropic or mock"),
                ))
            }
        },
        Some(_) => return Err(FileError::at(field("type"), "must be a string")),
    };
    let base_url = match string(fields, "base_url", &at)? {
        Some(_) if kind == ProviderKind::Mock => {
            return Err(FileError::at(
                field("base_url"),
                "a mock provider calls no endpoint",
            ))
        }
        Some(url) => Some(check_url(url).map_err(|why| FileError::at(field("base_url"), why))?),
        None => None,
    };
    let (api_key, api_key_ref) = api_key(fields, &at, env)?;
    Ok(FileProvider {
        name: name.to_string(),
        kind,
        base_url,
        api_key,
        api_key_ref,
        headers: headers(fields, &at)?,
        max_output_tokens: max_output_tokens(fields, &at)?,
        prices: prices(fields, &at)?,
    })
}

fn check_name(name: &str, at: &str) -> Result<(), FileError> {
    let why = if name.trim().is_empty() {
        "a provider's name must not be empty"
    } else if name.contains('/') {
        "a provider's name cannot contain /: a model is named \"<provider>/<model>\""
    } else if name.chars().any(char::is_control) {
        "a provider's name cannot contain control characters"
    } else if name == DEFAULT {
        "the name default is the provider of the --provider, --base-url and --model flags: \
         give this one another name"
    } else {
        return Ok(());
    };
    Err(FileError::at(at, why))
}

/// A string field, if present.
fn string<'a>(
    fields: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<&'a str>, FileError> {
    match fields.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(FileError::at(join(at, key), "must be a string")),
    }
}

/// An http or https URL with a host. The URL itself is not repeated in the reason: it may
/// carry credentials.
fn check_url(url: &str) -> Result<String, String> {
    let parsed = reqwest::Url::parse(url.trim()).map_err(|e| format!("not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "the scheme must be http or https, not {}",
            parsed.scheme()
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".to_string());
    }
    Ok(url.trim().to_string())
}

/// The key: read from the variable `api_key_env` names, or (second) the vault reference
/// `api_key` holds, left for the runtime to resolve.
fn api_key(
    fields: &Map<String, Value>,
    at: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(Option<String>, Option<String>), FileError> {
    let variable = string(fields, "api_key_env", at)?;
    // Never echoed: a key written here by mistake must not reach a log.
    let reference = match fields.get("api_key") {
        None => None,
        Some(Value::String(s)) => Some(s.trim()),
        Some(_) => return Err(FileError::at(join(at, "api_key"), "must be a string")),
    };
    if let Some(reference) = reference {
        let whole = crate::vault::reference::references(reference)
            .ok()
            .filter(|refs| refs.len() == 1 && reference == format!("${{vault:{}}}", refs[0]));
        let why = if variable.is_some() {
            "give api_key_env or api_key, not both"
        } else if whole.is_some() {
            return Ok((None, Some(reference.to_string())));
        } else if reference.starts_with("${vault:") && reference.ends_with('}') {
            "a vault reference names a vault and a secret, ${vault:VAULT/NAME}, both 1 to 128 \
             of A-Z a-z 0-9 _ . -"
        } else {
            "takes only a vault reference (${vault:VAULT/NAME}), never a key: put the key in a \
             vault, or in an environment variable named in api_key_env"
        };
        return Err(FileError::at(join(at, "api_key"), why));
    }
    let Some(variable) = variable else {
        return Ok((None, None));
    };
    let variable = variable.trim();
    if variable.is_empty() {
        return Err(FileError::at(join(at, "api_key_env"), "must not be empty"));
    }
    match env(variable).filter(|v| !v.is_empty()) {
        Some(key) => Ok((Some(key), None)),
        None => Err(FileError::at(
            join(at, "api_key_env"),
            format!("the environment variable {variable} is not set"),
        )),
    }
}

/// The headers, each a valid HTTP name and value; an error names the header, not its value.
fn headers(fields: &Map<String, Value>, at: &str) -> Result<Vec<(String, String)>, FileError> {
    let Some(value) = fields.get("headers") else {
        return Ok(Vec::new());
    };
    let at = join(at, "headers");
    object(value, &at)?
        .iter()
        .map(|(name, value)| {
            let field = join(&at, name);
            if HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(FileError::at(field, "not a valid HTTP header name"));
            }
            match value {
                Value::String(v) if HeaderValue::from_str(v).is_ok() => {
                    Ok((name.to_ascii_lowercase(), v.clone()))
                }
                Value::String(_) => Err(FileError::at(
                    field,
                    "the value is not a valid HTTP header value (no line breaks or control \
                     characters)",
                )),
                _ => Err(FileError::at(field, "the value must be a string")),
            }
        })
        .collect()
}

fn max_output_tokens(fields: &Map<String, Value>, at: &str) -> Result<Option<u32>, FileError> {
    let Some(value) = fields.get("max_output_tokens") else {
        return Ok(None);
    };
    value
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
        .map(Some)
        .ok_or_else(|| {
            FileError::at(
                join(at, "max_output_tokens"),
                format!("must be a whole number from 1 to {}", u32::MAX),
            )
        })
}

fn prices(fields: &Map<String, Value>, at: &str) -> Result<BTreeMap<String, Price>, FileError> {
    let Some(value) = fields.get("prices") else {
        return Ok(BTreeMap::new());
    };
    let at = join(at, "prices");
    object(value, &at)?
        .iter()
        .map(|(model, value)| {
            let at = join(&at, model);
            if model.trim().is_empty() {
                return Err(FileError::at(at, "a model's name must not be empty"));
            }
            let fields = object(value, &at)?;
            known_fields(fields, PRICE_FIELDS, &at)?;
            let price = |key: &str| -> Result<Option<f64>, FileError> {
                let Some(value) = fields.get(key) else {
                    return Ok(None);
                };
                match value.as_f64() {
                    Some(n) if n.is_finite() && n >= 0.0 => Ok(Some(n)),
                    _ => Err(FileError::at(
                        join(&at, key),
                        "must be a number of US dollars per million tokens, 0 or more",
                    )),
                }
            };
            let required =
                |key: &str| price(key)?.ok_or_else(|| FileError::at(join(&at, key), "missing"));
            Ok((
                model.clone(),
                Price {
                    input_per_mtok: required("input_per_mtok")?,
                    output_per_mtok: required("output_per_mtok")?,
                    cache_read_per_mtok: price("cache_read_per_mtok")?,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-file-test-key-0123";
    const HEADER_VALUE: &str = "org-header-secret-42";

    fn env(name: &str) -> Option<String> {
        (name == "GATEWAY_KEY").then(|| KEY.to_string())
    }

    fn json(text: &str) -> Result<Vec<FileProvider>, FileError> {
        parse(text, Format::Json, env)
    }

    /// The error for one provider `gw` with these fields (JSON object members).
    fn refused(members: &str) -> FileError {
        let text = format!(r#"{{"providers": {{"gw": {{{members}}}}}}}"#);
        let error = json(&text).expect_err(&text);
        let shown = error.to_string();
        assert!(
            !shown.contains(KEY) && !shown.contains(HEADER_VALUE),
            "a secret in {shown}"
        );
        error
    }

    #[test]
    fn a_json_file_gives_its_providers_in_name_order() {
        let providers = json(&format!(
            r#"{{"providers": {{
                "local": {{"type": "openai", "base_url": "http://127.0.0.1:8000/v1",
                           "api_key": "${{vault:team/local-key}}",
                           "prices": {{"qwen": {{"input_per_mtok": 0, "output_per_mtok": 0}}}}}},
                "claude": {{"type": "anthropic", "api_key_env": "GATEWAY_KEY",
                            "headers": {{"X-Org": "{HEADER_VALUE}"}}, "max_output_tokens": 4096,
                            "prices": {{"claude-sonnet-4-5": {{"input_per_mtok": 3,
                                "output_per_mtok": 15.0, "cache_read_per_mtok": 0.3}}}}}},
                "fake": {{"type": "mock"}}
            }}}}"#
        ))
        .expect("accepted");
        let names: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["claude", "fake", "local"]);
        let claude = &providers[0];
        assert_eq!(claude.kind, ProviderKind::Anthropic);
        assert_eq!(claude.base_url, None);
        assert_eq!(claude.api_key.as_deref(), Some(KEY));
        assert_eq!(
            claude.headers,
            [("x-org".to_string(), HEADER_VALUE.to_string())]
        );
        assert_eq!(claude.max_output_tokens, Some(4096));
        assert_eq!(
            claude.prices["claude-sonnet-4-5"],
            Price {
                input_per_mtok: 3.0,
                output_per_mtok: 15.0,
                cache_read_per_mtok: Some(0.3)
            }
        );
        assert_eq!(providers[1].kind, ProviderKind::Mock);
        assert_eq!(
            providers[2].base_url.as_deref(),
            Some("http://127.0.0.1:8000/v1")
        );
        assert_eq!(providers[2].api_key, None);
        assert_eq!(
            providers[2].api_key_ref.as_deref(),
            Some("${vault:team/local-key}")
        );
        assert_eq!(claude.api_key_ref, None);
        let shown = format!("{providers:?}");
        assert!(
            !shown.contains(KEY) && !shown.contains(HEADER_VALUE),
            "{shown}"
        );
        assert!(json(r#"{"providers": {}}"#).expect("empty").is_empty());
    }

    #[test]
    fn a_toml_file_says_the_same() {
        let text = format!(
            r#"
[providers.claude]
type = "anthropic"
api_key_env = "GATEWAY_KEY"
headers = {{ x-org = "{HEADER_VALUE}" }}

[providers.claude.prices.claude-sonnet-4-5]
input_per_mtok = 3
output_per_mtok = 15.0

[providers.local]
type = "openai"
base_url = "http://127.0.0.1:8000/v1"
max_output_tokens = 2048
"#
        );
        let providers = parse(&text, Format::Toml, env).expect("accepted");
        assert_eq!(providers.len(), 2);
        assert_eq!(providers[0].name, "claude");
        assert_eq!(providers[0].api_key.as_deref(), Some(KEY));
        assert_eq!(providers[0].headers[0].0, "x-org");
        assert_eq!(
            providers[0].prices["claude-sonnet-4-5"].output_per_mtok,
            15.0
        );
        assert_eq!(providers[1].max_output_tokens, Some(2048));
        let bad =
            format!("[providers.gw]\ntype = \"openai\"\nheaders = {{ x = {HEADER_VALUE} }}\n");
        let error = parse(&bad, Format::Toml, env).expect_err("syntax");
        let shown = error.to_string();
        assert!(
            shown.starts_with("not valid TOML at line 3") && !shown.contains(HEADER_VALUE),
            "{shown}"
        );
        let error = parse("[providers.gw]\ntype = \"gemini\"\n", Format::Toml, env);
        assert_eq!(error.expect_err("type").field, "providers.gw.type");
    }

    #[test]
    fn each_refusal_names_its_field() {
        let cases: &[(&str, &str, &str)] = &[
            (r#""type": "gemini""#, "providers.gw.type", "unknown type"),
            (r#""base_url": "x""#, "providers.gw.type", "missing"),
            (
                r#""type": "openai", "bse_url": "x""#,
                "providers.gw.bse_url",
                "unknown field",
            ),
            (
                r#""type": "openai", "base_url": "not a url""#,
                "providers.gw.base_url",
                "not a URL",
            ),
            (
                r#""type": "openai", "base_url": "ftp://h/v1""#,
                "providers.gw.base_url",
                "scheme",
            ),
            (
                r#""type": "mock", "base_url": "http://h""#,
                "providers.gw.base_url",
                "no endpoint",
            ),
            (
                r#""type": "openai", "api_key_env": "NOT_SET_ANYWHERE""#,
                "providers.gw.api_key_env",
                "NOT_SET_ANYWHERE is not set",
            ),
            (
                r#""type": "openai", "api_key": "${vault:team}""#,
                "providers.gw.api_key",
                "names a vault and a secret",
            ),
            (
                r#""type": "openai", "api_key": "Bearer ${vault:team/openai}""#,
                "providers.gw.api_key",
                "never a key",
            ),
            (
                &format!(r#""type": "openai", "api_key": "{KEY}""#),
                "providers.gw.api_key",
                "never a key",
            ),
            (
                r#""type": "openai", "api_key_env": "GATEWAY_KEY", "api_key": "${vault:a/b}""#,
                "providers.gw.api_key",
                "not both",
            ),
            (
                r#""type": "openai", "headers": {"bad name": "v"}"#,
                "providers.gw.headers.bad name",
                "header name",
            ),
            (
                &format!(r#""type": "openai", "headers": {{"x-org": "{HEADER_VALUE}\n"}}"#),
                "providers.gw.headers.x-org",
                "header value",
            ),
            (
                r#""type": "openai", "max_output_tokens": 0"#,
                "providers.gw.max_output_tokens",
                "from 1",
            ),
            (
                r#""type": "openai", "prices": {"m": {"input_per_mtok": -1, "output_per_mtok": 1}}"#,
                "providers.gw.prices.m.input_per_mtok",
                "0 or more",
            ),
            (
                r#""type": "openai", "prices": {"m": {"input_per_mtok": 1}}"#,
                "providers.gw.prices.m.output_per_mtok",
                "missing",
            ),
            (
                r#""type": "openai", "prices": {"m": {"input_per_mtok": 1, "output_per_mtok": 1, "per_call": 2}}"#,
                "providers.gw.prices.m.per_call",
                "unknown field",
            ),
        ];
        for (members, field, why) in cases {
            let error = refused(members);
            assert_eq!(error.field, *field, "{members}: {error}");
            assert!(error.why.contains(why), "{members}: {error}");
        }
    }

    #[test]
    fn names_and_the_file_shape_are_checked() {
        let name = |name: &str| {
            let text = format!(r#"{{"providers": {{"{name}": {{"type": "mock"}}}}}}"#);
            json(&text).expect_err(name)
        };
        for (bad, why) in [
            ("default", "flags"),
            ("", "empty"),
            ("a/b", "cannot contain /"),
        ] {
            let error = name(bad);
            assert_eq!(error.field, format!("providers.{bad}"));
            assert!(error.why.contains(why), "{error}");
        }
        let unknown = json(r#"{"providers": {}, "agents": {}}"#).expect_err("unknown");
        assert_eq!(unknown.field, "agents");
        assert_eq!(json("{}").expect_err("missing").field, "providers");
        assert_eq!(
            json(r#"{"providers": []}"#).expect_err("list").field,
            "providers"
        );
        let syntax = json(r#"{"providers": "#).expect_err("syntax");
        assert!(
            syntax.field.is_empty() && syntax.why.starts_with("not valid JSON"),
            "{syntax}"
        );
    }

    #[test]
    fn the_format_follows_the_extension() {
        use std::path::Path;
        assert_eq!(
            Format::of(Path::new("/etc/tah/providers.toml")),
            Format::Toml
        );
        assert_eq!(Format::of(Path::new("p.TOML")), Format::Toml);
        assert_eq!(Format::of(Path::new("p.json")), Format::Json);
        assert_eq!(Format::of(Path::new("providers")), Format::Json);
    }
}
