//! One socket write per HTTP/2 write pass instead of one per DATA frame.
//!
//! h2 (0.4) writes every DATA frame of 256 bytes or more with its own `writev` (frame header
//! plus payload) and flushes after each: a 1200-post answer (about 34 KiB, 16 KiB frames as
//! gRPC clients advertise) costs three or four `writev`s, each a full TCP send, and on
//! loopback each wakes the peer. [`WriteBatch`] sits between h2 and the socket: writes are
//! copied into one buffer, and the bytes go out with one `write` once h2's write pass is
//! over. The end of a pass is not visible to the socket (h2 flushes after every frame as
//! well as at the end), so a flush that follows fresh bytes is answered at once and the
//! connection task woken again; the next flush without fresh bytes in between (at the latest
//! the one h2 makes at the end of that next poll) writes the buffer. A buffer of
//! [`MAX_BATCH_BYTES`] is written at once.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::AsyncWrite;

/// Bytes buffered before they are written without waiting for the end of the pass.
pub const MAX_BATCH_BYTES: usize = 64 * 1024;

/// The write buffer of one connection (see the module docs).
#[derive(Debug, Default)]
pub struct WriteBatch {
    buf: Vec<u8>,
    /// Bytes of `buf` already written to the socket.
    sent: usize,
    /// Bytes were accepted since the last flush.
    fresh: bool,
}

impl WriteBatch {
    /// Bytes accepted but not yet written to the socket.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.sent
    }

    /// Accepts `bufs` into the buffer (writing the buffer first if they do not fit; a write
    /// larger than [`MAX_BATCH_BYTES`] goes straight to `io` once the buffer is written).
    pub fn poll_write_vectored<W: AsyncWrite + Unpin>(
        &mut self,
        mut io: Pin<&mut W>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if self.pending() + len > MAX_BATCH_BYTES {
            ready!(self.poll_drain(io.as_mut(), cx))?;
            if len > MAX_BATCH_BYTES {
                return io.poll_write_vectored(cx, bufs);
            }
        }
        if self.sent > 0 {
            // The socket took part of the buffer: keep only what it did not.
            self.buf.drain(..self.sent);
            self.sent = 0;
        }
        if self.buf.capacity() == 0 {
            // Never grows beyond this: at most MAX_BATCH_BYTES are pending.
            self.buf.reserve_exact(MAX_BATCH_BYTES);
        }
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
        self.fresh |= len > 0;
        Poll::Ready(Ok(len))
    }

    /// Flushes: answered at once (and the task woken again) when bytes arrived since the
    /// last flush and the buffer is not full; otherwise writes the buffer and flushes `io`.
    pub fn poll_flush<W: AsyncWrite + Unpin>(
        &mut self,
        mut io: Pin<&mut W>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pending() > 0 && self.fresh && self.pending() < MAX_BATCH_BYTES {
            self.fresh = false;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_drain(io.as_mut(), cx))?;
        io.poll_flush(cx)
    }

    /// Writes the buffer, then shuts `io` down.
    pub fn poll_shutdown<W: AsyncWrite + Unpin>(
        &mut self,
        mut io: Pin<&mut W>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(io.as_mut(), cx))?;
        io.poll_shutdown(cx)
    }

    /// Writes every buffered byte to `io`. The connection calls it before each read as well:
    /// a peer is only waited for once what was written to it is on its way.
    pub fn poll_drain<W: AsyncWrite + Unpin>(
        &mut self,
        mut io: Pin<&mut W>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.pending() > 0 {
            let n = ready!(io.as_mut().poll_write(cx, &self.buf[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.buf.clear();
        self.sent = 0;
        self.fresh = false;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    /// A socket that records each write call; `accept` bytes per call at most.
    #[derive(Default)]
    struct Socket {
        bytes: Vec<u8>,
        writes: usize,
        accept: Option<usize>,
        /// Total bytes after which the socket is full (`Pending`).
        full_at: Option<usize>,
    }

    impl AsyncWrite for Socket {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.full_at.is_some_and(|full| self.bytes.len() >= full) {
                return Poll::Pending;
            }
            let n = self.accept.map_or(data.len(), |a| a.min(data.len()));
            self.bytes.extend_from_slice(&data[..n]);
            self.writes += 1;
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[derive(Default)]
    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn frame(byte: u8, len: usize) -> Vec<u8> {
        vec![byte; len]
    }

    /// Writes `frames` as h2 does: each frame (header + payload in one vectored write)
    /// followed by a flush.
    fn write_pass(
        batch: &mut WriteBatch,
        socket: &mut Socket,
        cx: &mut Context<'_>,
        frames: &[Vec<u8>],
    ) {
        for f in frames {
            let (head, payload) = f.split_at(9.min(f.len()));
            let slices = [io::IoSlice::new(head), io::IoSlice::new(payload)];
            let n = batch.poll_write_vectored(Pin::new(&mut *socket), cx, &slices);
            assert!(matches!(n, Poll::Ready(Ok(n)) if n == f.len()));
            assert!(batch.poll_flush(Pin::new(&mut *socket), cx).is_ready());
        }
    }

    #[test]
    fn a_write_pass_goes_out_in_one_write_on_the_next_flush_and_the_task_is_woken() {
        let wakes = Arc::new(CountWakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let mut batch = WriteBatch::default();
        let mut socket = Socket::default();
        let frames = [frame(1, 16_393), frame(2, 16_393), frame(3, 1_500)];
        write_pass(&mut batch, &mut socket, &mut cx, &frames);
        assert_eq!(socket.writes, 0, "nothing written during the pass");
        assert!(
            wakes.0.load(Ordering::Relaxed) > 0,
            "the task is woken to finish the write"
        );
        // The next poll's flush (no fresh bytes) writes everything at once.
        assert!(matches!(
            batch.poll_flush(Pin::new(&mut socket), &mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(socket.writes, 1);
        assert_eq!(socket.bytes, frames.concat());
        assert_eq!(batch.pending(), 0);
    }

    #[test]
    fn a_full_buffer_is_written_at_once_and_large_writes_pass_through() {
        let wakes = Arc::new(CountWakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let mut batch = WriteBatch::default();
        let mut socket = Socket::default();
        let frames: Vec<Vec<u8>> = (0..5).map(|i| frame(i, 16_393)).collect();
        write_pass(&mut batch, &mut socket, &mut cx, &frames);
        assert!(batch.pending() <= MAX_BATCH_BYTES);
        assert!(socket.writes >= 1, "the buffer was written when it filled");
        let big = frame(9, MAX_BATCH_BYTES + 1);
        let writes_before = socket.writes;
        let n =
            batch.poll_write_vectored(Pin::new(&mut socket), &mut cx, &[io::IoSlice::new(&big)]);
        assert!(matches!(n, Poll::Ready(Ok(n)) if n == big.len()));
        assert_eq!(batch.pending(), 0, "a large write is not copied");
        assert!(socket.writes > writes_before);
        assert!(
            batch
                .poll_shutdown(Pin::new(&mut socket), &mut cx)
                .is_ready()
        );
        let mut expected = frames.concat();
        expected.extend_from_slice(&big);
        assert_eq!(socket.bytes, expected, "every byte, in order");
    }

    /// A socket taking 1000 bytes per write, full after `full_at` bytes.
    fn slow_socket(full_at: Option<usize>) -> Socket {
        Socket {
            accept: Some(1000),
            full_at,
            ..Socket::default()
        }
    }

    #[test]
    fn partial_socket_writes_keep_the_order() {
        let waker = Waker::from(Arc::new(CountWakes::default()));
        let mut cx = Context::from_waker(&waker);
        let (mut batch, mut socket) = (WriteBatch::default(), slow_socket(None));
        let frames = [frame(1, 5000), frame(2, 300)];
        write_pass(&mut batch, &mut socket, &mut cx, &frames);
        assert!(batch.poll_flush(Pin::new(&mut socket), &mut cx).is_ready());
        assert_eq!(socket.bytes, frames.concat());
        assert_eq!(socket.writes, 6);
        assert_eq!(batch.buf.capacity(), MAX_BATCH_BYTES);
    }

    #[test]
    fn a_full_socket_keeps_the_unsent_part_and_accepts_more_in_order() {
        let waker = Waker::from(Arc::new(CountWakes::default()));
        let mut cx = Context::from_waker(&waker);
        let (mut batch, mut socket) = (WriteBatch::default(), slow_socket(Some(3000)));
        let frames = [frame(1, 5000), frame(2, 300)];
        write_pass(&mut batch, &mut socket, &mut cx, &frames[..1]);
        let flushed = batch.poll_flush(Pin::new(&mut socket), &mut cx);
        assert!(flushed.is_pending());
        assert_eq!((socket.bytes.len(), batch.pending()), (3000, 2000));
        write_pass(&mut batch, &mut socket, &mut cx, &frames[1..]);
        assert_eq!(batch.pending(), 2300);
        socket.full_at = None;
        assert!(batch.poll_flush(Pin::new(&mut socket), &mut cx).is_ready());
        assert_eq!(socket.bytes, frames.concat());
        assert_eq!(batch.buf.capacity(), MAX_BATCH_BYTES);
    }
}
