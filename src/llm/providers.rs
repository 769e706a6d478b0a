//! The named model providers a server runs agents on: `default` (the one the
//! `--provider/--base-url/--model` flags define) and those of the `--providers` file. An agent's
//! `model` is `"<provider>/<model>"`, or a bare model name for the default provider;
//! [`Providers::resolve`] checks it and [`Providers::client`] answers the client that serves
//! it, made once per provider, model and thinking budget and shared by every run that uses it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::guard::ReplyLimits;
use super::wire::{HttpModelConfig, Timeouts};
use super::{anthropic, mock::MockModel, openai, LlmError, ModelClient};

/// The name of the provider the flags define.
pub const DEFAULT: &str = "default";

/// The dialect a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Mock,
    Openai,
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Mock => "mock",
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    /// The endpoint used when no base URL is given.
    fn default_base_url(self) -> Option<&'static str> {
        match self {
            ProviderKind::Mock => None,
            ProviderKind::Openai => Some(openai::DEFAULT_BASE_URL),
            ProviderKind::Anthropic => Some(anthropic::DEFAULT_BASE_URL),
        }
    }

    /// The model used when an agent names none (the default agent without `--model`).
    pub fn default_model(self) -> &'static str {
        match self {
            ProviderKind::Mock => "mock",
            ProviderKind::Openai => openai::DEFAULT_MODEL,
            ProviderKind::Anthropic => anthropic::DEFAULT_MODEL,
        }
    }
}

/// What a model costs, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_per_mtok: Option<f64>,
}

/// One configured provider.
#[derive(Clone)]
pub struct ProviderSpec {
    pub name: String,
    pub kind: ProviderKind,
    /// `None`: the provider's public endpoint.
    pub base_url: Option<String>,
    /// Never served, logged or put into an error.
    pub api_key: Option<String>,
    /// Sent with every request (their values are never served).
    pub headers: Vec<(String, String)>,
    pub prices: BTreeMap<String, Price>,
    pub max_output_tokens: u32,
    pub timeouts: Timeouts,
    pub limits: ReplyLimits,
    /// The mock's delay between text pieces.
    pub mock_delay: Duration,
}

impl std::fmt::Debug for ProviderSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderSpec")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// A provider as `GET /v1/providers` shows it: never a key or a header's value.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ProviderKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
}

/// A model on a provider, as an agent names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelRef {
    pub provider: String,
    pub model: String,
}

impl ModelRef {
    /// How agents and descriptors write it: `provider/model`.
    pub fn qualified(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

/// Why an agent's `model` names no model tah can call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelRefError {
    #[error("model {model:?} names the provider {provider:?}, which is not configured (providers: {known})")]
    UnknownProvider {
        model: String,
        provider: String,
        known: String,
    },
    #[error("model {0:?} names no model: write \"<provider>/<model>\" or a model of the default provider")]
    Empty(String),
}

/// The key of a client: which model it calls, and how.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ClientKey {
    model: ModelRef,
    thinking_budget: Option<u32>,
}

/// The configured providers, and the clients made for them so far. Cheap to clone.
#[derive(Clone)]
pub struct Providers {
    inner: Arc<Inner>,
}

struct Inner {
    /// `default` first, then the file's in name order.
    specs: Vec<ProviderSpec>,
    /// The default agent's model on the default provider.
    default_model: String,
    /// The default agent's thinking budget.
    default_thinking: Option<u32>,
    clients: Mutex<HashMap<ClientKey, Arc<dyn ModelClient>>>,
}

impl Providers {
    /// The providers: `default` (from the flags) and the others; `default_model` is the model
    /// the default agent runs (`None`: the default provider's own default).
    pub fn new(
        default: ProviderSpec,
        default_model: Option<String>,
        default_thinking: Option<u32>,
        others: Vec<ProviderSpec>,
    ) -> Providers {
        let default_model =
            default_model.unwrap_or_else(|| default.kind.default_model().to_string());
        let mut specs = vec![default];
        specs.extend(others);
        Providers {
            inner: Arc::new(Inner {
                specs,
                default_model,
                default_thinking,
                clients: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The default agent's model.
    pub fn default_model(&self) -> ModelRef {
        ModelRef {
            provider: DEFAULT.to_string(),
            model: self.inner.default_model.clone(),
        }
    }

    /// The default agent's thinking budget (`--thinking-budget`).
    pub fn default_thinking(&self) -> Option<u32> {
        self.inner.default_thinking
    }

    pub fn spec(&self, name: &str) -> Option<&ProviderSpec> {
        self.inner.specs.iter().find(|s| s.name == name)
    }

    /// The providers as served: names, types, base URLs and prices.
    pub fn list(&self) -> Vec<ProviderInfo> {
        self.inner
            .specs
            .iter()
            .map(|s| ProviderInfo {
                name: s.name.clone(),
                kind: s.kind,
                base_url: s
                    .base_url
                    .clone()
                    .or_else(|| s.kind.default_base_url().map(str::to_string)),
                prices: s.prices.clone(),
            })
            .collect()
    }

    /// What `model` names: `provider/model` on a configured provider, or a bare name on the
    /// default one. The first `/` ends the provider's name, so a model whose own name has one
    /// (`meta-llama/Llama-3.1-8B`) is written with its provider (`default/meta-llama/…`).
    pub fn resolve(&self, model: &str) -> Result<ModelRef, ModelRefError> {
        let (provider, name) = match model.split_once('/') {
            Some((provider, name)) => (provider, name),
            None => (DEFAULT, model),
        };
        if name.trim().is_empty() {
            return Err(ModelRefError::Empty(model.to_string()));
        }
        if self.spec(provider).is_none() {
            let known: Vec<&str> = self.inner.specs.iter().map(|s| s.name.as_str()).collect();
            return Err(ModelRefError::UnknownProvider {
                model: model.to_string(),
                provider: provider.to_string(),
                known: known.join(", "),
            });
        }
        Ok(ModelRef {
            provider: provider.to_string(),
            model: name.to_string(),
        })
    }

    /// The client that calls `model` with this thinking budget: made at first use, then
    /// shared.
    pub fn client(
        &self,
        model: &ModelRef,
        thinking_budget: Option<u32>,
    ) -> Result<Arc<dyn ModelClient>, LlmError> {
        let key = ClientKey {
            model: model.clone(),
            thinking_budget,
        };
        let mut clients = self.inner.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let spec = self.spec(&model.provider).ok_or_else(|| {
            LlmError::new(
                &model.provider,
                super::LlmErrorKind::NotFound,
                format!("the provider {:?} is not configured", model.provider),
            )
        })?;
        let client = make_client(spec, &model.model, thinking_budget)?;
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// The default agent's client.
    pub fn default_client(&self) -> Result<Arc<dyn ModelClient>, LlmError> {
        self.client(&self.default_model(), self.inner.default_thinking)
    }
}

fn make_client(
    spec: &ProviderSpec,
    model: &str,
    thinking_budget: Option<u32>,
) -> Result<Arc<dyn ModelClient>, LlmError> {
    let http = |base: &str| HttpModelConfig {
        base_url: spec.base_url.clone().unwrap_or_else(|| base.to_string()),
        api_key: spec.api_key.clone(),
        model: model.to_string(),
        max_tokens: spec.max_output_tokens,
        thinking_budget,
        timeouts: spec.timeouts.clone(),
        retry: Default::default(),
        limits: spec.limits.clone(),
    };
    Ok(match spec.kind {
        ProviderKind::Mock => Arc::new(MockModel::new(spec.mock_delay)),
        ProviderKind::Openai => {
            Arc::new(openai::OpenAiClient::new(http(openai::DEFAULT_BASE_URL))?)
        }
        ProviderKind::Anthropic => Arc::new(anthropic::AnthropicClient::new(http(
            anthropic::DEFAULT_BASE_URL,
        ))?),
    })
}
