//! The upstream client keeps the connections a wave of calls opened (issue #23).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::routing::get;

type Peers = Arc<Mutex<HashSet<SocketAddr>>>;

/// Answers after 150 ms (so that a wave's calls overlap), noting each connection by
/// its client address: one address per TCP connection.
async fn slow(
    State(peers): State<Peers>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> &'static str {
    peers.lock().unwrap().insert(peer);
    tokio::time::sleep(Duration::from_millis(150)).await;
    "ok"
}

/// `n` calls at once through `client`, each read to its end.
async fn wave(client: &reqwest::Client, url: &str, n: usize) {
    let calls = (0..n).map(|_| async {
        let r = client.get(url).send().await.unwrap();
        assert_eq!(r.text().await.unwrap(), "ok");
    });
    futures_util::future::join_all(calls).await;
}

#[tokio::test]
async fn a_second_wave_of_calls_finds_the_first_waves_connections() {
    let peers = Peers::default();
    let app = Router::new()
        .route("/", get(slow))
        .with_state(peers.clone());
    // A queue that holds the whole wave: one that drops SYNs makes calls wait for a
    // connection another call has freed, and the waves open fewer than they make.
    let listener = crate::http::listener(([127, 0, 0, 1], 0).into(), 1024).unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let client = super::http_client().unwrap();
    // More at once than the 256 idle connections the pool used to keep (560 sockets in
    // this process, within the usual limit of 1,024).
    let n = 280;
    wave(&client, &url, n).await;
    let first = peers.lock().unwrap().len();
    assert_eq!(first, n, "the first wave opens one connection a call");
    // Let the last answers' connections go back to the pool.
    tokio::time::sleep(Duration::from_millis(100)).await;
    wave(&client, &url, n).await;
    let both = peers.lock().unwrap().len();
    assert_eq!(both, n, "the second wave opened {} connections", both - n);
}
