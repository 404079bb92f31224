//! What fresh memory costs on this machine: maps `--mib` MiB of anonymous memory (advised
//! `MADV_HUGEPAGE`, as the engine's arenas and tables are), writes one byte into every 4 KiB
//! page on `--threads` threads, unmaps it, and repeats after each pause in `--pauses-secs`.
//!
//! On a virtual machine whose balloon device reports free pages to the host, memory freed for
//! a few seconds goes back to the host, and touching it again makes the host find and zero a
//! page first: the rounds after a long pause show that cost, the rounds right after another
//! round show the guest's own. Also used to hand the next process memory that is cheap to
//! touch (run it right before the process starts).

use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser)]
#[command(about = "Time to fault in fresh memory, after pauses of different lengths")]
struct Args {
    /// MiB mapped and touched per round.
    #[arg(long, default_value_t = 2048)]
    mib: usize,
    /// Threads touching it (each its own share of the pages).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Pause before each round, seconds (one round per value).
    #[arg(long, value_delimiter = ',', default_value = "0,0,8,0.5,8")]
    pauses_secs: Vec<f64>,
}

const PAGE: usize = 4096;

fn touch_round(bytes: usize) -> anyhow::Result<()> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    anyhow::ensure!(base != libc::MAP_FAILED, "mmap of {bytes} bytes failed");
    // SAFETY: `base..+bytes` is the mapping made above; the advice is a hint only.
    unsafe { libc::madvise(base, bytes, libc::MADV_HUGEPAGE) };
    let base = base.cast::<u8>();
    for page in (0..bytes).step_by(PAGE) {
        // SAFETY: `page < bytes`, inside the writable mapping; volatile so the store is kept.
        unsafe { base.add(page).write_volatile(1) };
    }
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(base.cast(), bytes) };
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.threads > 0, "--threads must be at least 1");
    let share = (args.mib << 20) / args.threads / PAGE * PAGE;
    anyhow::ensure!(share > 0, "--mib too small for {} threads", args.threads);
    for pause in &args.pauses_secs {
        std::thread::sleep(Duration::from_secs_f64(pause.max(0.0)));
        let started = Instant::now();
        std::thread::scope(|scope| {
            let rounds: Vec<_> = (0..args.threads)
                .map(|_| scope.spawn(|| touch_round(share)))
                .collect();
            rounds
                .into_iter()
                .try_for_each(|round| round.join().expect("a touching thread panicked"))
        })?;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "after {pause:>5.1} s: {} MiB on {} threads in {secs:.3} s ({:.2} GiB/s)",
            (share * args.threads) >> 20,
            args.threads,
            (share * args.threads) as f64 / secs / f64::from(1u32 << 30),
        );
    }
    Ok(())
}
