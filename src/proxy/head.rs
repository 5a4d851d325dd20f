//! A deadline for the whole request head on the proxy listener. Pingora bounds each read of a
//! head (60 s), not the head: a client trickling one byte every few seconds held a connection
//! for ever (slowloris). [`HeadDeadline`] wraps a client connection below Pingora's HTTP code
//! and fails its reads once the deadline passes before the head's blank line (`\r\n\r\n`, or
//! `\n\n`) has arrived. [`crate::proxy::Guarded`] arms it when the connection's first byte
//! arrives; on a kept-alive connection (Pingora serves its requests in a loop of its own) the
//! wrapper arms itself again when bytes arrive after an answer was written: the next head. The
//! wait between requests is Pingora's keep-alive bound, and the body has its own deadline
//! (`limits.body_timeout_ms`, in [`crate::proxy::body`]). An HTTP/2 connection (its preface
//! starts `PRI`) is timed only up to its preface's blank line.

use async_trait::async_trait;
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::tls::{SslDigest, TlsRef};
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A client connection whose request head must arrive whole before a deadline.
#[derive(Debug)]
pub struct HeadDeadline {
    inner: Stream,
    limit: Duration,
    /// Set while a head is being read; cleared at its blank line.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The last bytes read of the head, to find a blank line split across reads.
    tail: [u8; 3],
    /// An answer was written since the last head: the next bytes read start a new head.
    answered: bool,
    /// HTTP/2 (or not yet known): no head after the preface.
    http2: bool,
    /// Bytes of the connection read so far, up to three (to tell HTTP/2's `PRI`).
    seen: usize,
}

impl HeadDeadline {
    /// `stream` with a head deadline `limit` from now: a connection already wrapped is armed
    /// again rather than wrapped twice.
    pub fn arm(stream: Stream, limit: Duration) -> Stream {
        let mut this = if stream.as_any().is::<HeadDeadline>() {
            match stream.into_any().downcast::<HeadDeadline>() {
                Ok(h) => h,
                // `is` said it is one.
                Err(_) => unreachable!("HeadDeadline downcast after a positive type check"),
            }
        } else {
            Box::new(HeadDeadline {
                inner: stream,
                limit,
                deadline: None,
                tail: [0; 3],
                answered: false,
                http2: false,
                seen: 0,
            })
        };
        this.limit = limit;
        this.deadline = Some(Box::pin(tokio::time::sleep(limit)));
        this.tail = [0; 3];
        this.answered = false;
        this
    }

    /// Writing after a head was read whole is the answer: what is read next is another head.
    /// An interim answer (`100 Continue`) is not: the body follows it.
    fn mark_answered(&mut self, bytes: &[u8]) {
        let interim = bytes.starts_with(b"HTTP/1.1 1") || bytes.starts_with(b"HTTP/1.0 1");
        if self.deadline.is_none() && !interim {
            self.answered = true;
        }
    }

    /// Whether `bytes`, read after `tail`, complete a head; updates `tail`.
    fn scan(tail: &mut [u8; 3], bytes: &[u8]) -> bool {
        let mut window = [0, tail[0], tail[1], tail[2]];
        for &b in bytes {
            window = [window[1], window[2], window[3], b];
            if window == *b"\r\n\r\n" || window[2..] == *b"\n\n" {
                return true;
            }
        }
        tail.copy_from_slice(&window[1..]);
        false
    }
}

impl AsyncRead for HeadDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(d) = this.deadline.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "request head not complete within limits.head_timeout_ms",
                )));
            }
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            let read = &buf.filled()[before..];
            if this.seen < 3 {
                // `PRI * HTTP/2.0`: the h2c preface.
                let take = read.len().min(3 - this.seen);
                this.http2 = read[..take] == b"PRI"[this.seen..this.seen + take]
                    && (this.seen > 0 || take > 0);
                this.seen += take;
            }
            if this.deadline.is_none() && this.answered && !this.http2 && !read.is_empty() {
                // The next request's head starts with these bytes.
                this.deadline = Some(Box::pin(tokio::time::sleep(this.limit)));
                this.tail = [0; 3];
                this.answered = false;
            }
            if this.deadline.is_some() && Self::scan(&mut this.tail, read) {
                this.deadline = None;
            }
        }
        r
    }
}

impl AsyncWrite for HeadDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.mark_answered(buf);
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        self.mark_answered(first);
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for HeadDeadline {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for HeadDeadline {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for HeadDeadline {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for HeadDeadline {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for HeadDeadline {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for HeadDeadline {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for HeadDeadline {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

/// The IP address of a connection's peer, when it has one (not a Unix socket).
pub fn peer_ip(stream: &Stream) -> Option<std::net::IpAddr> {
    let digest = stream.get_socket_digest()?;
    match digest.peer_addr()? {
        SocketAddr::Inet(a) => Some(a.ip()),
        SocketAddr::Unix(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::HeadDeadline;

    fn complete(chunks: &[&[u8]]) -> Option<usize> {
        let mut tail = [0u8; 3];
        chunks.iter().position(|c| HeadDeadline::scan(&mut tail, c))
    }

    #[test]
    fn a_blank_line_ends_the_head_even_split_across_reads() {
        assert_eq!(complete(&[b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"]), Some(0));
        assert_eq!(
            complete(&[b"GET / HTTP/1.1\r\nHost: a\r", b"\n\r", b"\n"]),
            Some(2)
        );
        assert_eq!(complete(&[b"GET / HTTP/1.1\nHost: a\n", b"\n"]), Some(1));
        assert_eq!(complete(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]), Some(0));
    }

    #[test]
    fn a_head_without_its_blank_line_is_not_complete() {
        assert_eq!(
            complete(&[b"GET / HTTP/1.1\r\n", b"Host: a\r\n", b"X: \r"]),
            None
        );
        assert_eq!(complete(&[b"\r", b"\n", b"X"]), None);
    }
}
