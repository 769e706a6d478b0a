//! Measuring tools shipped in the binary: a fake OpenAI-compatible model server and a load
//! generator that drives a running tah server like real clients (being written).

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct FakeModelArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Concurrent sessions.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
}

pub async fn fake_model(_args: FakeModelArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet available")
}

pub async fn bench(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet available")
}
