//! Command-line configuration: every flag has an environment fallback (the flag wins), and the
//! whole configuration is validated once, at start.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// tah — an agent session server: long-running LLM agent sessions over REST and SSE.
#[derive(Debug, Parser)]
#[command(name = "tah", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API (sessions, runs, events over SSE) until SIGINT/SIGTERM.
    Serve(Box<ServeConfig>),
    /// Serve a fake OpenAI-compatible model (streaming Chat Completions) for tests and
    /// benchmarks.
    #[command(hide = true)]
    FakeModel(crate::bench::FakeModelArgs),
    /// Drive a tah server with concurrent sessions and report throughput, latency, CPU and
    /// memory, side by side with the same workload sent straight to the model.
    Bench(Box<crate::bench::BenchArgs>),
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub const DEFAULT_SYSTEM_PROMPT: &str = "You are tah, a careful assistant working in a \
     workspace of files. Use the tools to look at files before you answer, and answer concisely.";

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "TAH_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Database URL: sqlite://PATH (the parent directory is created).
    #[arg(
        long,
        env = "TAH_DATABASE_URL",
        default_value = "sqlite://.tah/data.db"
    )]
    pub database_url: String,

    /// Directory the file tools may read; nothing outside it is reachable.
    #[arg(long, env = "TAH_WORKSPACE", default_value = ".")]
    pub workspace: PathBuf,

    /// Model provider. Default: openai if OPENAI_API_KEY is set, else anthropic if
    /// ANTHROPIC_API_KEY is set, else mock.
    #[arg(long, env = "TAH_PROVIDER", value_enum)]
    pub provider: Option<Provider>,

    /// Model name (default per provider).
    #[arg(long, env = "TAH_MODEL")]
    pub model: Option<String>,

    /// Provider base URL (default: the provider's public endpoint).
    #[arg(long, env = "TAH_BASE_URL")]
    pub base_url: Option<String>,

    /// Name of the environment variable holding the provider's API key (default
    /// OPENAI_API_KEY or ANTHROPIC_API_KEY). Keys are never taken from a flag value.
    #[arg(long, env = "TAH_API_KEY_ENV")]
    pub api_key_env: Option<String>,

    /// System prompt of every run (current configuration wins, also for older sessions that
    /// did not set their own).
    #[arg(long, env = "TAH_SYSTEM_PROMPT", default_value = DEFAULT_SYSTEM_PROMPT, hide_default_value = true)]
    pub system_prompt: String,

    /// LLM calls per run at most; 0 = unlimited.
    #[arg(long, env = "TAH_MAX_STEPS", default_value_t = 20)]
    pub max_steps: u32,

    /// Character budget of each model request; unset = send the full history.
    #[arg(long, env = "TAH_CONTEXT_CHARS", value_parser = clap::value_parser!(u64).range(1..))]
    pub context_chars: Option<u64>,

    /// Delay between the mock model's text pieces, in milliseconds.
    #[arg(long, env = "TAH_MOCK_DELAY_MS", default_value_t = 0)]
    pub mock_delay_ms: u64,

    /// Largest accepted request body, in bytes.
    #[arg(long, env = "TAH_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// API token clients must send as `Authorization: Bearer <token>` on every /v1 route
    /// (repeatable; the env var takes a comma-separated list). None: no authentication.
    #[arg(
        long = "api-token",
        env = "TAH_API_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_tokens: Vec<String>,

    /// Allow listening on a non-loopback address without API tokens.
    #[arg(long, env = "TAH_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,

    /// Origin allowed to call the API from a browser (repeatable; the env var takes a
    /// comma-separated list). None: no cross-origin access.
    #[arg(long = "cors-origin", env = "TAH_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Runs (turns, resumes, compactions excluded) in progress at once in this process;
    /// further run requests get 429 with Retry-After.
    #[arg(long, env = "TAH_MAX_CONCURRENT_RUNS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_runs: u32,

    /// Time limit for ordinary requests, in seconds (never applied to SSE streams or
    /// `?wait=true` runs).
    #[arg(long, env = "TAH_REQUEST_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_secs: u64,

    /// Resume runs interrupted by a crash or a stop by itself, at start (and, with
    /// PostgreSQL, when taking over a dead replica's sessions). Default: on with PostgreSQL,
    /// off with SQLite (resume stays the client's call).
    #[arg(long, env = "TAH_AUTO_RESUME", num_args = 0..=1, default_missing_value = "true")]
    pub auto_resume: Option<bool>,

    /// Seconds a replica's lease on a session lasts without renewal (PostgreSQL): a dead
    /// replica's runs are taken over after at most this long.
    #[arg(long, env = "TAH_LEASE_TTL_SECS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub lease_ttl_secs: u64,

    /// Log format.
    #[arg(long, env = "TAH_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

impl ServeConfig {
    /// The provider in force: the flag, or the first provider whose key is present.
    pub fn provider(&self) -> Provider {
        if let Some(p) = self.provider {
            return p;
        }
        let has = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty());
        if has("OPENAI_API_KEY") {
            Provider::Openai
        } else if has("ANTHROPIC_API_KEY") {
            Provider::Anthropic
        } else {
            Provider::Mock
        }
    }

    /// Checks what clap cannot: exposure without tokens, token and origin syntax.
    pub fn validate(&self) -> Result<(), String> {
        let tokens: Vec<&String> = self.api_tokens.iter().filter(|t| !t.is_empty()).collect();
        if tokens.is_empty() && !self.listen.ip().is_loopback() && !self.allow_unauthenticated {
            return Err(format!(
                "refusing to listen on {} without API tokens: set --api-token (or TAH_API_TOKENS), \
                 or pass --allow-unauthenticated if something else guards this address",
                self.listen
            ));
        }
        let weak =
            |t: &&&String| t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control());
        if tokens.iter().any(|t| weak(&t)) {
            return Err("API tokens must be at least 16 characters without spaces".to_string());
        }
        for origin in &self.cors_origins {
            if origin != "*" && !(origin.starts_with("http://") || origin.starts_with("https://")) {
                return Err(format!(
                    "--cors-origin {origin:?} must look like https://example.com"
                ));
            }
        }
        Ok(())
    }

    /// Whether interrupted runs resume by themselves (see `--auto-resume`).
    pub fn auto_resume(&self) -> bool {
        self.auto_resume
            .unwrap_or_else(|| self.database_url.starts_with("postgres"))
    }

    /// `max_steps` as a limit (`None` = unlimited).
    pub fn max_steps(&self) -> Option<u32> {
        (self.max_steps > 0).then_some(self.max_steps)
    }

    /// The provider's API key, read from the environment.
    pub fn api_key(&self, provider: Provider) -> Option<String> {
        let name = match (&self.api_key_env, provider) {
            (Some(name), _) => name.as_str(),
            (None, Provider::Openai) => "OPENAI_API_KEY",
            (None, Provider::Anthropic) => "ANTHROPIC_API_KEY",
            (None, Provider::Mock) => return None,
        };
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}
