//! Bounds on what the API server may send the pod watch, as a layer under
//! kube's client: no watch line (the bytes between two `\n`) longer than
//! [`WATCH_LINE_MAX`], no other response body longer than [`BODY_MAX`].
//!
//! kube reads a watch with a `LinesCodec` of unlimited length: an endless
//! line from a broken or hostile server would grow its buffer by every
//! byte sent, until the watch's idle timeout. A list is read whole into
//! memory before it is parsed. Here the response body itself fails as soon
//! as a bound is passed, so kube never buffers more than the bound: the
//! watch (or list) ends with an error, which the watch loop logs and
//! retries with backoff.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use hyper::{Request, Response};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The longest watch line: one event, a pod object with its envelope. etcd
/// refuses objects over 1.5 MiB (`--max-request-bytes`); the JSON of a pod
/// is at most a few times its stored protobuf, so 16 MiB is ten times the
/// largest pod there can be.
pub const WATCH_LINE_MAX: usize = 16 << 20;

/// The largest other response: one page of the node's pods (see
/// [`LIST_PAGE`]), each as large as etcd allows and some more.
pub const BODY_MAX: usize = 64 << 20;

/// Pods asked for per list request. An API server serving from its watch
/// cache may ignore it and send the node's pods in one page; [`BODY_MAX`]
/// still bounds that page.
pub const LIST_PAGE: u32 = 50;

/// A bound passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TooLarge {
    #[error("the API server sent a watch line longer than {0} bytes")]
    Line(usize),
    #[error("the API server sent a response longer than {0} bytes")]
    Body(usize),
}

/// Counts a response's bytes against its bound. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meter {
    /// A watch: bytes since the last `\n`.
    Line { max: usize, run: usize },
    /// Anything else: bytes so far.
    Body { max: usize, seen: usize },
}

impl Meter {
    /// The meter for a request: a watch (`watch=true` or `watch=1` in the
    /// query) by line, anything else whole.
    pub fn for_query(query: Option<&str>, line_max: usize, body_max: usize) -> Meter {
        let watch = form_urlencoded::parse(query.unwrap_or("").as_bytes()).any(|(k, v)| k == "watch" && (v == "true" || v == "1"));
        if watch {
            Meter::Line { max: line_max, run: 0 }
        } else {
            Meter::Body { max: body_max, seen: 0 }
        }
    }

    /// Counts `chunk`; an error once a bound is passed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), TooLarge> {
        match self {
            Meter::Line { max, run } => {
                for (i, seg) in chunk.split(|&b| b == b'\n').enumerate() {
                    let len = if i == 0 { run.saturating_add(seg.len()) } else { seg.len() };
                    if len > *max {
                        return Err(TooLarge::Line(*max));
                    }
                    *run = len;
                }
                Ok(())
            }
            Meter::Body { max, seen } => {
                *seen = seen.saturating_add(chunk.len());
                if *seen > *max {
                    return Err(TooLarge::Body(*max));
                }
                Ok(())
            }
        }
    }
}

/// A response body that fails once its meter's bound is passed (and ends
/// there).
pub struct Bounded<B> {
    inner: B,
    meter: Meter,
    failed: bool,
}

impl<B> Body for Bounded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if let Err(e) = this.meter.feed(data) {
                        this.failed = true;
                        return Poll::Ready(Some(Err(Box::new(e))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The layer for kube's `ClientBuilder::with_layer`.
#[derive(Clone, Copy, Debug)]
pub struct Layer {
    pub line_max: usize,
    pub body_max: usize,
}

impl Default for Layer {
    fn default() -> Self {
        Layer { line_max: WATCH_LINE_MAX, body_max: BODY_MAX }
    }
}

impl<S> tower::Layer<S> for Layer {
    type Service = Service<S>;

    fn layer(&self, inner: S) -> Service<S> {
        Service { inner, limits: *self }
    }
}

/// The service the layer makes.
#[derive(Clone)]
pub struct Service<S> {
    inner: S,
    limits: Layer,
}

impl<S, ReqB, B> tower::Service<Request<ReqB>> for Service<S>
where
    S: tower::Service<Request<ReqB>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<Bounded<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let meter = Meter::for_query(req.uri().query(), self.limits.line_max, self.limits.body_max);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await?;
            Ok(res.map(|inner| Bounded { inner, meter, failed: false }))
        })
    }
}

/// Whether `e` (or an error it wraps, through kube's and std's wrappers)
/// is a bound passed.
pub fn too_large(e: &(dyn std::error::Error + 'static)) -> Option<TooLarge> {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(t) = e.downcast_ref::<TooLarge>() {
            return Some(*t);
        }
        // io::Error's source() skips the error it carries.
        if let Some(inner) = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            if let Some(t) = too_large(inner) {
                return Some(t);
            }
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_metered_by_line_and_the_rest_whole() {
        assert!(matches!(Meter::for_query(Some("fieldSelector=x&watch=true&timeoutSeconds=290"), 10, 20), Meter::Line { max: 10, .. }));
        assert!(matches!(Meter::for_query(Some("watch=1"), 10, 20), Meter::Line { .. }));
        assert!(matches!(Meter::for_query(Some("limit=50&watch=false"), 10, 20), Meter::Body { max: 20, .. }));
        assert!(matches!(Meter::for_query(None, 10, 20), Meter::Body { .. }));
    }

    #[test]
    fn a_line_may_span_chunks_but_not_pass_the_bound() {
        let mut m = Meter::Line { max: 8, run: 0 };
        assert_eq!(m.feed(b"1234"), Ok(()));
        assert_eq!(m.feed(b"5678\n12345678\n"), Ok(()), "two lines of exactly 8");
        assert_eq!(m.feed(b"abc"), Ok(()));
        assert_eq!(m.feed(b"defgh"), Ok(()));
        assert_eq!(m.feed(b"i"), Err(TooLarge::Line(8)), "9 bytes without a newline");
        let mut m = Meter::Line { max: 8, run: 0 };
        assert_eq!(m.feed(b"\n123456789\n"), Err(TooLarge::Line(8)), "an over-long line inside one chunk");
        let mut m = Meter::Line { max: 8, run: 7 };
        assert_eq!(m.feed(b"\n\n\n"), Ok(()));
        assert_eq!(m, Meter::Line { max: 8, run: 0 });
    }

    #[test]
    fn a_body_passes_its_bound_once() {
        let mut m = Meter::Body { max: 10, seen: 0 };
        assert_eq!(m.feed(b"0123456789"), Ok(()));
        assert_eq!(m.feed(b"x"), Err(TooLarge::Body(10)));
    }

    #[test]
    fn found_through_wrappers() {
        let io = std::io::Error::other(Box::new(TooLarge::Line(3)) as BoxError);
        assert_eq!(too_large(&io), Some(TooLarge::Line(3)));
        let boxed: BoxError = Box::new(TooLarge::Body(4));
        assert_eq!(too_large(&*boxed), Some(TooLarge::Body(4)));
        assert_eq!(too_large(&std::io::Error::other("no")), None);
    }

    #[tokio::test]
    async fn the_body_fails_at_the_bound_and_then_ends() {
        use http_body_util::BodyExt;
        let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> =
            vec![Ok(Frame::data(Bytes::from_static(b"{\"a\":1}\n"))), Ok(Frame::data(Bytes::from(vec![b'x'; 20])))];
        let inner = http_body_util::StreamBody::new(futures::stream::iter(chunks));
        let mut b = Bounded { inner, meter: Meter::Line { max: 16, run: 0 }, failed: false };
        let first = b.frame().await.expect("frame").expect("ok");
        assert_eq!(first.into_data().ok(), Some(Bytes::from_static(b"{\"a\":1}\n")));
        let err = b.frame().await.expect("frame").expect_err("too long");
        assert_eq!(too_large(&*err), Some(TooLarge::Line(16)));
        assert!(b.frame().await.is_none());
    }
}
