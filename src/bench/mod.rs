//! Measuring tools shipped in the binary (not in the library): a fake OpenAI-compatible model
//! server ([`fake_model`], the hidden `tah fake-model`) and a load generator (`tah bench`) that
//! drives a tah server over HTTP like real clients and reports throughput, latency, CPU and
//! memory, side by side with the same workload sent straight to the model (the floor). They
//! reach the server only through the library's public API and its HTTP interface.

pub mod fake_model;
pub mod fanout;
mod loadgen;
pub mod stats;

use std::time::Duration;

use tah::app::ReadyLine;
use tah::cli::{BenchArgs, FakeModelArgs, FakeReplyArgs};

use fake_model::{serve_fake_model, FakeKnobs};

impl FakeKnobs {
    fn of(reply: &FakeReplyArgs, stamp_every_piece: bool) -> FakeKnobs {
        FakeKnobs {
            pieces: reply.pieces,
            piece_delay: Duration::from_millis(reply.piece_delay_ms),
            tool_calls: reply.tool_calls,
            stamp_every_piece,
        }
    }
}

impl From<&FakeModelArgs> for FakeKnobs {
    fn from(args: &FakeModelArgs) -> FakeKnobs {
        FakeKnobs::of(&args.reply, args.stamp_every_piece)
    }
}

impl From<&BenchArgs> for FakeKnobs {
    /// The fake model's knobs for this workload. With subscribers every piece is stamped, so
    /// that delta latency is sampled on every delta, not only the first of each reply.
    fn from(args: &BenchArgs) -> FakeKnobs {
        FakeKnobs::of(&args.reply, args.subscribers > 0)
    }
}

/// `tah fake-model`: serves the fake model until killed. Like `tah serve` it writes its
/// [`ReadyLine`] to stdout once it listens.
pub async fn fake_model(args: FakeModelArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let address = listener.local_addr()?;
    eprintln!("listening on http://{address}");
    crate::announce(ReadyLine { listening: address });
    serve_fake_model(listener, FakeKnobs::from(&args)).await?;
    Ok(())
}

/// `tah bench`: runs the workload and prints the report; fails if any request failed or any
/// subscriber missed or repeated an event.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    loadgen::run(args).await
}
