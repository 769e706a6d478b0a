//! The fan-out floor: the workload's subscribers (as many, with the same client and the same
//! checks) against the floor streams of a `tah fake-model` in a process of its own
//! ([`crate::bench::fanout`]), which send what tah's sessions send with nothing of tah behind
//! them. Its delta→client latency is what this machine gives the same fan-out.

use std::sync::Arc;

use anyhow::anyhow;
use tah::cli::BenchArgs;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::client::Client;
use super::report::FanoutFloor;
use super::server::spawn_fake_model_process;
use super::subscriber::subscribe;
use crate::bench::fanout::events;
use crate::bench::stats::{Proc, Summary};

pub async fn fanout_floor(args: &BenchArgs) -> anyhow::Result<FanoutFloor> {
    let (mut child, address) = spawn_fake_model_process(args).await?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("the fake model exited at once"))?;
    let (c, s, turns) = (args.concurrency, args.subscribers, args.turns);
    let client = Arc::new(Client::new(&format!("http://{address}"), None, 8)?);
    let goal = i64::try_from(events(turns as u64, args.reply.pieces as u64))?;
    // The goal is known from the start: a subscriber ends once it has every event.
    let (_target, target) = watch::channel(Some(goal));
    let cpu_before = Proc::Pid(pid).cpu_seconds()?;
    let self_before = Proc::This.cpu_seconds()?;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(c * s);
    for stream in 0..c {
        for _ in 0..s {
            let path = format!("/floor/{stream}/events?subscribers={s}&turns={turns}");
            let (ready, _) = oneshot::channel();
            let task = subscribe(client.clone(), path, ready, target.clone(), true);
            tasks.push(tokio::spawn(task));
        }
    }
    let mut floor = FanoutFloor::default();
    let mut deltas = Vec::new();
    for task in tasks {
        let sub = task.await?;
        floor.streams += 1;
        floor.events_received += sub.received;
        floor.incomplete += u64::from(!sub.complete(goal));
        deltas.extend(sub.deltas);
    }
    floor.wall_s = started.elapsed().as_secs_f64();
    floor.server_cpu_s = Proc::Pid(pid).cpu_seconds()? - cpu_before;
    floor.subscribers_cpu_s = Proc::This.cpu_seconds()? - self_before;
    floor.delta_to_client = Summary::of_micros(&mut deltas);
    floor.errors = client.errors.count();
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(floor)
}
