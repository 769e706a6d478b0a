//! The server's settings: `tah serve`'s flags ([`ServeArgs`]) parsed once, at start, into
//! typed and validated values, in groups of plain fields ([`HttpSettings`], [`StoreSettings`],
//! [`ModelSettings`], [`RunSettings`], [`ToolSettings`], [`PolicySettings`], the webhooks,
//! [`TelemetrySettings`]) that the runtime and the application hand whole to the parts that
//! use them. [`Settings::parse`] refuses what clap cannot check (tokens too short, an origin
//! that is not one, a public address without tokens), and values derived from several flags
//! (the provider in force, auto-resume, the step limit) are decided there and nowhere else.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::{ApprovalModeArg, SandboxArg};
pub use crate::cli::{LogFormat, Provider, ServeArgs, DEFAULT_SYSTEM_PROMPT};
use crate::http::jwt::JwtSettings;
use crate::llm::guard::ReplyLimits;
use crate::llm::providers::file::{self as providers_file, FileProvider};
use crate::mcp::{McpConfig, McpConfigError, McpSettings};
use crate::model::Rule;
use crate::tools::builtin::shell::{ShellNetwork, ShellSettings};
use crate::tools::policy::{ApprovalMode, Rules};
use crate::tools::sandbox::{Limits, SandboxChoice};
use crate::vault::{MasterKey, MasterKeyError};
use crate::webhooks::{SigningSecret, WebhookSecret, WebhookSettings};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "refusing to listen on {0} without API tokens: set --api-token (or TAH_API_TOKENS), \
         or pass --allow-unauthenticated if something else guards this address"
    )]
    ExposedWithoutTokens(SocketAddr),
    #[error("API tokens must be at least 16 characters without spaces")]
    WeakToken,
    #[error(
        "refusing --shell-network without API tokens: a shell command could reach this \
         server's own API and approve its own calls; set --api-token (or TAH_API_TOKENS), \
         or leave --shell-network off"
    )]
    ShellNetworkWithoutTokens,
    #[error(
        "--cors-origin {origin:?} is not an origin ({reason}): give scheme://host[:port], \
         such as http://localhost:5173 or https://app.example.com, or * for any origin"
    )]
    CorsOrigin {
        origin: String,
        reason: &'static str,
    },
    #[error(transparent)]
    ShellNetwork(#[from] crate::tools::egress::NetworkParseError),
    #[error("--shell-network-test-resolve {0:?}: {1}")]
    ShellNetworkTestResolve(String, String),
    #[error("--tools names tools that do not exist: {} (the built-in tools are {})", .0.join(", "), crate::tools::builtin::NAMES.join(", "))]
    UnknownTools(Vec<String>),
    #[error("--tool-policy {path}: {why}")]
    Policy { path: String, why: String },
    #[error(
        "--thinking-budget {0} is too small: Anthropic takes at least 1024 thinking tokens \
         (0 turns thinking off)"
    )]
    ThinkingBudget(u32),

    #[error("--mcp-config {path}: {why}")]
    Mcp { path: String, why: String },
    #[error("--providers {path}: {why}")]
    Providers { path: String, why: String },
    #[error("--webhook-url {url:?} is not an http or https URL ({reason})")]
    WebhookUrl { url: String, reason: String },
    #[error(
        "--webhook-url needs --webhook-secret-env NAME, the environment variable that holds \
         the signing secret (whsec_<base64>)"
    )]
    WebhookSecretMissing,
    #[error("--webhook-secret-env {0}: the environment variable {0} is not set")]
    WebhookSecretUnset(String),
    #[error("--webhook-secret-env {name}: the secret in {name} is unusable: {reason}")]
    WebhookSecretInvalid { name: String, reason: &'static str },
    #[error(
        "bearer JWTs need --jwt-jwks-url, --jwt-issuer and --jwt-audience together \
         (or TAH_JWT_JWKS_URL, TAH_JWT_ISSUER, TAH_JWT_AUDIENCE): {} missing", .0.join(", ")
    )]
    JwtPartial(Vec<&'static str>),
    #[error("--jwt-jwks-url {url:?} is not an http or https URL ({reason})")]
    JwtJwksUrl { url: String, reason: String },
    #[error("{0} must name a claim: it is empty")]
    JwtClaim(&'static str),
    #[error("--master-key-env {0}")]
    MasterKey(#[from] MasterKeyError),
}

/// The smallest thinking budget Anthropic accepts.
const MIN_THINKING_BUDGET: u32 = 1024;

/// A value that must not show up in logs or debug output (API keys, API tokens).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A validated configuration of `tah serve`, in groups: each part of the server is handed the
/// group it uses, whole.
#[derive(Debug, Clone)]
pub struct Settings {
    pub http: HttpSettings,
    pub store: StoreSettings,
    pub model: ModelSettings,
    pub run: RunSettings,
    pub tools: ToolSettings,
    pub policy: PolicySettings,
    /// Where webhooks go and their secret (`--webhook-url`, `--webhook-secret-env`); `None`
    /// when no URL is given.
    pub webhooks: Option<WebhookSettings>,
    pub telemetry: TelemetrySettings,
}

/// The listener and what every request is checked against.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// The address to listen on (port 0: one the system picks).
    pub listen: SocketAddr,
    /// Where `GET /metrics` is served apart from the API (`--metrics-listen`); `None`: beside
    /// it.
    pub metrics_listen: Option<SocketAddr>,
    /// The accepted API tokens, none empty; no tokens = no authentication.
    pub api_tokens: Vec<Secret>,
    /// Where bearer JWTs are verified, and the claims read from them (`--jwt-*`); `None`: JWTs
    /// are not accepted.
    pub jwt: Option<JwtSettings>,
    /// Origins allowed by CORS: `*`, or `http(s)://host[:port]` as browsers send it (lower
    /// case, no default port, no trailing slash); none = no cross-origin access.
    pub cors_origins: Vec<String>,
    /// Host names answered besides the loopback names and the listen address.
    pub allowed_hosts: Vec<String>,
    /// A2A push notifications may go to private addresses (`--a2a-allow-private-push`).
    pub a2a_allow_private_push: bool,
    pub max_body_bytes: usize,
    /// Time limit of ordinary requests (not SSE streams, not `?wait=true` runs).
    pub request_timeout: Duration,
    /// Connections open at once at most (`None`: from the process's open-file limit).
    pub max_connections: Option<usize>,
    /// For a request's headers, and for the next request on a keep-alive connection.
    pub header_read_timeout: Duration,
}

/// The database, and what replicas sharing it agree on.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub database_url: String,
    /// What an acknowledged commit survives (`--durability`).
    pub durability: crate::store::Durability,
    /// How long a replica's lease on a session lasts without renewal.
    pub lease_ttl: Duration,
    /// Bytes one artifact may have; a larger file is not kept.
    pub max_artifact_bytes: u64,
    /// The key vault secrets are sealed under (`--master-key-env`); `None`: vaults are off.
    pub master_key: Option<MasterKey>,
}

/// The model the runtime talks to, and the bounds of every call to it.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    /// The provider in force: the flag, or the first provider whose key is present.
    pub provider: Provider,
    /// `--model`; `None` = the provider's default.
    pub model: Option<String>,
    /// `--base-url`; `None` = the provider's public endpoint.
    pub base_url: Option<String>,
    /// The provider's API key, read from the environment variable `--api-key-env` names.
    pub api_key: Option<Secret>,
    /// The mock model's delay between text pieces.
    pub mock_delay: Duration,
    pub max_output_tokens: u32,
    /// Anthropic's thinking budget in tokens (`None`: no thinking asked for).
    pub thinking_budget: Option<u32>,
    /// How long one model call may take in all (`None` = no overall limit).
    pub llm_deadline: Option<Duration>,
    /// Bounds on every model reply.
    pub reply_limits: ReplyLimits,
    /// The providers of `--providers` (none without it), checked, keys read.
    pub providers: Vec<FileProvider>,
}

/// How runs go: the agent's defaults, the budgets, and how many runs and sub-agents at once.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub system_prompt: String,
    /// LLM calls per run at most (`None` = unlimited).
    pub max_steps: Option<u32>,
    /// The default token budget of a session (`--max-session-tokens`).
    pub max_session_tokens: Option<u64>,
    /// The default token budget of a run (`--max-run-tokens`).
    pub max_run_tokens: Option<u64>,
    /// Character budget of each model request (`None` = the full history).
    pub context_chars: Option<usize>,
    /// Calls of one reply that run at once at most.
    pub tool_concurrency: usize,
    pub max_concurrent_runs: usize,
    /// Runs in progress at once per tenant on this replica (`None`: no limit).
    pub tenant_max_concurrent_runs: Option<usize>,
    /// Tokens a tenant's sessions may use per day, UTC (`None`: no limit).
    pub tenant_max_tokens_per_day: Option<u64>,
    /// US dollars a tenant's LLM steps may cost per day, UTC (`None`: no cap).
    pub tenant_max_cost_usd_per_day: Option<f64>,
    /// Whether interrupted runs resume by themselves: `--auto-resume`, by default on with
    /// PostgreSQL and off with SQLite.
    pub auto_resume: bool,
    /// Sessions at this sub-agent depth are not offered `task`.
    pub max_subagent_depth: u32,
    /// Sub-agent sessions one top-level run may start, at every depth.
    pub max_subagents_per_run: u32,
}

/// The tools offered: the built-in ones, where they work, and the MCP servers. (The tool
/// registry's own [`crate::tools::ToolSettings`] is made from `shell`.)
#[derive(Debug, Clone)]
pub struct ToolSettings {
    /// The built-in tools offered (`None`: all of them).
    pub builtin: Option<Vec<String>>,
    /// The directory the file tools are confined to.
    pub workspace: PathBuf,
    pub shell: ShellSettings,
    /// The MCP servers of `--mcp-config` (none without it), variables expanded.
    pub mcp: McpConfig,
    pub mcp_timeouts: McpSettings,
}

/// Which tool calls need an approval, and how long one is waited for.
#[derive(Debug, Clone)]
pub struct PolicySettings {
    /// The server's policy rules (from `--tool-policy`), compiled.
    pub rules: Rules,
    pub mode: ApprovalMode,
    /// How long an approval or a client's result is waited for (`None`: for ever).
    pub approval_timeout: Option<Duration>,
    /// How long a worker's claim on a call lasts without a heartbeat (`--worker-lease-s`).
    pub worker_lease: Duration,
}

/// The log's format (`--log-format`). The binary sets up logging from the flags themselves,
/// before they are parsed into settings; this group records what was chosen.
#[derive(Debug, Clone, Copy)]
pub struct TelemetrySettings {
    pub log_format: LogFormat,
}

impl Settings {
    /// Checks what clap cannot (exposure without tokens, token and origin syntax) and decides
    /// the derived values. The environment is read here for the provider's key and the default
    /// provider, as `--provider` documents.
    pub fn parse(args: ServeArgs) -> Result<Settings, ConfigError> {
        let jwt = jwt_settings(&args)?;
        let tokens: Vec<String> = args
            .api_tokens
            .into_iter()
            .filter(|t| !t.is_empty())
            .collect();
        // JWTs authenticate requests as tokens do.
        let authenticated = !tokens.is_empty() || jwt.is_some();
        if !authenticated && !args.listen.ip().is_loopback() && !args.allow_unauthenticated {
            return Err(ConfigError::ExposedWithoutTokens(args.listen));
        }
        let weak =
            |t: &String| t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control());
        if tokens.iter().any(weak) {
            return Err(ConfigError::WeakToken);
        }
        let shell_network = shell_network(
            args.shell_network.as_deref(),
            &args.shell_network_test_resolve,
        )?;
        if !authenticated && shell_network != ShellNetwork::None {
            return Err(ConfigError::ShellNetworkWithoutTokens);
        }
        let cors_origins = args
            .cors_origins
            .iter()
            .map(|origin| {
                parse_origin(origin).map_err(|reason| ConfigError::CorsOrigin {
                    origin: origin.clone(),
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let builtin = (!args.tools.is_empty()).then(|| {
            args.tools
                .iter()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
        });
        if let Some(tools) = &builtin {
            let unknown: Vec<String> = tools
                .iter()
                .filter(|t| !crate::tools::builtin::NAMES.contains(&t.as_str()))
                .cloned()
                .collect();
            if !unknown.is_empty() {
                return Err(ConfigError::UnknownTools(unknown));
            }
        }
        let rules = match &args.tool_policy {
            Some(path) => read_policy(path)?,
            None => Rules::default(),
        };
        if (1..MIN_THINKING_BUDGET).contains(&args.thinking_budget) {
            return Err(ConfigError::ThinkingBudget(args.thinking_budget));
        }
        let mcp = match &args.mcp_config {
            Some(path) => read_mcp_config(path)?,
            None => McpConfig::default(),
        };
        let providers = match &args.providers {
            Some(path) => read_providers(path)?,
            None => Vec::new(),
        };
        let webhooks = webhook_settings(&args.webhook_urls, args.webhook_secret_env.as_deref())?;
        let master_key = args
            .master_key_env
            .as_deref()
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(MasterKey::from_env)
            .transpose()?;
        let provider = args.provider.unwrap_or_else(default_provider);
        let auto_resume = args
            .auto_resume
            .unwrap_or_else(|| args.database_url.starts_with("postgres"));
        Ok(Settings {
            http: HttpSettings {
                listen: args.listen,
                metrics_listen: args.metrics_listen,
                api_tokens: tokens.into_iter().map(Secret).collect(),
                jwt,
                cors_origins,
                allowed_hosts: args.allowed_hosts,
                a2a_allow_private_push: args.a2a_allow_private_push,
                max_body_bytes: args.max_body_bytes,
                request_timeout: Duration::from_secs(args.request_timeout_secs),
                max_connections: args.max_connections.map(|n| n as usize),
                header_read_timeout: Duration::from_secs(args.header_read_timeout_secs),
            },
            store: StoreSettings {
                database_url: args.database_url,
                durability: args.durability,
                lease_ttl: Duration::from_secs(args.lease_ttl_secs),
                max_artifact_bytes: args.max_artifact_bytes,
                master_key,
            },
            model: ModelSettings {
                provider,
                api_key: api_key(args.api_key_env.as_deref(), provider),
                model: args.model,
                base_url: args.base_url,
                mock_delay: Duration::from_millis(args.mock_delay_ms),
                max_output_tokens: args.max_output_tokens,
                thinking_budget: (args.thinking_budget > 0).then_some(args.thinking_budget),
                llm_deadline: (args.llm_deadline_secs > 0)
                    .then(|| Duration::from_secs(args.llm_deadline_secs)),
                reply_limits: ReplyLimits {
                    max_reply_bytes: size(args.max_reply_bytes),
                    max_line_bytes: size(args.max_line_bytes),
                    max_tool_calls: args.max_tool_calls as usize,
                    max_argument_bytes: size(args.max_tool_argument_bytes),
                },
                providers,
            },
            run: RunSettings {
                system_prompt: args.system_prompt,
                max_steps: (args.max_steps > 0).then_some(args.max_steps),
                max_session_tokens: args.max_session_tokens,
                max_run_tokens: args.max_run_tokens,
                context_chars: args.context_chars.map(|c| c as usize),
                tool_concurrency: args.tool_concurrency as usize,
                max_concurrent_runs: args.max_concurrent_runs as usize,
                tenant_max_concurrent_runs: args.tenant_max_concurrent_runs.map(|n| n as usize),
                tenant_max_tokens_per_day: args.tenant_max_tokens_per_day,
                tenant_max_cost_usd_per_day: args.tenant_max_cost_usd_per_day,
                auto_resume,
                max_subagent_depth: args.max_subagent_depth,
                max_subagents_per_run: args.max_subagents_per_run,
            },
            tools: ToolSettings {
                builtin,
                workspace: args.workspace,
                shell: ShellSettings {
                    network: shell_network,
                    max_timeout: Duration::from_secs(args.shell_max_timeout_secs),
                    default_timeout: Duration::from_secs(120.min(args.shell_max_timeout_secs)),
                    sandbox: args.sandbox.choice(),
                    limits: Limits {
                        memory_mb: args.shell_memory_mb,
                        pids: args.shell_pids,
                        cpu_s: args.shell_cpu_s,
                        file_mb: args.shell_file_mb,
                        tmp_mb: args.shell_tmp_mb,
                    },
                },
                mcp,
                mcp_timeouts: McpSettings {
                    call_timeout: Duration::from_secs(args.mcp_timeout_secs),
                    handshake_timeout: Duration::from_secs(args.mcp_handshake_timeout_secs),
                },
            },
            policy: PolicySettings {
                rules,
                mode: match args.approval_mode {
                    ApprovalModeArg::Ask => ApprovalMode::Ask,
                    ApprovalModeArg::Deny => ApprovalMode::Deny,
                },
                approval_timeout: (args.approval_timeout_secs > 0)
                    .then(|| Duration::from_secs(args.approval_timeout_secs)),
                worker_lease: Duration::from_secs(args.worker_lease_secs),
            },
            webhooks,
            telemetry: TelemetrySettings {
                log_format: args.log_format,
            },
        })
    }
}

/// The `--jwt-*` flags: all three of the key set's URL, the issuer and the audience, or none
/// (an empty value counts as none).
fn jwt_settings(args: &ServeArgs) -> Result<Option<JwtSettings>, ConfigError> {
    let given = |value: &Option<String>| {
        value
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let (url, issuer, audience) = (
        given(&args.jwt_jwks_url),
        given(&args.jwt_issuer),
        given(&args.jwt_audience),
    );
    let (url, issuer, audience) = match (url, issuer, audience) {
        (None, None, None) => return Ok(None),
        (Some(url), Some(issuer), Some(audience)) => (url, issuer, audience),
        (url, issuer, audience) => {
            let missing = [
                (url.is_none(), "--jwt-jwks-url"),
                (issuer.is_none(), "--jwt-issuer"),
                (audience.is_none(), "--jwt-audience"),
            ];
            return Err(ConfigError::JwtPartial(
                missing
                    .into_iter()
                    .filter_map(|(gone, flag)| gone.then_some(flag))
                    .collect(),
            ));
        }
    };
    let fail = |reason: String| ConfigError::JwtJwksUrl {
        url: url.clone(),
        reason,
    };
    let parsed = reqwest::Url::parse(&url).map_err(|e| fail(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(fail(format!("the scheme is {}", parsed.scheme())));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(fail("no host".into()));
    }
    let claim = |value: &str, flag| match value.trim() {
        "" => Err(ConfigError::JwtClaim(flag)),
        name => Ok(name.to_string()),
    };
    Ok(Some(JwtSettings {
        jwks_url: url,
        issuer,
        audience,
        tenant_claim: claim(&args.jwt_tenant_claim, "--jwt-tenant-claim")?,
        role_claim: claim(&args.jwt_role_claim, "--jwt-role-claim")?,
    }))
}

/// The first provider whose key is present, else the mock.
fn default_provider() -> Provider {
    let has = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty());
    if has("OPENAI_API_KEY") {
        Provider::Openai
    } else if has("ANTHROPIC_API_KEY") {
        Provider::Anthropic
    } else {
        Provider::Mock
    }
}

/// The provider's API key, from `--api-key-env` or the provider's usual variable.
fn api_key(api_key_env: Option<&str>, provider: Provider) -> Option<Secret> {
    let name = match (api_key_env, provider) {
        (Some(name), _) => name,
        (None, Provider::Openai) => "OPENAI_API_KEY",
        (None, Provider::Anthropic) => "ANTHROPIC_API_KEY",
        (None, Provider::Mock) => return None,
    };
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .map(Secret)
}

/// Checks the webhook URLs and reads the secret they need from the environment.
fn webhook_settings(
    urls: &[String],
    secret_env: Option<&str>,
) -> Result<Option<WebhookSettings>, ConfigError> {
    let urls: Vec<String> = urls
        .iter()
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .collect();
    if urls.is_empty() {
        return Ok(None);
    }
    for url in &urls {
        let fail = |reason: String| ConfigError::WebhookUrl {
            url: url.clone(),
            reason,
        };
        let parsed = reqwest::Url::parse(url).map_err(|e| fail(e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(fail(format!("the scheme is {}", parsed.scheme())));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(fail("no host".into()));
        }
    }
    let name = secret_env
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .ok_or(ConfigError::WebhookSecretMissing)?;
    let value = std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| ConfigError::WebhookSecretUnset(name.to_string()))?;
    let invalid = |reason| ConfigError::WebhookSecretInvalid {
        name: name.to_string(),
        reason,
    };
    // A vault reference is resolved once the store is open.
    let secret = if crate::vault::reference::mentions(&value) {
        crate::vault::reference::references(&value)
            .map_err(|_| invalid("it holds a vault reference that is not ${vault:VAULT/NAME}"))?;
        SigningSecret::Vault(value.trim().to_string())
    } else {
        SigningSecret::Value(WebhookSecret::parse(&value).map_err(invalid)?)
    };
    let mut unique = Vec::new();
    for url in urls {
        if !unique.contains(&url) {
            unique.push(url);
        }
    }
    Ok(Some(WebhookSettings {
        urls: unique,
        secret,
    }))
}

/// The rules of a `--tool-policy` file, compiled (which checks their globs).
fn read_policy(path: &Path) -> Result<Rules, ConfigError> {
    let fail = |why: String| ConfigError::Policy {
        path: path.display().to_string(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let rules: Vec<Rule> = serde_json::from_str(&text).map_err(|e| {
        fail(format!(
            "not a JSON array of rules {{tool, match?, action}}: {e}"
        ))
    })?;
    Rules::compile(rules).map_err(|e| fail(e.to_string()))
}

/// The servers of a `--mcp-config` file, `${VAR}` expanded from this process's environment.
fn read_mcp_config(path: &Path) -> Result<McpConfig, ConfigError> {
    let fail = |why: String| ConfigError::Mcp {
        path: path.display().to_string(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    McpConfig::parse(&text, |name| std::env::var(name).ok())
        .map_err(|e: McpConfigError| fail(e.to_string()))
}

/// The providers of a `--providers` file, keys read from this process's environment.
fn read_providers(path: &Path) -> Result<Vec<FileProvider>, ConfigError> {
    let fail = |why: String| ConfigError::Providers {
        path: path.display().to_string(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    providers_file::parse(&text, providers_file::Format::of(path), |name| {
        std::env::var(name).ok()
    })
    .map_err(|e| fail(e.to_string()))
}

/// An origin as browsers write it in `Origin`: `scheme://host[:port]` in lower case, without
/// the scheme's default port or a trailing slash (`*` stays `*`). Anything else cannot match a
/// browser's `Origin`, so it is refused rather than kept as an entry that never matches; the
/// error says what is wrong with it.
fn parse_origin(raw: &str) -> Result<String, &'static str> {
    let origin = raw.trim().to_ascii_lowercase();
    if origin == "*" {
        return Ok(origin);
    }
    let (scheme, rest) = origin
        .split_once("://")
        .ok_or("it has no scheme: start it with http:// or https://")?;
    let default_port = match scheme {
        "http" => "80",
        "https" => "443",
        _ => return Err("its scheme is not http or https"),
    };
    // One trailing slash is how origins are often copied from an address bar.
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        return Err("it has a path, query or fragment: an origin ends after the host and port");
    }
    if authority.contains('@') {
        return Err("it has a user name or password");
    }
    let (host, port) = match authority.strip_prefix('[') {
        // An IPv6 address: [::1] or [::1]:5173.
        Some(v6) => {
            let (address, after) = v6.split_once(']').ok_or("its IPv6 address has no ]")?;
            if address.parse::<std::net::Ipv6Addr>().is_err() {
                return Err("its IPv6 address is not one");
            }
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .ok_or("it has text after the host")?,
                ),
            };
            (&authority[..address.len() + 2], port)
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let host_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
    if host.is_empty() || !(host.starts_with('[') || host.chars().all(host_char)) {
        return Err("its host is missing or not a host name");
    }
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(n) if n > 0 && !port.starts_with('+') => {
                (port != default_port).then(|| n.to_string())
            }
            _ => return Err("its port is not a number from 1 to 65535"),
        },
    };
    Ok(match port {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    })
}

/// A byte count from the command line as a size in memory.
fn size(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// `--shell-network` and, with an allow-list, the test-only `--shell-network-test-resolve`.
fn shell_network(
    value: Option<&str>,
    test_resolve: &[String],
) -> Result<ShellNetwork, ConfigError> {
    use crate::tools::egress::{self, Egress, NetworkChoice};
    let choice = match value {
        Some(value) => egress::parse_network(value)?,
        None => NetworkChoice::None,
    };
    let allow = match choice {
        NetworkChoice::None => return Ok(ShellNetwork::None),
        NetworkChoice::All => return Ok(ShellNetwork::All),
        NetworkChoice::Allow(allow) => allow,
    };
    // The bridge run inside the sandbox is this very program (`tah egress-bridge`).
    let program = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let mut egress = Egress::new(allow, program);
    for pair in test_resolve {
        let bad = |why: &str| ConfigError::ShellNetworkTestResolve(pair.clone(), why.to_string());
        let (host, ip) = pair
            .split_once('=')
            .ok_or_else(|| bad("expected HOST=IP"))?;
        let ip = ip.trim().parse().map_err(|_| bad("not an IP address"))?;
        egress = egress
            .with_test_resolve(host, ip)
            .map_err(|why| bad(&why))?;
        tracing::warn!(host, %ip, "--shell-network-test-resolve: a test-only name is in force");
    }
    Ok(ShellNetwork::Allow(std::sync::Arc::new(egress)))
}

impl SandboxArg {
    /// The backend choice `--sandbox` names.
    pub fn choice(self) -> SandboxChoice {
        match self {
            SandboxArg::Auto => SandboxChoice::Auto,
            SandboxArg::Bwrap => SandboxChoice::Bwrap,
            SandboxArg::Landlock => SandboxChoice::Landlock,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> Result<Settings, ConfigError> {
        let argv = std::iter::once("serve").chain(args.iter().copied());
        Settings::parse(ServeArgs::try_parse_from(argv).expect("valid flags"))
    }

    #[test]
    fn a_public_address_needs_tokens_unless_allowed() {
        assert!(matches!(
            parse(&["--listen", "0.0.0.0:8080"]),
            Err(ConfigError::ExposedWithoutTokens(_))
        ));
        assert!(parse(&["--listen", "0.0.0.0:8080", "--allow-unauthenticated"]).is_ok());
        let token = "a-token-of-enough-length";
        let settings = parse(&["--listen", "0.0.0.0:8080", "--api-token", token]).expect("ok");
        assert_eq!(settings.http.api_tokens[0].expose(), token);
        assert!(
            !format!("{settings:?}").contains(token),
            "tokens are redacted"
        );
    }

    #[test]
    fn a_shell_with_network_needs_tokens() {
        for args in [
            &["--shell-network"][..],
            &[
                "--shell-network",
                "--listen",
                "0.0.0.0:8080",
                "--allow-unauthenticated",
            ],
        ] {
            assert!(
                matches!(parse(args), Err(ConfigError::ShellNetworkWithoutTokens)),
                "{args:?}"
            );
        }
        let token = "a-token-of-enough-length";
        let settings = parse(&["--shell-network", "--api-token", token]).expect("ok");
        assert_eq!(settings.tools.shell.network, ShellNetwork::All);
        for (value, all) in [
            ("true", true),
            ("all", true),
            ("off", false),
            ("none", false),
        ] {
            let flag = format!("--shell-network={value}");
            let settings = parse(&[&flag, "--api-token", token]).expect("ok");
            let expected = if all {
                ShellNetwork::All
            } else {
                ShellNetwork::None
            };
            assert_eq!(settings.tools.shell.network, expected, "{value}");
        }
        let allowed = ["--shell-network", "allow=example.com", "--api-token", token];
        let settings = parse(&allowed).expect("ok");
        assert!(matches!(
            settings.tools.shell.network,
            ShellNetwork::Allow(_)
        ));
        assert!(matches!(
            parse(&["--shell-network", "allow=example.com"]),
            Err(ConfigError::ShellNetworkWithoutTokens)
        ));
        let err = parse(&[
            "--shell-network",
            "allow=ok.example,bad_*",
            "--api-token",
            token,
        ])
        .expect_err("refused");
        assert!(err.to_string().contains("\"bad_*\""), "{err}");
        let test_only = [
            &allowed[..],
            &["--shell-network-test-resolve", "example.com=127.0.0.1"],
        ];
        let err = parse(&test_only.concat()).expect_err("refused");
        assert!(err.to_string().contains(".test"), "{err}");
    }

    #[test]
    fn jwt_flags_come_all_three_or_not_at_all() {
        let jwks = [
            "--jwt-jwks-url",
            "https://idp.example.com/.well-known/jwks.json",
        ];
        let issuer = ["--jwt-issuer", "https://idp.example.com/"];
        let audience = ["--jwt-audience", "tah"];
        assert_eq!(parse(&[]).expect("ok").http.jwt, None);
        let all = [&jwks[..], &issuer, &audience].concat();
        let jwt = parse(&all).expect("ok").http.jwt.expect("JWTs accepted");
        assert_eq!(
            jwt,
            JwtSettings {
                jwks_url: jwks[1].into(),
                issuer: issuer[1].into(),
                audience: audience[1].into(),
                tenant_claim: "tenant".into(),
                role_claim: "role".into(),
            }
        );
        let claims = [
            &all[..],
            &["--jwt-tenant-claim", "org", "--jwt-role-claim", "tah_role"],
        ]
        .concat();
        let jwt = parse(&claims).expect("ok").http.jwt.expect("JWTs accepted");
        assert_eq!((&*jwt.tenant_claim, &*jwt.role_claim), ("org", "tah_role"));

        let partial = parse(&[&jwks[..], &audience].concat()).expect_err("partial");
        assert!(
            matches!(&partial, ConfigError::JwtPartial(missing) if missing == &["--jwt-issuer"]),
            "{partial}"
        );
        assert!(partial.to_string().contains("--jwt-issuer missing"));
        let partial = parse(&issuer).expect_err("partial");
        assert!(
            partial
                .to_string()
                .ends_with("--jwt-jwks-url, --jwt-audience missing"),
            "{partial}"
        );
        assert!(matches!(
            parse(
                &[
                    &["--jwt-jwks-url", "file:///etc/jwks.json"][..],
                    &issuer,
                    &audience
                ]
                .concat()
            ),
            Err(ConfigError::JwtJwksUrl { .. })
        ));
        assert!(matches!(
            parse(&[&all[..], &["--jwt-role-claim", " "]].concat()),
            Err(ConfigError::JwtClaim("--jwt-role-claim"))
        ));
        // JWTs authenticate requests: a public address and a networked shell are allowed.
        let public = [&all[..], &["--listen", "0.0.0.0:8080", "--shell-network"]].concat();
        assert!(parse(&public).is_ok());
    }

    #[test]
    fn weak_tokens_and_odd_origins_are_refused() {
        assert!(matches!(
            parse(&["--api-token", "short"]),
            Err(ConfigError::WeakToken)
        ));
        assert!(matches!(
            parse(&["--api-token", "sixteen chars ok!"]),
            Err(ConfigError::WeakToken)
        ));
        assert!(matches!(
            parse(&["--cors-origin", "example.com"]),
            Err(ConfigError::CorsOrigin { .. })
        ));
        assert!(parse(&["--cors-origin", "*", "--cors-origin", "https://example.com"]).is_ok());
        // An empty token (e.g. TAH_API_TOKENS="") means no token.
        assert!(parse(&["--api-token", ""])
            .expect("ok")
            .http
            .api_tokens
            .is_empty());
    }

    #[test]
    fn cors_origins_are_kept_as_browsers_send_them() {
        let origins = |list: &[&str]| {
            let args: Vec<&str> = list.iter().flat_map(|o| ["--cors-origin", o]).collect();
            parse(&args).map(|settings| settings.http.cors_origins)
        };
        let ok = |list: &[&str]| origins(list).expect("accepted");
        assert_eq!(
            ok(&["http://localhost:5173/"]),
            ["http://localhost:5173"],
            "a trailing slash is dropped"
        );
        assert_eq!(
            ok(&[
                "HTTPS://App.Example.COM",
                "http://example.com:80",
                "https://x.dev:443/"
            ]),
            [
                "https://app.example.com",
                "http://example.com",
                "https://x.dev"
            ],
            "lower case, no default port"
        );
        assert_eq!(
            ok(&[
                "http://[::1]:5173",
                "https://[2001:db8::1]",
                "*",
                " http://a.test:8443 "
            ]),
            [
                "http://[::1]:5173",
                "https://[2001:db8::1]",
                "*",
                "http://a.test:8443"
            ]
        );
        for bad in [
            "http://localhost:5173/app",
            "http://localhost:5173//",
            "https://example.com/?x=1",
            "https://example.com#top",
            "https://user:pw@example.com",
            "ftp://example.com",
            "localhost:5173",
            "http://",
            "http://:8080",
            "http://exa mple.com",
            "http://example.com:0",
            "http://example.com:99999",
            "http://example.com:port",
            "http://[::1",
            "http://[nope]:80",
        ] {
            let error = origins(&[bad]).expect_err(bad);
            let message = error.to_string();
            assert!(
                matches!(error, ConfigError::CorsOrigin { .. })
                    && message.contains(bad)
                    && message.contains("scheme://host[:port]"),
                "{bad}: {message}"
            );
        }
        let path = origins(&["http://localhost:5173/app"]).expect_err("a path");
        assert!(path.to_string().contains("has a path"), "{path}");
    }

    #[test]
    fn boolean_values_take_the_usual_spellings() {
        let resume = |value: &str| {
            parse(&[&format!("--auto-resume={value}")])
                .expect("accepted")
                .run
                .auto_resume
        };
        for yes in ["true", "TRUE", "True", "1", "yes", "YES", "Yes", "on", "y"] {
            assert!(resume(yes), "{yes}");
        }
        for no in ["false", "FALSE", "False", "0", "no", "NO", "No", "off", "n"] {
            assert!(!resume(no), "{no}");
        }
        assert!(parse(&["--auto-resume"]).expect("ok").run.auto_resume);
        let refused = ServeArgs::try_parse_from(["serve", "--auto-resume=maybe"]);
        assert!(refused.is_err(), "an unknown spelling is an error");
        let exposed = ["--listen", "0.0.0.0:8080", "--allow-unauthenticated"];
        assert!(parse(&exposed).is_ok());
    }

    #[test]
    fn a_thinking_budget_is_off_or_at_least_what_anthropic_takes() {
        assert_eq!(parse(&[]).expect("ok").model.thinking_budget, None);
        assert_eq!(
            parse(&["--thinking-budget", "0"])
                .expect("ok")
                .model
                .thinking_budget,
            None
        );
        let on = parse(&["--thinking-budget", "2048"]).expect("ok");
        assert_eq!(on.model.thinking_budget, Some(2048));
        let small = parse(&["--thinking-budget", "1023"]).expect_err("too small");
        assert!(matches!(small, ConfigError::ThinkingBudget(1023)));
        assert!(small.to_string().contains("1024"), "{small}");
    }

    #[test]
    fn derived_values_are_decided_once() {
        let sqlite = parse(&["--max-steps", "0", "--context-chars", "700"]).expect("ok");
        assert_eq!(sqlite.run.max_steps, None);
        assert_eq!(sqlite.run.context_chars, Some(700));
        assert!(!sqlite.run.auto_resume);
        let postgres = parse(&["--database-url", "postgres://h/db", "--provider", "mock"]);
        let postgres = postgres.expect("ok");
        assert!(postgres.run.auto_resume);
        assert_eq!(postgres.run.max_steps, Some(20));
        assert_eq!(postgres.model.provider, Provider::Mock);
        assert!(postgres.model.api_key.is_none());
        let off = parse(&["--database-url", "postgres://h/db", "--auto-resume=false"]);
        assert!(!off.expect("ok").run.auto_resume);
    }

    #[test]
    fn tenant_limits_are_off_unless_given_and_at_least_one() {
        let none = parse(&[]).expect("ok");
        assert_eq!(none.run.tenant_max_concurrent_runs, None);
        assert_eq!(none.run.tenant_max_tokens_per_day, None);
        let set = parse(&[
            "--tenant-max-concurrent-runs",
            "3",
            "--tenant-max-tokens-per-day",
            "100000",
        ])
        .expect("ok");
        assert_eq!(set.run.tenant_max_concurrent_runs, Some(3));
        assert_eq!(set.run.tenant_max_tokens_per_day, Some(100_000));
        for flag in [
            "--tenant-max-concurrent-runs",
            "--tenant-max-tokens-per-day",
        ] {
            let zero = ServeArgs::try_parse_from(["serve", flag, "0"]);
            assert!(zero.is_err(), "{flag} 0 is refused");
        }
    }

    #[test]
    fn an_mcp_config_is_read_at_start_and_a_missing_variable_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("mcp.json");
        let path = file.to_str().expect("utf-8 path");
        std::fs::write(
            &file,
            r#"{"mcpServers": {"files": {"command": "srv", "args": ["${PATH}"]}}}"#,
        )
        .expect("write");
        let settings = parse(&["--mcp-config", path, "--mcp-timeout-s", "7"]).expect("ok");
        assert_eq!(settings.tools.mcp.names(), ["files"]);
        assert_eq!(
            settings.tools.mcp_timeouts.call_timeout,
            Duration::from_secs(7)
        );
        assert_eq!(
            settings.tools.mcp_timeouts.handshake_timeout,
            Duration::from_secs(30)
        );
        std::fs::write(
            &file,
            r#"{"mcpServers": {"gh": {"type": "http", "url": "https://x/mcp",
                "headers": {"Authorization": "Bearer ${TAH_TEST_NEVER_SET_VARIABLE}"}}}}"#,
        )
        .expect("write");
        let error = parse(&["--mcp-config", path]).expect_err("missing variable");
        let message = error.to_string();
        assert!(
            message.contains(path) && message.contains("${TAH_TEST_NEVER_SET_VARIABLE}"),
            "{message}"
        );
        assert!(parse(&[]).expect("ok").tools.mcp.servers.is_empty());
        let missing = parse(&["--mcp-config", "/nonexistent/mcp.json"]).expect_err("no file");
        assert!(
            missing.to_string().starts_with("--mcp-config /nonexistent"),
            "{missing}"
        );
    }

    #[test]
    fn a_providers_file_is_read_at_start_and_a_refusal_names_file_and_field() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("providers.toml");
        let path = file.to_str().expect("utf-8 path");
        std::fs::write(
            &file,
            "[providers.local]\ntype = \"openai\"\nbase_url = \"http://127.0.0.1:8000/v1\"\n",
        )
        .expect("write");
        let settings = parse(&["--providers", path]).expect("ok");
        assert_eq!(settings.model.providers.len(), 1);
        assert_eq!(settings.model.providers[0].name, "local");
        std::fs::write(&file, "[providers.default]\ntype = \"mock\"\n").expect("write");
        let error = parse(&["--providers", path]).expect_err("reserved name");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("--providers {path}: providers.default: ")),
            "{message}"
        );
        assert!(parse(&[]).expect("ok").model.providers.is_empty());
    }
}
