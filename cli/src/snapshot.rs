//! `thunder-cli snapshot inspect FILE`: a snapshot's header, counts and checksum verdict.

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use anyhow::{Context, bail};
use thunder_engine::snapshot::{FORMAT_VERSION, SnapshotReader, layout_hash};

/// Snapshot subcommands.
#[derive(clap::Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: SnapshotCommand,
}

#[derive(clap::Subcommand, Debug)]
enum SnapshotCommand {
    /// Print a snapshot's header and counts and verify every checksum (exit status 1 if the
    /// file is invalid).
    Inspect {
        /// The snapshot file (`snapshot-<unix ms>.thsnap`).
        file: PathBuf,
    },
}

pub fn run(args: SnapshotArgs) -> anyhow::Result<()> {
    let SnapshotCommand::Inspect { file } = args.command;
    let input = File::open(&file).with_context(|| format!("opening {}", file.display()))?;
    let size = input.metadata().map(|m| m.len()).unwrap_or(0);
    outln!("file:            {} ({size} bytes)", file.display());
    let reader = match SnapshotReader::new(BufReader::with_capacity(1 << 20, input)) {
        Ok(reader) => reader,
        Err(error) => bail!("INVALID header: {error}"),
    };
    let header = reader.header().clone();
    outln!(
        "format:          version {} (this build reads {FORMAT_VERSION}), layout {:#010x} (this build {:#010x})",
        header.format_version,
        header.layout_hash,
        layout_hash()
    );
    outln!("source:          {}", header.meta.source);
    outln!("created at:      {} (unix secs)", header.created_at_secs);
    outln!("retention:       {} s", header.retention_secs);
    match header.shard {
        Some(shard) => outln!("author shard:    {shard}"),
        None => outln!("author shard:    none (a full store)"),
    }
    outln!("offsets:");
    for offset in &header.meta.offsets {
        outln!(
            "  partition {:>4}  next offset {}",
            offset.partition,
            offset.next_offset
        );
    }
    match reader.verify() {
        Ok((_, counts)) => {
            outln!("posts:           {}", counts.posts);
            outln!("tombstones:      {}", counts.tombstones);
            outln!("facts:           {}", counts.facts);
            outln!("chunks:          {}", counts.chunks);
            outln!("checksums:       OK ({} bytes verified)", counts.bytes);
            Ok(())
        }
        Err(error) => bail!("checksums:       INVALID: {error}"),
    }
}
