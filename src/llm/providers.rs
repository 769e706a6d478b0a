//! The named model providers a server runs agents on: `default` (the one the
//! `--provider/--base-url/--model` flags define) and those of the `--providers` file. An agent's
//! `model` is `"<provider>/<model>"`, or a bare model name for the default provider;
//! [`Providers::resolve`] checks it and [`Providers::client`] answers the client that serves
//! it, made once per provider, model and thinking budget and shared by every run that uses it.
//! The clients of one provider share its connection pool; [`file`] reads the `--providers`
//! file.

mod cost;
pub use cost::round_usd;
pub mod file;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::guard::ReplyLimits;
use super::wire::{HttpModelConfig, HttpPool, Timeouts};
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
            .field(
                "base_url",
                &self.base_url.as_deref().map(without_credentials),
            )
            .finish_non_exhaustive()
    }
}

/// A provider as `GET /v1/providers` shows it: never a key, a header's value or the
/// credentials of a base URL.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ProviderKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The models with a price, in name order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
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
    made: Mutex<Made>,
}

/// What was made for the providers so far.
#[derive(Default)]
struct Made {
    clients: HashMap<ClientKey, Arc<dyn ModelClient>>,
    /// One connection pool per provider, by name, shared by the clients of its models.
    pools: HashMap<String, HttpPool>,
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
                made: Mutex::new(Made::default()),
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

    /// The price of `model` on the provider `provider`, when its `prices` give one.
    pub fn price(&self, provider: &str, model: &str) -> Option<Price> {
        self.spec(provider)?.prices.get(model).copied()
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
                    .as_deref()
                    .map(without_credentials)
                    .or_else(|| s.kind.default_base_url().map(str::to_string)),
                models: s.prices.keys().cloned().collect(),
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
        let mut made = self.inner.made.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = made.clients.get(&key) {
            return Ok(client.clone());
        }
        let spec = self.spec(&model.provider).ok_or_else(|| {
            LlmError::new(
                &model.provider,
                super::LlmErrorKind::NotFound,
                format!("the provider {:?} is not configured", model.provider),
            )
        })?;
        let pool = match (spec.kind, made.pools.get(&spec.name)) {
            (ProviderKind::Mock, _) => None,
            (_, Some(pool)) => Some(pool.clone()),
            (kind, None) => {
                let pool = HttpPool::new(kind.as_str(), &spec.timeouts)?;
                made.pools.insert(spec.name.clone(), pool.clone());
                Some(pool)
            }
        };
        let client = make_client(spec, &model.model, thinking_budget, pool)?;
        made.clients.insert(key, client.clone());
        Ok(client)
    }

    /// The default agent's client.
    pub fn default_client(&self) -> Result<Arc<dyn ModelClient>, LlmError> {
        self.client(&self.default_model(), self.inner.default_thinking)
    }
}

/// A base URL as it may be shown: without a user name or password.
fn without_credentials(base_url: &str) -> String {
    match reqwest::Url::parse(base_url.trim()) {
        Ok(mut url) if !url.username().is_empty() || url.password().is_some() => {
            // Both only fail for URLs that cannot have credentials, which these have.
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        }
        _ => base_url.to_string(),
    }
}

fn make_client(
    spec: &ProviderSpec,
    model: &str,
    thinking_budget: Option<u32>,
    pool: Option<HttpPool>,
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
        headers: spec.headers.clone(),
        pool: pool.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, kind: ProviderKind, base_url: Option<&str>) -> ProviderSpec {
        ProviderSpec {
            name: name.to_string(),
            kind,
            base_url: base_url.map(str::to_string),
            api_key: Some("sk-unit-test-key".to_string()),
            headers: vec![("x-org".to_string(), "org-unit-secret".to_string())],
            prices: BTreeMap::new(),
            max_output_tokens: 1024,
            timeouts: Timeouts::default(),
            limits: ReplyLimits::default(),
            mock_delay: Duration::ZERO,
        }
    }

    fn providers() -> Providers {
        let mut priced = spec(
            "gw",
            ProviderKind::Openai,
            Some("http://user:pa55@127.0.0.1:9/v1"),
        );
        priced.prices.insert(
            "m1".to_string(),
            Price {
                input_per_mtok: 1.0,
                output_per_mtok: 2.0,
                cache_read_per_mtok: None,
            },
        );
        Providers::new(
            spec(DEFAULT, ProviderKind::Mock, None),
            None,
            /*default_thinking*/ None,
            vec![
                priced,
                spec(
                    "claude",
                    ProviderKind::Anthropic,
                    Some("http://127.0.0.1:9"),
                ),
            ],
        )
    }

    #[test]
    fn the_clients_of_one_provider_share_its_pool() {
        let providers = providers();
        let model = |name: &str| providers.resolve(name).expect("resolves");
        let a = providers.client(&model("gw/m1"), None).expect("client");
        let again = providers.client(&model("gw/m1"), None).expect("client");
        assert!(Arc::ptr_eq(&a, &again), "one client per model");
        providers.client(&model("gw/m2"), None).expect("client");
        providers
            .client(&model("claude/c1"), Some(2048))
            .expect("client");
        providers.client(&model("mock"), None).expect("client");
        let made = providers.inner.made.lock().expect("lock");
        assert_eq!(made.clients.len(), 4);
        let mut pools: Vec<&str> = made.pools.keys().map(String::as_str).collect();
        pools.sort();
        assert_eq!(pools, ["claude", "gw"], "a pool per real provider");
    }

    #[test]
    fn the_list_shows_no_secret() {
        let list = providers().list();
        let names: Vec<&str> = list.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, [DEFAULT, "gw", "claude"]);
        assert_eq!(list[1].base_url.as_deref(), Some("http://127.0.0.1:9/v1"));
        assert_eq!(list[1].models, ["m1"]);
        let shown = serde_json::to_string(&list).expect("json");
        for secret in ["sk-unit-test-key", "org-unit-secret", "pa55", "user"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(!format!("{:?}", providers().spec("gw")).contains("pa55"));
    }
}
