//! `thunder-cli snapshot inspect FILE`: a snapshot's header, counts and checksum verdict.

use std::fs::File;
use std::io::{BufReader, Seek};
use std::path::PathBuf;

use anyhow::{Context, bail};
use thunder_engine::base::{BASE_FORMAT_VERSION, base_layout_hash};
use thunder_engine::snapshot::{FORMAT_VERSION, SnapshotReader, layout_hash, read_header};

/// Snapshot subcommands.
#[derive(clap::Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: SnapshotCommand,
}

#[derive(clap::Subcommand, Debug)]
enum SnapshotCommand {
    /// Print a snapshot's header and counts and verify every checksum (exit status 1 if the
    /// file is invalid). A base file (format 3) is checked whole: checksums, structure and
    /// every record, as a start's background check does.
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
    let mut input = input;
    let header = match read_header(&mut BufReader::new(&input)) {
        Ok((header, _)) => header,
        Err(error) => bail!("INVALID header: {error}"),
    };
    let expected_layout = if header.format_version == BASE_FORMAT_VERSION {
        base_layout_hash()
    } else {
        layout_hash()
    };
    outln!(
        "format:          version {} (this build reads {FORMAT_VERSION} and {BASE_FORMAT_VERSION}), layout {:#010x} (this build {expected_layout:#010x})",
        header.format_version,
        header.layout_hash,
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
    if header.format_version == BASE_FORMAT_VERSION {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        return match thunder_engine::base::verify_file(&input, threads) {
            Ok(info) => {
                outln!("posts:           {}", info.posts);
                outln!("stored records:  {}", info.stored_posts);
                outln!("authors:         {}", info.authors);
                outln!("video entries:   {}", info.video_entries);
                outln!("tombstones:      {}", info.tombstones);
                outln!("waiting reposts: {}", info.waiting);
                outln!("facts:           {}", info.facts);
                outln!("checksums:       OK ({size} bytes verified, every record checked)");
                Ok(())
            }
            Err(error) => bail!("checksums:       INVALID: {error}"),
        };
    }
    input.rewind().context("rewinding the file")?;
    let reader = match SnapshotReader::new(BufReader::with_capacity(1 << 20, input)) {
        Ok(reader) => reader,
        Err(error) => bail!("INVALID header: {error}"),
    };
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
