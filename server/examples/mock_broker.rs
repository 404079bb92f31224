//! A Kafka broker that honours the fetch limits, for measurements: librdkafka's mock cluster
//! (one broker, in this process), with the topic created. Real Kafka brokers bound every fetch
//! answer by `fetch.max.bytes` plus one record batch; the local test broker (noida-db) answers
//! with a partition's whole backlog. `scripts/replay-memory.sh --mock-broker` replays through
//! this one to see what a replica holds against the former.
//!
//!     cargo run --release -p thunder-server --example mock_broker -- [TOPIC] [PARTITIONS]
//!
//! Prints the bootstrap address on the first line of stdout and serves until stdin closes.

use std::io::Read;

use rdkafka::mocking::MockCluster;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let topic = args.next().unwrap_or_else(|| "innetwork_post".to_owned());
    let partitions: i32 = args.next().map_or(Ok(8), |p| p.parse())?;
    let cluster = MockCluster::new(1)?;
    cluster.create_topic(&topic, partitions, 1)?;
    println!("{}", cluster.bootstrap_servers());
    // Until whoever started it closes stdin (or the process is killed).
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    Ok(())
}
