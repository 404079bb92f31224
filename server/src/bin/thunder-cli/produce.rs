//! `thunder-cli produce`: send create/delete events to the Kafka topic thunder ingests, from
//! JSON lines on stdin or from the synthetic workload (see `thunder_server::kafka::produce`).

pub use thunder_server::kafka::produce::ProduceArgs;

/// Runs the producer on a blocking thread (it paces with sleeps and flushes synchronously).
pub async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || thunder_server::kafka::produce::run(&args)).await?
}
