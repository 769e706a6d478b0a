//! The command line of the `tah` binary: clap types and nothing else. Every flag has an
//! environment fallback (the flag wins). This module holds what a user types, unchecked;
//! [`crate::config::Settings::parse`] turns `tah serve`'s flags into validated settings, and
//! the binary's load generator reads [`BenchArgs`] and [`FakeModelArgs`] (both with the fake
//! model's [`FakeReplyArgs`]), and its probe [`HealthcheckArgs`]. Boolean values are read by
//! [`boolish`], so `TAH_AUTO_RESUME=1` and `--auto-resume=Yes` work as `true` does.
//!
//! It imports nothing from the rest of the crate, so that `config` and the binary's `bench`
//! can both depend on it without depending on each other.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// tah — an agent session server: long-running LLM agent sessions over REST and SSE.
#[derive(Debug, Parser)]
#[command(name = "tah", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What `tah serve --help` says about the ready line, after the flags.
const SERVE_AFTER_HELP: &str = "\
Once it accepts connections, `tah serve` writes exactly one line to stdout, a JSON object with \
the address it listens on, e.g. {\"listening\":\"127.0.0.1:43123\"} (with --listen \
127.0.0.1:0 the port is chosen by the system). Logs go to stderr.";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API (sessions, runs, events over SSE) until SIGINT/SIGTERM.
    #[command(after_help = SERVE_AFTER_HELP)]
    Serve(Box<ServeArgs>),
    /// Serve a fake OpenAI-compatible model (streaming Chat Completions, with tool calls) on
    /// loopback: try `tah serve --provider openai --base-url http://ADDRESS/v1` offline, or
    /// test and benchmark against it.
    FakeModel(FakeModelArgs),
    /// Drive a tah server with concurrent sessions and report throughput, latency, CPU and
    /// memory, side by side with the same workload sent straight to the model.
    Bench(Box<BenchArgs>),
    /// Probe a running server's GET /readyz: exit 0 when it answers 200, else 1, saying why
    /// (the container image's HEALTHCHECK).
    Healthcheck(HealthcheckArgs),
    /// Make, list and revoke API keys (principals of one tenant, in a role) in the database
    /// `tah serve` uses; a running server sees them at once.
    Keys(KeysArgs),
    /// Speak the Agent Client Protocol on stdin and stdout, bridged to a tah server.
    Acp(AcpArgs),
    /// Run the built-in tool calls of a `workers` environment on this machine: dials out to
    /// the server (no inbound port), claims calls, runs them in its own workspace and
    /// sandbox, and sends their results back.
    Worker(WorkerArgs),
    /// Internal: what tah starts inside a `shell` sandbox under `--shell-network allow=…`,
    /// forwarding TCP connections on the sandbox's loopback to the egress proxy's unix socket.
    EgressBridge(EgressBridgeArgs),
}

/// `tah egress-bridge` (internal).
#[derive(Debug, Args)]
pub struct EgressBridgeArgs {
    /// The address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The proxy's unix socket.
    #[arg(long)]
    pub socket: PathBuf,
}

/// How boolean flags and environment variables are read: `true`/`false`, `1`/`0`,
/// `yes`/`no`, `on`/`off` (also `y`/`n`, `t`/`f`), in any case.
pub fn boolish() -> BoolishValueParser {
    BoolishValueParser::new()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Provider {
    /// Deterministic offline model: lists the workspace, reads its README, summarises.
    Mock,
    /// Any OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, Ollama, llama.cpp…).
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

/// `--sandbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SandboxArg {
    Auto,
    Bwrap,
    Landlock,
}

/// `--approval-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ApprovalModeArg {
    Ask,
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The system prompt of every run unless `--system-prompt` says otherwise.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are tah, a careful assistant working in a \
     workspace of files. Use the tools to look at files before you answer, and answer concisely.";

/// `tah serve`'s flags as typed, before validation. It also parses on its own
/// (`ServeArgs::try_parse_from(["serve", "--listen", "127.0.0.1:0", …])`), which is how a
/// program that embeds the server reads the same flags.
#[derive(Debug, Clone, Parser)]
#[command(name = "serve")]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "TAH_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Address to serve GET /metrics on, apart from the API: then the API's address answers
    /// /metrics with 404. Unset: /metrics is served beside the API, open like /healthz.
    #[arg(long, env = "TAH_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Database URL: sqlite://PATH (the file and its parent directory are created), or
    /// postgres://USER:PASSWORD@HOST/DB (also postgresql://…), which several replicas can
    /// share.
    #[arg(
        long,
        env = "TAH_DATABASE_URL",
        default_value = "sqlite://.tah/data.db"
    )]
    pub database_url: String,

    /// What an acknowledged commit survives: `process` (the server killed, `kill -9`; the
    /// default) or `power` (a power loss or a kernel crash too: the log is synced before each
    /// commit is acknowledged, at a cost in throughput).
    #[arg(long, env = "TAH_DURABILITY", value_enum, default_value_t = crate::store::Durability::Process)]
    pub durability: crate::store::Durability,

    /// Directory the tools work in (it must exist); nothing outside it is reachable.
    #[arg(long, env = "TAH_WORKSPACE", default_value = ".")]
    pub workspace: PathBuf,

    /// Bytes one artifact may have, N ≥ 1: a file that write_file or edit_file leaves larger
    /// is written but not kept as an artifact (the call's result says so).
    #[arg(long, env = "TAH_MAX_ARTIFACT_BYTES", default_value_t = 10 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_artifact_bytes: u64,

    /// Model provider. Default: openai if OPENAI_API_KEY is set, else anthropic if
    /// ANTHROPIC_API_KEY is set, else mock.
    #[arg(long, env = "TAH_PROVIDER", value_enum)]
    pub provider: Option<Provider>,

    /// Model name. Default per provider: gpt-4o-mini (openai), claude-sonnet-4-5
    /// (anthropic).
    #[arg(long, env = "TAH_MODEL")]
    pub model: Option<String>,

    /// Provider base URL. Default: the provider's public endpoint,
    /// https://api.openai.com/v1 (openai) or https://api.anthropic.com (anthropic).
    #[arg(long, env = "TAH_BASE_URL")]
    pub base_url: Option<String>,

    /// Name of the environment variable holding the provider's API key (default
    /// OPENAI_API_KEY or ANTHROPIC_API_KEY). Keys are never taken from a flag value.
    #[arg(long, env = "TAH_API_KEY_ENV")]
    pub api_key_env: Option<String>,

    /// A file of named model providers beside `default` (the one the flags above define),
    /// JSON, or TOML when its name ends in .toml: {"providers": {NAME: {"type":
    /// "openai"|"anthropic"|"mock", "base_url", "api_key_env", "headers", "max_output_tokens",
    /// "prices": {MODEL: {"input_per_mtok", "output_per_mtok", "cache_read_per_mtok"}}}}}.
    /// Agents name a model on one as "NAME/MODEL".
    #[arg(long, env = "TAH_PROVIDERS")]
    pub providers: Option<PathBuf>,

    /// System prompt of every run (current configuration wins, also for older sessions that
    /// did not set their own).
    #[arg(long, env = "TAH_SYSTEM_PROMPT", default_value = DEFAULT_SYSTEM_PROMPT, hide_default_value = true)]
    pub system_prompt: String,

    /// LLM calls per run at most; 0 = unlimited.
    #[arg(long, env = "TAH_MAX_STEPS", default_value_t = 20)]
    pub max_steps: u32,

    /// Tokens (input + output) a session may use over all its runs, N ≥ 1, unless it was
    /// created with its own max_tokens; a step that would start over it ends the run failed
    /// with finish_reason budget. Unset: no limit.
    #[arg(long, env = "TAH_MAX_SESSION_TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_session_tokens: Option<u64>,

    /// Tokens (input + output) one run may use, N ≥ 1, unless its session was created with its
    /// own max_run_tokens; a step that would start over it ends the run failed with
    /// finish_reason budget. Unset: no limit.
    #[arg(long, env = "TAH_MAX_RUN_TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_run_tokens: Option<u64>,

    /// Character budget of each model request, N ≥ 1; unset = send the full history.
    #[arg(long, env = "TAH_CONTEXT_CHARS", value_parser = clap::value_parser!(u64).range(1..))]
    pub context_chars: Option<u64>,

    /// Delay between the mock model's text pieces, in milliseconds.
    #[arg(long, env = "TAH_MOCK_DELAY_MS", default_value_t = 0)]
    pub mock_delay_ms: u64,

    /// Largest accepted request body, in bytes; a larger one is answered 413.
    #[arg(long, env = "TAH_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// API token clients must send as `Authorization: Bearer <token>` on every /v1 route: 16
    /// or more characters, no spaces (repeatable; the env var takes a comma-separated list).
    /// None: no authentication, which only a loopback address allows.
    #[arg(
        long = "api-token",
        env = "TAH_API_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_tokens: Vec<String>,

    /// Allow listening on a non-loopback address without API tokens (the env var takes
    /// true/false, 1/0, yes/no or on/off, in any case).
    #[arg(long, env = "TAH_ALLOW_UNAUTHENTICATED", value_parser = boolish())]
    pub allow_unauthenticated: bool,

    /// URL of the JSON Web Key Set that bearer JWTs (RS256, ES256) are verified against, such
    /// as an OpenID Connect provider's jwks_uri. Needs --jwt-issuer and --jwt-audience; with
    /// them, a JWT's `sub` is a member of the tenant its tenant claim names.
    #[arg(long, env = "TAH_JWT_JWKS_URL")]
    pub jwt_jwks_url: Option<String>,

    /// The `iss` every bearer JWT must carry (with --jwt-jwks-url).
    #[arg(long, env = "TAH_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// A value a bearer JWT's `aud` (a string or an array) must hold (with --jwt-jwks-url).
    #[arg(long, env = "TAH_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// The JWT claim that names the principal's tenant (required in every token).
    #[arg(long, env = "TAH_JWT_TENANT_CLAIM", default_value = "tenant")]
    pub jwt_tenant_claim: String,

    /// The JWT claim that names the principal's role: admin, member or viewer (absent:
    /// member).
    #[arg(long, env = "TAH_JWT_ROLE_CLAIM", default_value = "role")]
    pub jwt_role_claim: String,

    /// Origin allowed to call the API from a browser: scheme://host[:port], such as
    /// http://localhost:5173 (a trailing / is dropped; a path or query is refused), or * for
    /// any (repeatable; the env var takes a comma-separated list). None: no cross-origin
    /// access.
    #[arg(long = "cors-origin", env = "TAH_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Runs (turns and resumes, automatic ones included; compactions do not count) in
    /// progress at once in this process, N ≥ 1; further ones get 429 with Retry-After (a
    /// sub-agent's run waits in line instead).
    #[arg(long, env = "TAH_MAX_CONCURRENT_RUNS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_runs: u32,

    /// Runs in progress at once per tenant on this replica, N ≥ 1 (a sub-agent tree counts as
    /// one run; a run continued after an answer is never refused); further ones get 429
    /// tenant-limit with Retry-After. Unset: no limit.
    #[arg(long, env = "TAH_TENANT_MAX_CONCURRENT_RUNS", value_parser = clap::value_parser!(u32).range(1..))]
    pub tenant_max_concurrent_runs: Option<u32>,

    /// Tokens (input + output of LLM steps) a tenant's sessions may use per day (UTC), N ≥ 1,
    /// read from the shared database; once used, new runs get 429 tenant-limit until 00:00
    /// UTC (a run already started finishes). Unset: no limit.
    #[arg(long, env = "TAH_TENANT_MAX_TOKENS_PER_DAY", value_parser = clap::value_parser!(u64).range(1..))]
    pub tenant_max_tokens_per_day: Option<u64>,

    /// US dollars, a positive number, that a tenant's LLM steps may cost per day (UTC): the
    /// sum of their `cost_usd` (steps of models with prices in the providers file) since
    /// 00:00 UTC. Checked before each LLM step: a run that reaches it ends with
    /// `finish_reason: budget` and can be resumed after 00:00 UTC or once the cap is raised.
    /// Unset: no cap.
    #[arg(long, env = "TAH_TENANT_MAX_COST_USD_PER_DAY", value_parser = positive_usd)]
    pub tenant_max_cost_usd_per_day: Option<f64>,

    /// Seconds, N ≥ 1, that a request to the session, fork, message and step routes may take
    /// before it is answered 408; never applied to events, runs (`?wait=true` included),
    /// resume, cancel or compaction.
    #[arg(long, env = "TAH_REQUEST_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_secs: u64,

    /// Resume runs interrupted by a crash or a stop by itself, at start (and, with
    /// PostgreSQL, when taking over a dead replica's sessions). Default: on with PostgreSQL,
    /// off with SQLite (resume stays the client's call). Takes true/false, 1/0, yes/no or
    /// on/off, in any case; the flag alone means true.
    #[arg(long, env = "TAH_AUTO_RESUME", num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
    pub auto_resume: Option<bool>,

    /// Seconds (1–3600) a replica's lease on a session lasts without renewal (PostgreSQL): a
    /// dead replica's runs are taken over after about this long.
    #[arg(long, env = "TAH_LEASE_TTL_SECS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub lease_ttl_secs: u64,

    /// Host name the server answers to besides localhost, 127.0.0.1, ::1 and the listen
    /// address (repeatable; `*.example.com` matches subdomains; `*` answers any). Guards a
    /// server without API tokens against DNS rebinding; with tokens and none given, any name
    /// is answered.
    #[arg(
        long = "allowed-host",
        env = "TAH_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,

    /// Let A2A push notifications go to private, loopback and link-local addresses (refused
    /// by default: a client must not make the server call into its own network).
    #[arg(long, env = "TAH_A2A_ALLOW_PRIVATE_PUSH", value_parser = boolish())]
    pub a2a_allow_private_push: bool,

    /// Connections open at once at most, N ≥ 1; one more is answered 503 and closed. Default:
    /// the process's open-file limit less 256.
    #[arg(long, env = "TAH_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: Option<u32>,

    /// Seconds (1–3600) a client has to send a request's headers; a keep-alive connection
    /// that sends no next request for this long is closed too (never a response in progress,
    /// such as an SSE stream).
    #[arg(long, env = "TAH_HEADER_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_read_timeout_secs: u64,

    /// Tokens one model reply may have, N ≥ 1 (sent to the provider as `max_tokens`, or
    /// `max_completion_tokens` to api.openai.com).
    #[arg(long, env = "TAH_MAX_OUTPUT_TOKENS", default_value_t = 8192, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_output_tokens: u32,

    /// Anthropic extended thinking: tokens the model may think with before each reply, 0 (no
    /// thinking) or at least 1024, asked for on top of --max-output-tokens. Its thinking is
    /// streamed, stored and sent back as the API requires; the other providers ignore this.
    #[arg(long, env = "TAH_THINKING_BUDGET", default_value_t = 0)]
    pub thinking_budget: u32,

    /// Bytes one model reply may have as received (the provider's event stream), at least
    /// 1024; a larger one ends the LLM step with an error.
    #[arg(long, env = "TAH_MAX_REPLY_BYTES", default_value_t = 8 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..))]
    pub max_reply_bytes: u64,

    /// Bytes one line of a provider's event stream may have, at least 1024; a longer one
    /// ends the LLM step with an error.
    #[arg(long = "max-sse-line-bytes", env = "TAH_MAX_SSE_LINE_BYTES", default_value_t = 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..))]
    pub max_line_bytes: u64,

    /// Tool calls one model reply may ask for, N ≥ 1; more end the LLM step with an error.
    #[arg(long, env = "TAH_MAX_TOOL_CALLS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tool_calls: u32,

    /// Bytes of one tool call's arguments, N ≥ 1; larger ones end the LLM step with an error.
    #[arg(long, env = "TAH_MAX_TOOL_ARGUMENT_BYTES", default_value_t = 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tool_argument_bytes: u64,

    /// Seconds one model call may take in all, retries included; 0 = no limit beyond the
    /// connect, first-byte and idle timeouts.
    #[arg(
        long = "llm-deadline-s",
        env = "TAH_LLM_DEADLINE_S",
        default_value_t = 300
    )]
    pub llm_deadline_secs: u64,

    /// Built-in tools offered to the model (comma-separated; default: all of them, `shell` only
    /// where its sandbox works): list_files, read_file, glob, grep, write_file, edit_file,
    /// shell. A session may narrow them further with `tools` at creation.
    #[arg(long = "tools", env = "TAH_TOOLS", value_delimiter = ',')]
    pub tools: Vec<String>,

    /// Calls of one model reply that run at once at most (those the policy allows).
    #[arg(long, env = "TAH_TOOL_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub tool_concurrency: u32,

    /// A JSON file with the server's policy rules: `[{"tool": GLOB, "match": GLOB, "action":
    /// "allow"|"ask"|"deny"}]`. With no rule matching, list_files, read_file, glob and grep are
    /// allowed and every other tool asks for approval.
    #[arg(long, env = "TAH_TOOL_POLICY")]
    pub tool_policy: Option<std::path::PathBuf>,

    /// What a call the policy would ask about does where nobody can answer: `ask` waits for an
    /// approval, `deny` refuses it (recorded as decided by the policy).
    #[arg(long, env = "TAH_APPROVAL_MODE", value_enum, default_value = "ask")]
    pub approval_mode: ApprovalModeArg,

    /// Seconds an approval (or a client tool's result) is waited for; then the call is
    /// resolved as unanswered and the model is told so. 0 = wait for ever.
    #[arg(
        long = "approval-timeout-s",
        env = "TAH_APPROVAL_TIMEOUT_S",
        default_value_t = 900
    )]
    pub approval_timeout_secs: u64,

    /// How long a worker's claim on a tool call of a `workers` environment lasts without a
    /// heartbeat (the worker renews it every third of this while the call runs). After it ran
    /// out, a file tool's call is offered to the environment's workers again, and a `shell`
    /// call is answered to the model as interrupted.
    #[arg(
        long = "worker-lease-s",
        env = "TAH_WORKER_LEASE_S",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub worker_lease_secs: u64,

    /// What `shell` commands may reach: `none` (the default: no network, not even loopback),
    /// `all` (the host's network), or `allow=HOST[:PORT],…` (only those, through an HTTP
    /// proxy tah runs for each call; HOST is a name, `*.` and a domain for its subdomains, or
    /// an IP address, IPv6 in brackets; without PORT, 80 and 443). `--shell-network` alone
    /// means `all`, and the boolean words it took before (true/false, 1/0, yes/no, on/off)
    /// mean `all` and `none`. Anything but `none` needs API tokens: a command could otherwise
    /// use this server's own API.
    #[arg(
        long,
        env = "TAH_SHELL_NETWORK",
        num_args = 0..=1,
        default_missing_value = "all",
        value_name = "allow=HOST[:PORT],…|all|none"
    )]
    pub shell_network: Option<String>,

    /// Test only, never in production: with `--shell-network allow=…`, the egress proxy
    /// resolves HOST (a name under `.test`, which no DNS answers) to IP and connects to it
    /// whatever its range, loopback included. Repeatable; no environment variable.
    #[arg(
        long = "shell-network-test-resolve",
        hide = true,
        value_name = "HOST=IP"
    )]
    pub shell_network_test_resolve: Vec<String>,

    /// The longest `timeout_s` a `shell` call may ask for, in seconds (the default is 120).
    #[arg(long = "shell-max-timeout-s", env = "TAH_SHELL_MAX_TIMEOUT_S", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub shell_max_timeout_secs: u64,

    /// The sandbox `shell` runs in: `bwrap` (bubblewrap; needs user namespaces), `landlock`
    /// (Landlock + seccomp; works in a default container), or `auto`: bwrap where it works,
    /// else landlock. Where the chosen one cannot work, `shell` is not offered.
    #[arg(long, env = "TAH_SANDBOX", value_enum, default_value = "auto")]
    pub sandbox: SandboxArg,

    /// Memory of one `shell` call, all its processes together, in MB (where the server may
    /// make cgroups; else the address space of each process).
    #[arg(long = "shell-memory-mb", env = "TAH_SHELL_MEMORY_MB", default_value_t = 2048, value_parser = clap::value_parser!(u64).range(16..=1_048_576))]
    pub shell_memory_mb: u64,

    /// Processes (and threads) of one `shell` call at once.
    #[arg(long = "shell-pids", env = "TAH_SHELL_PIDS", default_value_t = 256, value_parser = clap::value_parser!(u64).range(8..=1_000_000))]
    pub shell_pids: u64,

    /// CPU seconds of each process of a `shell` call (default: the call's timeout).
    #[arg(long = "shell-cpu-s", env = "TAH_SHELL_CPU_S", value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub shell_cpu_s: Option<u64>,

    /// The largest file a `shell` command may write, in MB.
    #[arg(long = "shell-file-mb", env = "TAH_SHELL_FILE_MB", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub shell_file_mb: u64,

    /// The size of a `shell` call's private /tmp, in MB.
    #[arg(long = "shell-tmp-mb", env = "TAH_SHELL_TMP_MB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub shell_tmp_mb: u64,

    /// How deep sub-agents may nest: a session at this depth is not offered the `task` tool
    /// (1: sessions a client created may start sub-agents, which may not start their own; 0:
    /// no sub-agents).
    #[arg(long, env = "TAH_MAX_SUBAGENT_DEPTH", default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=8))]
    pub max_subagent_depth: u32,

    /// Sub-agent sessions one top-level run may start, N ≥ 1, counting those of its
    /// sub-agents at every depth; past it `task` answers the model with an error.
    #[arg(long, env = "TAH_MAX_SUBAGENTS_PER_RUN", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_subagents_per_run: u32,

    /// A JSON file of MCP servers whose tools are offered as mcp__<server>__<tool>, in the
    /// format other MCP hosts use: {"mcpServers": {NAME: {"command", "args", "env", "cwd"} or
    /// {"type": "http", "url", "headers"}}}. ${VAR} in its strings is taken from tah's
    /// environment (a variable that is not set is an error).
    #[arg(long, env = "TAH_MCP_CONFIG")]
    pub mcp_config: Option<PathBuf>,

    /// Seconds one MCP tool call may take; then it is cancelled (the server is told) and the
    /// model gets an error.
    #[arg(long = "mcp-timeout-s", env = "TAH_MCP_TIMEOUT_S", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub mcp_timeout_secs: u64,

    /// Seconds an MCP server has to start, answer the handshake and list its tools (and an HTTP
    /// server to answer the ping it gets every 5 s); then it is stopped and started again later.
    #[arg(long = "mcp-handshake-timeout-s", env = "TAH_MCP_HANDSHAKE_TIMEOUT_S", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub mcp_handshake_timeout_secs: u64,

    /// URL that agent.finished, agent.failed, agent.cancelled, tool.approval-requested and
    /// tool.client-requested events are POSTed to, signed per the Standard Webhooks spec and
    /// retried for 24 hours (repeatable; the env var takes a comma-separated list). Needs
    /// --webhook-secret-env.
    #[arg(long = "webhook-url", env = "TAH_WEBHOOK_URLS", value_delimiter = ',')]
    pub webhook_urls: Vec<String>,

    /// Name of the environment variable holding the webhook signing secret, whsec_<base64>
    /// as the Standard Webhooks spec has it (16 bytes or more). Secrets are never taken from a
    /// flag value.
    #[arg(long, env = "TAH_WEBHOOK_SECRET_ENV")]
    pub webhook_secret_env: Option<String>,

    /// Name of the environment variable holding the vaults' master key: 32 bytes as 64 hex
    /// characters or as base64. Vault secrets are sealed under it; without it the vault routes
    /// answer 409. Keys are never taken from a flag value.
    #[arg(long, env = "TAH_MASTER_KEY_ENV")]
    pub master_key_env: Option<String>,

    /// Log format.
    #[arg(long, env = "TAH_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Put messages, tool arguments and tool results into the trace spans (traces go out over
    /// OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set); without it spans carry no content. The
    /// env var takes true/false, 1/0, yes/no or on/off, in any case.
    #[arg(long, env = "TAH_TRACE_CONTENT", value_parser = boolish())]
    pub trace_content: bool,
}

/// The replies of the fake model, as `tah fake-model` serves them and as `tah bench` has them
/// served (by the fake model it starts, or by the one at --fake-model-url for the floor).
#[derive(Debug, Clone, Args)]
pub struct FakeReplyArgs {
    /// Fake model: content chunks per text reply.
    #[arg(long, default_value_t = 50)]
    pub pieces: usize,

    /// Fake model: delay between two content chunks, in milliseconds (`tah bench --provider
    /// mock`: the server's --mock-delay-ms).
    #[arg(long, default_value_t = 0)]
    pub piece_delay_ms: u64,

    /// Fake model: tool-call replies per turn before the text reply (counted from the `tool`
    /// messages after the last user message).
    #[arg(long, default_value_t = 1)]
    pub tool_calls: usize,
}

/// `tah acp`'s flags.
#[derive(Debug, Clone, Args)]
pub struct AcpArgs {
    /// The tah server's URL, e.g. http://127.0.0.1:8080.
    #[arg(long, env = "TAH_SERVER")]
    pub server: String,
    /// The agent of the sessions it makes (default: the server's default agent).
    #[arg(long, env = "TAH_AGENT")]
    pub agent: Option<String>,
    /// The API token or key it sends (`Authorization: Bearer`); better in the environment.
    #[arg(long, env = "TAH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// `tah worker`'s flags.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// The tah server's URL, e.g. http://127.0.0.1:8080.
    #[arg(long, env = "TAH_SERVER")]
    pub server: String,
    /// The API key it authenticates with (a member or an admin of the environment's tenant);
    /// better in the environment.
    #[arg(long, env = "TAH_TOKEN", hide_env_values = true)]
    pub token: String,
    /// The `workers` environment whose calls it runs (its name or id).
    #[arg(long, env = "TAH_ENVIRONMENT")]
    pub environment: String,
    /// The directory its tools work in (created if missing).
    #[arg(long, env = "TAH_WORKSPACE")]
    pub workspace: std::path::PathBuf,
    /// How long one claim request waits on the server for a call, in seconds (1-60).
    #[arg(
        long = "poll-s",
        env = "TAH_WORKER_POLL_S",
        default_value_t = 20,
        value_parser = clap::value_parser!(u64).range(1..=60)
    )]
    pub poll_secs: u64,
    /// The sandbox `shell` runs in, as `tah serve --sandbox`: `auto` (bwrap where it works,
    /// else landlock), `bwrap` or `landlock`.
    #[arg(long, env = "TAH_SANDBOX", value_enum, default_value = "auto")]
    pub sandbox: SandboxArg,
}

/// `tah keys`' flags.
#[derive(Debug, Clone, Args)]
pub struct KeysArgs {
    /// The database, as `tah serve --database-url`.
    #[arg(
        long,
        env = "TAH_DATABASE_URL",
        default_value = "sqlite://.tah/data.db",
        global = true
    )]
    pub database_url: String,

    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum KeysCommand {
    /// Make a key and print it once (only its hash is stored).
    Create {
        /// The tenant the key acts in (1–128 of A-Z a-z 0-9 - _ .).
        #[arg(long)]
        tenant: String,
        /// admin (everything in the tenant), member (its own sessions), viewer (reads).
        #[arg(long)]
        role: String,
        /// A name to know it by.
        #[arg(long)]
        name: Option<String>,
    },
    /// List the keys (never the keys themselves), newest first.
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a key by its id: it is refused from the next request on.
    Revoke {
        /// The key's id (as `tah keys list` shows it).
        id: String,
    },
}

/// `tah healthcheck`'s flags.
#[derive(Debug, Clone, Args)]
pub struct HealthcheckArgs {
    /// URL to probe. Default: /readyz on the address `tah serve` listens on (--listen, which
    /// reads TAH_LISTEN as `tah serve` does), http://127.0.0.1:8080/readyz unless set.
    #[arg(long)]
    pub url: Option<String>,

    /// The address the server listens on, probed when --url is not given; an unspecified
    /// address (0.0.0.0, [::]) is probed on loopback.
    #[arg(long, env = "TAH_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Seconds (1–3600) to wait for the answer.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout_secs: u64,
}

#[derive(Debug, Clone, Args)]
pub struct FakeModelArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,

    #[command(flatten)]
    pub reply: FakeReplyArgs,

    /// Stamp every piece with its send time (`⏱<unix-micros>⏱ `), not only the first.
    #[arg(long)]
    pub stamp_every_piece: bool,
}

/// The model behind the server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchProvider {
    /// The fake OpenAI-compatible model over HTTP (in-process unless `--server` is given).
    Fake,
    /// The server's built-in mock model (no network, no floor).
    Mock,
}

impl BenchProvider {
    pub fn as_str(self) -> &'static str {
        match self {
            BenchProvider::Fake => "fake",
            BenchProvider::Mock => "mock",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Concurrent sessions.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    pub concurrency: usize,

    /// Sequential turns per session.
    #[arg(long, default_value_t = 20)]
    pub turns: usize,

    /// SSE subscribers per session, opened before the first turn; each must receive every
    /// event exactly once.
    #[arg(long, default_value_t = 0)]
    pub subscribers: usize,

    /// The model behind the server.
    #[arg(long, value_enum, default_value = "fake")]
    pub provider: BenchProvider,

    #[command(flatten)]
    pub reply: FakeReplyArgs,

    /// Use this running server (e.g. http://127.0.0.1:8080) instead of spawning one; CPU and
    /// memory figures then need --server-pid.
    #[arg(long)]
    pub server: Option<String>,

    /// The pid of the --server process, for CPU and memory from /proc.
    #[arg(long)]
    pub server_pid: Option<u32>,

    /// With --server: the fake model it talks to (e.g. http://127.0.0.1:9090/v1), for the
    /// floor; it must run with the same --pieces/--tool-calls.
    #[arg(long)]
    pub fake_model_url: Option<String>,

    /// With --server: the API token to send as a bearer token.
    #[arg(long, env = "TAH_BENCH_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,

    /// SSE subscribers connect to this server instead (e.g. http://127.0.0.1:8082, another
    /// replica of the same PostgreSQL database), so events reach them through the database.
    #[arg(long)]
    pub subscribe_via: Option<String>,

    /// Database of the spawned server (default: SQLite in a temporary directory).
    #[arg(long)]
    pub database_url: Option<String>,

    /// Extra argument for the spawned `tah serve` (repeatable), e.g. --server-arg=--max-steps=40.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,

    /// Log filter (RUST_LOG) of the spawned server.
    #[arg(long, default_value = "info")]
    pub server_log: String,

    /// Skip the floor (the workload sent straight to the fake model).
    #[arg(long)]
    pub no_floor: bool,

    /// Turns on one extra session before measuring, to warm connections and caches.
    #[arg(long, default_value_t = 2)]
    pub warmup_turns: usize,

    /// Instead of the turn workload: create N sessions, run one turn on each (so each has a
    /// live actor), then report the server's resident memory per idle session.
    #[arg(long)]
    pub idle_sessions: Option<usize>,

    /// Instead of the turn workload: hold N SSE connections open on `--concurrency` idle
    /// sessions, then report the server's resident memory per connection and its CPU over a
    /// quiet interval between heartbeats.
    #[arg(long, conflicts_with = "idle_sessions")]
    pub idle_streams: Option<usize>,

    /// Print the figures as one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be a whole number of at least 1".to_string()),
    }
}

/// A positive, finite amount of US dollars.
fn positive_usd(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(usd) if usd.is_finite() && usd > 0.0 => Ok(usd),
        _ => Err(format!("{text:?} is not a positive number of US dollars")),
    }
}
