//! A fault-injecting TCP proxy for the PostgreSQL tests: purser connects to it instead
//! of the server, and a test can cut the database (every connection closed, new ones
//! refused), slow it down, or let one `COMMIT` through and drop the server's answer to
//! it (the transaction is committed; the client never learns it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Default)]
struct Faults {
    cut: AtomicBool,
    delay_ms: AtomicU64,
    /// `COMMIT` answers still to drop.
    drop_commit_replies: AtomicUsize,
    /// `COMMIT` answers dropped so far.
    dropped: AtomicUsize,
}

pub struct FaultProxy {
    pub addr: SocketAddr,
    faults: Arc<Faults>,
    /// Bumped to close every open connection.
    kill: watch::Sender<u64>,
}

impl FaultProxy {
    /// A proxy on a free loopback port forwarding to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let faults = Arc::new(Faults::default());
        let (kill, _) = watch::channel(0u64);
        let upstream = upstream.to_string();
        let (f, k) = (faults.clone(), kill.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if f.cut.load(Ordering::SeqCst) {
                    drop(client); // refused while cut
                    continue;
                }
                let (f, up, kill) = (f.clone(), upstream.clone(), k.subscribe());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&up).await {
                        relay(client, server, f, kill).await;
                    }
                });
            }
        });
        FaultProxy { addr, faults, kill }
    }

    /// `url` (a PostgreSQL URL on 127.0.0.1:5432 or localhost:5432) through this proxy.
    pub fn url(&self, url: &str) -> String {
        let port = self.addr.port();
        url.replace("127.0.0.1:5432", &format!("127.0.0.1:{port}"))
            .replace("localhost:5432", &format!("127.0.0.1:{port}"))
    }

    /// The database disappears: open connections are closed, new ones refused.
    pub fn cut(&self) {
        self.faults.cut.store(true, Ordering::SeqCst);
        self.kill.send_modify(|g| *g += 1);
    }

    /// The database is back.
    pub fn restore(&self) {
        self.faults.cut.store(false, Ordering::SeqCst);
    }

    /// Every piece of traffic waits this long before it is passed on.
    pub fn delay(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.faults.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// The next `n` `COMMIT`s reach the server, and their answers are dropped with the
    /// connection once the server has confirmed them.
    pub fn drop_commit_replies(&self, n: usize) {
        self.faults.drop_commit_replies.store(n, Ordering::SeqCst);
    }

    pub fn commit_replies_dropped(&self) -> usize {
        self.faults.dropped.load(Ordering::SeqCst)
    }
}

/// A `COMMIT` as a simple query and as the server's completion of it.
const COMMIT: &[u8] = b"COMMIT\0";

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    f: Arc<Faults>,
    mut kill: watch::Receiver<u64>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // Set when a `COMMIT` this connection sent is to have its answer dropped.
    let armed = Arc::new(AtomicBool::new(false));
    let up = {
        let (f, armed) = (f.clone(), armed.clone());
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut tail: Vec<u8> = Vec::new();
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                // Search across reads: a message may be split between two.
                tail.extend_from_slice(&buf[..n]);
                if contains(&tail, COMMIT)
                    && f.drop_commit_replies
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| k.checked_sub(1))
                        .is_ok()
                {
                    armed.store(true, Ordering::SeqCst);
                }
                let keep = tail.len().saturating_sub(COMMIT.len());
                tail.drain(..keep);
                pause(&f).await;
                if sw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = {
        let (f, armed) = (f.clone(), armed.clone());
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut held: Vec<u8> = Vec::new();
            loop {
                let n = match sr.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if armed.load(Ordering::SeqCst) {
                    // Hold the answers back until the server says it committed, then
                    // drop them all and the connection with them.
                    held.extend_from_slice(&buf[..n]);
                    if contains(&held, COMMIT) {
                        f.dropped.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    continue;
                }
                pause(&f).await;
                if cw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
        _ = kill.changed() => {}
    }
}

async fn pause(f: &Faults) {
    let ms = f.delay_ms.load(Ordering::SeqCst);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
