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
