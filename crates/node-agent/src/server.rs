//! The HTTP server: /metrics (Prometheus text or OpenMetrics, gzip,
//! `collect[]`/`exclude[]`), /healthz, /readyz and a landing page, over hyper.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, ACCEPT, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::admission::{Admission, Closed, Slot, FIRST_BYTE_TIMEOUT};
use crate::httpstats::{Cause, HandlerStats};

use expo::Format;
use runtime::{Scraper, Selection};

/// Server errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--web.listen-address {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--web.listen-address: {0}")]
    Address(String),
    #[error("--web.systemd-socket: {0}")]
    Systemd(String),
}

/// Subtracted from Prometheus' scrape timeout for the collectors' deadline.
const SCRAPE_TIMEOUT_OFFSET: f64 = 0.5;
/// The shortest deadline a scrape timeout header can ask for.
const MIN_DEADLINE: f64 = 0.1;

/// A collector stuck for this many deadlines makes `/readyz` fail.
pub const STUCK_DEADLINES: u32 = 3;

/// What the handler needs.
pub struct State {
    pub scraper: Arc<Scraper>,
    pub telemetry_path: String,
    /// `None`: no limit.
    pub limit: Option<Arc<Semaphore>>,
    /// TLS and basic auth (`--web.config.file`), re-read when it changes.
    pub web: crate::webconfig::Handle,
    /// The connections held (`--web.max-connections`, and per peer): see
    /// [`crate::admission`].
    pub admission: Arc<Admission>,
    /// Requests to the metrics path (`promhttp_metric_handler_*`).
    pub handler: Arc<HandlerStats>,
}

/// A client has this long to send its headers (and finish a TLS handshake).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A response that makes no progress for this long (a client that does not
/// read) closes the connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// A stream whose writes fail with `TimedOut` when they make no progress for
/// `timeout`: a client that never reads cannot hold its response forever.
pub struct WriteTimeout<S> {
    inner: S,
    timeout: Duration,
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteTimeout<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        WriteTimeout { inner, timeout, timer: None }
    }

    /// On `Pending`, arms the timer (once) and reports its expiry as an error.
    fn stalled(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Error> {
        let timeout = self.timeout;
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match std::future::Future::poll(timer.as_mut(), cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(std::io::Error::new(std::io::ErrorKind::TimedOut, "write timed out")),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

macro_rules! timed {
    ($self:ident, $cx:ident, $op:expr) => {{
        match $op {
            std::task::Poll::Ready(r) => {
                $self.timer = None;
                std::task::Poll::Ready(r)
            }
            std::task::Poll::Pending => match $self.stalled($cx) {
                std::task::Poll::Ready(e) => std::task::Poll::Ready(Err(e)),
                std::task::Poll::Pending => std::task::Poll::Pending,
            },
        }
    }};
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        timed!(this, cx, std::pin::Pin::new(&mut this.inner).poll_write(cx, buf))
    }

    fn poll_flush(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        timed!(this, cx, std::pin::Pin::new(&mut this.inner).poll_flush(cx))
    }

    fn poll_shutdown(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        timed!(this, cx, std::pin::Pin::new(&mut this.inner).poll_shutdown(cx))
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        timed!(this, cx, std::pin::Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// Decodes `collect[]=a&exclude[]=b` from a query string.
pub fn selection(query: Option<&str>) -> Selection {
    let mut sel = Selection::default();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "collect[]" => sel.include.push(v.into_owned()),
            "exclude[]" => sel.exclude.push(v.into_owned()),
            _ => {}
        }
    }
    sel
}

fn landing(state: &State) -> Response<Full<Bytes>> {
    let body = format!(
        "<html><head><title>node-agent</title></head><body><h1>node-agent</h1>\
         <p>Node metrics compatible with node_exporter, plus kernel events.</p>\
         <ul><li><a href=\"{p}\">Metrics</a></li><li><a href=\"/healthz\">Health</a></li><li><a href=\"/readyz\">Readiness</a></li></ul>\
         <p>Collectors: {c}</p><p>Version {v}</p></body></html>\n",
        p = state.telemetry_path,
        c = state.scraper.names().join(", "),
        v = env!("CARGO_PKG_VERSION"),
    );
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    r
}

/// Handles one request of connection `slot` from `peer` (its admission
/// key): authentication, then the route, then the configured response
/// headers. The web config is read per request (as exporter-toolkit does),
/// so a rotated password or newly required basic auth applies at once to
/// kept-alive connections too; TLS settings apply from the next
/// connection. While the request waits for its password check, its
/// connection may be closed to make room (see [`crate::admission`]).
pub async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
    peer: IpAddr,
    slot: &Arc<Slot>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let web = state.web.current();
    let auth = req.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let mut resp = if web.authorize(auth, peer, || slot.waiting()).await == crate::webconfig::Auth::Denied {
        let mut r = text(StatusCode::UNAUTHORIZED, "Unauthorized\n");
        r.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
        r
    } else {
        route(&state, req).await
    };
    for (k, v) in &web.headers {
        resp.headers_mut().insert(k.clone(), v.clone());
    }
    Ok(resp)
}

async fn route(state: &Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut().insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let path = req.uri().path();
    if path == state.telemetry_path {
        return metrics(state, &req).await;
    }
    match path {
        "/" => landing(state),
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => readiness(state),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Ready unless a collector has been stuck for [`STUCK_DEADLINES`] of its
/// deadlines (a hung mount or device the node needs looking at).
fn readiness(state: &State) -> Response<Full<Bytes>> {
    let stuck = state.scraper.stuck(state.scraper.timeout() * STUCK_DEADLINES);
    if stuck.is_empty() {
        return text(StatusCode::OK, "ready\n");
    }
    let list: Vec<String> = stuck.iter().map(|(n, d)| format!("{n} (stuck for {:.0}s)", d.as_secs_f64())).collect();
    text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: collectors stuck past {STUCK_DEADLINES} deadlines: {}\n", list.join(", ")))
}

async fn metrics(state: &State, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    // As node_exporter: a bad `collect[]` is answered before the counted
    // handler; everything after is counted by its status code.
    let sel = selection(req.uri().query());
    if let Err(e) = state.scraper.validate(&sel) {
        return text(StatusCode::BAD_REQUEST, format!("couldn't create filtered metrics handler: {e}\n"));
    }
    let in_flight = state.handler.enter();
    let r = counted_metrics(state, req, &sel).await;
    drop(in_flight);
    state.handler.answered(r.status().as_u16());
    r
}

async fn counted_metrics(state: &State, req: &Request<Incoming>, sel: &Selection) -> Response<Full<Bytes>> {
    let _permit = match &state.limit {
        Some(sem) => match Arc::clone(sem).try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                return text(StatusCode::SERVICE_UNAVAILABLE, "Limit of concurrent requests reached, try again later.\n");
            }
        },
        None => None,
    };
    let header = |h| req.headers().get(h).and_then(|v: &HeaderValue| v.to_str().ok());
    let format = Format::negotiate(header(ACCEPT));
    let gzip_ok = expo::negotiate::accepts_gzip(header(ACCEPT_ENCODING));
    // Prometheus says how long it waits; answer within it (node_exporter
    // has no such deadline; blackbox_exporter keeps the same margin).
    let deadline = header(HeaderName::from_static("x-prometheus-scrape-timeout-seconds"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|t| t.is_finite() && *t > 0.0)
        .map(|t| Duration::from_secs_f64((t - SCRAPE_TIMEOUT_OFFSET).max(MIN_DEADLINE)));
    let (tx, rx) = tokio::sync::oneshot::channel();
    // Collectors do blocking file I/O on the scraper's own runners; the
    // body is compressed there too, off the async workers. The scraper
    // supervises the scrape (slow collectors, deadlines) itself.
    let _scrape = state.scraper.start(
        sel,
        format,
        deadline,
        Box::new(move |body| {
            let r = if gzip_ok { gzip(&body).map(|b| (b, true)) } else { Ok((body, false)) };
            let _ = tx.send(r);
        }),
    );
    let body = match rx.await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            tracing::error!(err = %e, "compressing response failed");
            state.handler.failed(Cause::Encoding);
            return text(StatusCode::INTERNAL_SERVER_ERROR, "compression failed\n");
        }
        Err(_) => {
            tracing::error!("scrape ended without a body");
            state.handler.failed(Cause::Gathering);
            return text(StatusCode::INTERNAL_SERVER_ERROR, "scrape failed\n");
        }
    };
    let (body, gzipped) = body;
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
    if gzipped {
        r.headers_mut().insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    r
}

/// Gzips a body at the fast level.
pub fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4), flate2::Compression::fast());
    enc.write_all(body)?;
    enc.finish()
}

/// The sockets systemd passed (socket activation, `sd_listen_fds(3)`):
/// descriptors 3 to 3 + `LISTEN_FDS`, when `LISTEN_PID` is this process.
pub fn systemd_listeners() -> Result<Vec<TcpListener>, Error> {
    use std::os::fd::FromRawFd;
    let err = |msg: String| Error::Systemd(msg);
    let env = |k: &str, unset: &str| -> Result<u32, Error> {
        let v = std::env::var(k).map_err(|_| err(format!("{k} is not set{unset}")))?;
        v.trim().parse::<u32>().map_err(|_| err(format!("{k}={v:?} is not a number")))
    };
    let pid = env("LISTEN_PID", ": not started by systemd socket activation")?;
    if pid != std::process::id() {
        return Err(err(format!("LISTEN_PID is {pid}, not this process ({})", std::process::id())));
    }
    let n = env("LISTEN_FDS", "")?;
    let fds = listen_fd_range(n).map_err(err)?;
    let mut out = Vec::new();
    for fd in fds {
        // SAFETY: fcntl on a descriptor number; it fails on one not open.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(err(format!("descriptor {fd} is not open (LISTEN_FDS={n})")));
        }
        // Only a listening socket is taken: a descriptor the process opened
        // itself (systemd passed fewer than LISTEN_FDS says, so the number
        // went to something else) must not be wrapped and closed twice.
        let mut listening: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `listening`.
        let r =
            unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN, (&mut listening as *mut libc::c_int).cast(), &mut len) };
        if r < 0 || listening == 0 {
            return Err(err(format!("descriptor {fd} is not a listening socket (LISTEN_FDS={n})")));
        }
        // SAFETY: systemd hands these descriptors to this process, which
        // now owns them; nothing else uses them.
        let l = unsafe { std::net::TcpListener::from_raw_fd(fd) };
        // SAFETY: as above; FD_CLOEXEC is plain flag setting.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        l.set_nonblocking(true).map_err(|e| err(format!("descriptor {fd}: {e}")))?;
        out.push(TcpListener::from_std(l).map_err(|e| err(format!("descriptor {fd}: {e}")))?);
    }
    Ok(out)
}

/// The descriptors `LISTEN_FDS=n` names: 3 to 3 + n, with n at least 1 and
/// within what a process can hold (the kernel's nr_open ceiling, 2^20).
pub fn listen_fd_range(n: u32) -> Result<std::ops::Range<i32>, String> {
    const MAX: u32 = 1 << 20;
    match n {
        0 => Err("systemd passed no socket (LISTEN_FDS=0)".into()),
        n if n > MAX => Err(format!("LISTEN_FDS={n} is out of range (1 to {MAX})")),
        n => Ok(3..3 + n as i32),
    }
}

/// Binds every listen address (failing with the flag named).
pub async fn bind(listen: &[String]) -> Result<Vec<TcpListener>, Error> {
    let mut out = Vec::new();
    for l in listen {
        let addrs = crate::config::parse_listen(l).map_err(Error::Address)?;
        let mut bound = None;
        let mut last = None;
        for a in addrs {
            match bind_one(a) {
                Ok(s) => {
                    bound = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        match (bound, last) {
            (Some(s), _) => out.push(s),
            (None, Some(e)) => return Err(Error::Bind { addr: l.clone(), source: e }),
            (None, None) => return Err(Error::Address(format!("{l:?} resolves to nothing"))),
        }
    }
    Ok(out)
}

fn bind_one(a: SocketAddr) -> std::io::Result<TcpListener> {
    match listen(a) {
        Ok(s) => Ok(s),
        // No IPv6 on this host: a bare port falls back to every IPv4 interface.
        Err(e) if a.ip().is_unspecified() && a.is_ipv6() => {
            let v4 = SocketAddr::from(([0, 0, 0, 0], a.port()));
            listen(v4).map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

/// The listen backlog asked for: the kernel caps it at `net.core.somaxconn`
/// (4096 since Linux 5.4), so the accept queue is as long as the node
/// allows, as Go's listeners (node_exporter's) make it. tokio's default
/// is 1024: a flood of connections that filled it made the kernel drop
/// the SYNs of everyone else, the kubelet's probes included, each then
/// waiting a second for its retransmission.
const BACKLOG: u32 = 65535;

/// A listening socket on `a` (SO_REUSEADDR, as std's bind sets it), with
/// [`BACKLOG`].
fn listen(a: SocketAddr) -> std::io::Result<TcpListener> {
    let s = if a.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    s.set_reuseaddr(true)?;
    s.bind(a)?;
    s.listen(BACKLOG)
}

/// Connections open at once that count as a burst.
const BURST: usize = 256;

#[derive(Default)]
struct ConnectionMemory {
    /// The most connections open since the last look.
    peak: std::sync::atomic::AtomicUsize,
}

/// Serves until `shutdown` resolves, then lets in-flight requests finish
/// for up to `grace`.
pub async fn serve(listeners: Vec<TcpListener>, state: Arc<State>, shutdown: impl std::future::Future<Output = ()>, grace: Duration) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    type Accepted = (tokio::net::TcpStream, crate::admission::Ticket);
    let (conn_tx, mut conn_rx) = tokio::sync::mpsc::channel::<Accepted>(16);
    let memory = Arc::new(ConnectionMemory::default());
    for l in listeners {
        let tx = conn_tx.clone();
        let admission = Arc::clone(&state.admission);
        tokio::spawn(async move {
            loop {
                // Never waits for a slot: admission makes room by closing
                // the oldest idle connection, or refuses this one.
                match l.accept().await {
                    Ok((s, peer)) => {
                        let Some(ticket) = admission.admit(peer.ip()) else {
                            tracing::debug!(peer = %peer, "connection refused: every connection at the cap is busy");
                            continue;
                        };
                        if tx.send((s, ticket)).await.is_err() {
                            return;
                        }
                    }
                    // Out of descriptors (something beside the budget took
                    // them: crate::descriptors): the connection the cap
                    // would close goes, giving the listener one back.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) && admission.shed() => {
                        tracing::debug!(err = %e, "accept out of descriptors: a connection closed for it");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(e) => {
                        tracing::warn!(err = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
    }
    {
        // After a burst of connections, give their buffers back to the
        // system (every 5 s at most; the scraper trims after overlapping
        // scrapes itself: runtime::memory).
        let (m, admission) = (Arc::clone(&memory), Arc::clone(&state.admission));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                let open = admission.open();
                if m.peak.swap(open, std::sync::atomic::Ordering::Relaxed) >= BURST && open < BURST / 8 {
                    runtime::memory::trim();
                }
            }
        });
    }
    drop(conn_tx);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            c = conn_rx.recv() => {
                let Some((stream, ticket)) = c else { break };
                let _ = stream.set_nodelay(true);
                let open = state.admission.open();
                memory.peak.fetch_max(open, std::sync::atomic::Ordering::Relaxed);
                let web = state.web.current();
                let state = Arc::clone(&state);
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let slot = Arc::clone(&ticket.slot);
                    let tls = web.tls.clone();
                    drop(web);
                    // Closed at once when admission makes room for a newer
                    // connection (only while no request is in its handler).
                    tokio::select! {
                        _ = connection(stream, tls, state, Arc::clone(&slot), watcher) => {}
                        _ = slot.closed() => {}
                    }
                    drop(ticket);
                });
            }
            _ = &mut shutdown => {
                tracing::info!("shutting down");
                break;
            }
        }
    }
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(grace = ?grace, "connections still open after the grace period");
    }
}

/// Serves one admitted connection: its first byte within
/// [`FIRST_BYTE_TIMEOUT`], then TLS (if configured) and HTTP/1.
async fn connection(
    stream: tokio::net::TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: Arc<State>,
    slot: Arc<Slot>,
    watcher: hyper_util::server::graceful::Watcher,
) {
    // Peeked, not read: the byte stays for TLS or HTTP. (`readable()` may
    // report a socket ready with nothing to read.)
    match tokio::time::timeout(FIRST_BYTE_TIMEOUT, stream.peek(&mut [0u8; 1])).await {
        Ok(Ok(1..)) => {}
        Ok(_) => return,
        Err(_) => {
            state.admission.count(Closed::FirstByteTimeout);
            return;
        }
    }
    let peer = stream.peer_addr().map_or(IpAddr::from([0u8; 16]), |a| crate::admission::peer_key(a.ip()));
    let svc = service_fn(move |req| {
        let busy = slot.busy();
        let state = Arc::clone(&state);
        let slot = Arc::clone(&slot);
        async move {
            let r = handle(state, req, peer, &slot).await;
            drop(busy);
            r
        }
    });
    let builder = {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
        b
    };
    let res = match tls {
        None => watcher.watch(builder.serve_connection(TokioIo::new(WriteTimeout::new(stream, WRITE_TIMEOUT)), svc)).await,
        Some(cfg) => {
            // The handshake shares the header deadline.
            let accepted = tokio::time::timeout(HEADER_TIMEOUT, tokio_rustls::TlsAcceptor::from(cfg).accept(stream)).await;
            match accepted {
                Ok(Ok(s)) => watcher.watch(builder.serve_connection(TokioIo::new(WriteTimeout::new(s, WRITE_TIMEOUT)), svc)).await,
                Ok(Err(e)) => {
                    tracing::debug!(err = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            }
        }
    };
    if let Err(e) = res {
        tracing::debug!(err = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    /// Connections the kernel completes for a listener that accepts none
    /// fill its accept queue: past the backlog, it drops their SYNs. The
    /// agent's queue holds more than tokio's default 1024: as many as
    /// `net.core.somaxconn` lets it (up to 2048 tried here, fewer under a
    /// low open-file limit).
    #[test]
    fn the_accept_queue_is_as_long_as_the_node_allows() {
        let somaxconn: usize =
            std::fs::read_to_string("/proc/sys/net/core/somaxconn").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(128);
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the limit into `lim`.
        let nofile = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur as usize } else { 1024 };
        let want = somaxconn.min(2048).min(nofile.saturating_sub(64));
        assert!(want > 1025 || somaxconn <= 1024 || nofile < 1100, "somaxconn {somaxconn}, nofile {nofile}");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let l = rt.block_on(async { super::bind_one("127.0.0.1:0".parse().unwrap()) }).unwrap();
        let addr = l.local_addr().unwrap();
        let mut held = Vec::with_capacity(want);
        // The queue holds backlog + 1 connections (the kernel's test is
        // "more than the backlog").
        for i in 0..want {
            match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(500)) {
                Ok(c) => held.push(c),
                Err(e) => panic!("connection {i} of {want} not completed ({e}): the accept queue is shorter than the node allows"),
            }
        }
        drop(l);
    }

    #[test]
    fn listen_fds_range_is_bounded() {
        assert_eq!(super::listen_fd_range(1), Ok(3..4));
        assert_eq!(super::listen_fd_range(2), Ok(3..5));
        assert!(super::listen_fd_range(0).is_err());
        for wraps in [u32::MAX, i32::MAX as u32, (1 << 20) + 1] {
            assert!(super::listen_fd_range(wraps).unwrap_err().contains("out of range"), "{wraps}");
        }
    }

    #[test]
    fn parses_selection() {
        let s = super::selection(Some("collect%5B%5D=cpu&collect[]=meminfo&x=1"));
        assert_eq!(s.include, vec!["cpu", "meminfo"]);
        assert!(s.exclude.is_empty());
        let s = super::selection(None);
        assert!(s.include.is_empty());
    }

    #[test]
    fn negotiates() {
        use expo::Format;
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Text);
        assert_eq!(Format::negotiate(None), Format::Text);
    }
}
