//! The HTTP server: /metrics (Prometheus text or OpenMetrics, gzip,
//! `collect[]`/`exclude[]`), /healthz, /readyz and a landing page, over hyper.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use expo::Format;
use host::scrape::{Scraper, Selection};

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
}

/// What the handler needs.
pub struct State {
    pub scraper: Arc<Scraper>,
    pub telemetry_path: String,
    /// `None`: no limit.
    pub limit: Option<Arc<Semaphore>>,
    /// TLS and basic auth (`--web.config.file`), re-read when it changes.
    pub web: crate::webconfig::Handle,
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

/// Handles one request: authentication, then the route, then the
/// configured response headers.
pub async fn handle(
    state: Arc<State>,
    web: Arc<crate::webconfig::Loaded>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let auth = req.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let mut resp = if web.authorize(auth) == crate::webconfig::Auth::Denied {
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
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    let path = req.uri().path();
    if path == state.telemetry_path {
        return metrics(state, &req).await;
    }
    match path {
        "/" => landing(state),
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => text(StatusCode::OK, "ready\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

async fn metrics(state: &State, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let _permit = match &state.limit {
        Some(sem) => match Arc::clone(sem).try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                return text(StatusCode::SERVICE_UNAVAILABLE, "Limit of concurrent requests reached, try again later.\n");
            }
        },
        None => None,
    };
    let sel = selection(req.uri().query());
    if let Err(e) = state.scraper.validate(&sel) {
        return text(StatusCode::BAD_REQUEST, format!("couldn't create filtered metrics handler: {e}\n"));
    }
    let header = |h| req.headers().get(h).and_then(|v: &HeaderValue| v.to_str().ok());
    let format = Format::negotiate(header(ACCEPT));
    let gzip_ok = header(ACCEPT_ENCODING).is_some_and(|v| v.split(',').any(|e| e.trim().starts_with("gzip")));
    let scraper = Arc::clone(&state.scraper);
    // Collectors do blocking file I/O: keep it off the async workers.
    let body = match tokio::task::spawn_blocking(move || {
        let body = scraper.scrape(&sel, format);
        if gzip_ok {
            gzip(&body).map(|b| (b, true))
        } else {
            Ok((body, false))
        }
    })
    .await
    {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            tracing::error!(err = %e, "compressing response failed");
            return text(StatusCode::INTERNAL_SERVER_ERROR, "compression failed\n");
        }
        Err(e) => {
            tracing::error!(err = %e, "scrape task failed");
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

/// Binds every listen address (failing with the flag named).
pub async fn bind(listen: &[String]) -> Result<Vec<TcpListener>, Error> {
    let mut out = Vec::new();
    for l in listen {
        let addrs = crate::config::parse_listen(l).map_err(Error::Address)?;
        let mut bound = None;
        let mut last = None;
        for a in addrs {
            match bind_one(a).await {
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

async fn bind_one(a: SocketAddr) -> std::io::Result<TcpListener> {
    match TcpListener::bind(a).await {
        Ok(s) => Ok(s),
        // No IPv6 on this host: a bare port falls back to every IPv4 interface.
        Err(e) if a.ip().is_unspecified() && a.is_ipv6() => {
            let v4 = SocketAddr::from(([0, 0, 0, 0], a.port()));
            TcpListener::bind(v4).await.map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

/// Serves until `shutdown` resolves, then lets in-flight requests finish
/// for up to `grace`.
pub async fn serve(listeners: Vec<TcpListener>, state: Arc<State>, shutdown: impl std::future::Future<Output = ()>, grace: Duration) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let (conn_tx, mut conn_rx) = tokio::sync::mpsc::channel::<(tokio::net::TcpStream, SocketAddr)>(256);
    for l in listeners {
        let tx = conn_tx.clone();
        tokio::spawn(async move {
            loop {
                match l.accept().await {
                    Ok(c) => {
                        if tx.send(c).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(err = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
    }
    drop(conn_tx);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            c = conn_rx.recv() => {
                let Some((stream, _peer)) = c else { break };
                let _ = stream.set_nodelay(true);
                let web = state.web.current();
                let state = Arc::clone(&state);
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let tls = web.tls.clone();
                    let svc_web = Arc::clone(&web);
                    let svc = service_fn(move |req| handle(Arc::clone(&state), Arc::clone(&svc_web), req));
                    let builder = {
                        let mut b = hyper::server::conn::http1::Builder::new();
                        b.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(Duration::from_secs(10));
                        b
                    };
                    let res = match tls {
                        None => watcher.watch(builder.serve_connection(TokioIo::new(stream), svc)).await,
                        Some(cfg) => {
                            // The handshake shares the header deadline.
                            let accepted = tokio::time::timeout(Duration::from_secs(10), tokio_rustls::TlsAcceptor::from(cfg).accept(stream)).await;
                            match accepted {
                                Ok(Ok(s)) => watcher.watch(builder.serve_connection(TokioIo::new(s), svc)).await,
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

#[cfg(test)]
mod tests {
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
