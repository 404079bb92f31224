//! Keeping a snapshot's write out of the way of serving: [`Paced`], a writer that holds the
//! snapshot stream (and with it the store's scan) to a byte rate, and
//! [`lower_current_thread_priority`] for the thread that writes it. The engine writes the
//! snapshot to any `Write`; how fast and at what priority is the server's choice.

use std::io::{self, Write};
use std::time::{Duration, Instant};

/// A writer that keeps to at most `bytes_per_sec` on average by sleeping when ahead, so a
/// snapshot takes a bounded share of a core and of the disk while the store serves. Wrap the
/// stream given to [`PostStore::write_base`](thunder_engine::PostStore::write_base) in it: the writer runs at the pace of the writes.
#[derive(Debug)]
pub struct Paced<W> {
    inner: W,
    bytes_per_sec: u64,
    started: Instant,
    written: u64,
}

impl<W: Write> Paced<W> {
    /// Paces `inner` to `bytes_per_sec` (0: no limit).
    pub fn new(inner: W, bytes_per_sec: u64) -> Self {
        Self {
            inner,
            bytes_per_sec,
            started: Instant::now(),
            written: 0,
        }
    }

    /// The wrapped writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Paced<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        if self.bytes_per_sec > 0 {
            let due = Duration::from_secs_f64(self.written as f64 / self.bytes_per_sec as f64);
            if let Some(ahead) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Lowers the calling thread's CPU priority (Linux `nice` 10; elsewhere nothing), for a thread
/// that writes snapshots: when the cores are busy, the scheduler prefers the threads that serve
/// queries and apply events. A thread cannot raise its priority back without privileges, so
/// call it on a thread of its own.
pub fn lower_current_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions and returns this thread's id.
        let tid = unsafe { libc::gettid() };
        // SAFETY: setpriority only reads its integer arguments; on Linux PRIO_PROCESS with a
        // thread id changes that thread alone. A failure leaves the priority as it was.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A paced stream passes every byte through unchanged and takes at least as long as its
    /// rate allows; an unpaced one (0) does not sleep.
    #[test]
    fn a_paced_writer_keeps_to_its_rate() {
        let bytes: Vec<u8> = (0..20_000u32).map(|n| n as u8).collect();
        let started = Instant::now();
        let mut paced = Paced::new(Vec::new(), 100_000);
        for chunk in bytes.chunks(1_000) {
            paced.write_all(chunk).unwrap();
        }
        paced.flush().unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(199),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(paced.into_inner(), bytes);

        let started = Instant::now();
        let mut unpaced = Paced::new(Vec::new(), 0);
        for _ in 0..64 {
            unpaced.write_all(&bytes).unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(unpaced.into_inner().len(), 64 * bytes.len());
    }

    /// The nice value of the calling thread.
    #[cfg(target_os = "linux")]
    fn current_thread_nice() -> i32 {
        // SAFETY: gettid has no preconditions and returns this thread's id.
        let tid = unsafe { libc::gettid() };
        // SAFETY: getpriority only reads its integer arguments.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) }
    }

    /// Only the thread that asks is lowered (to nice 10 at least); the others keep theirs.
    #[cfg(target_os = "linux")]
    #[test]
    fn only_the_calling_thread_is_lowered() {
        let before = current_thread_nice();
        let lowered = std::thread::spawn(|| {
            lower_current_thread_priority();
            current_thread_nice()
        })
        .join()
        .unwrap();
        assert!(lowered >= 10, "nice {lowered}");
        assert_eq!(current_thread_nice(), before);
    }
}
