//! The upstream client keeps the connections a wave of calls opened (issue #23).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::routing::get;
use tokio::sync::Barrier;

/// More calls at once than the 256 idle connections the pool used to keep (560 sockets
/// in this process, within the usual limit of 1,024).
const WAVE: usize = 280;

#[derive(Clone)]
struct Server {
    /// One client address per TCP connection.
    peers: Arc<Mutex<HashSet<SocketAddr>>>,
    /// Every call of a wave is answered only once the whole wave has arrived, so that
    /// all of them are in flight together however slow the machine.
    wave: Arc<Barrier>,
}

async fn answer(
    State(s): State<Server>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> &'static str {
    s.peers.lock().unwrap().insert(peer);
    s.wave.wait().await;
    "ok"
}

/// `WAVE` calls at once through `client`, each read to its end; a wave that cannot end
/// (a call that never reached the server holds the others at the barrier) fails.
async fn wave(client: &reqwest::Client, url: &str) {
    let calls = (0..WAVE).map(|_| async {
        let r = client.get(url).send().await.unwrap();
        assert_eq!(r.text().await.unwrap(), "ok");
    });
    let all = futures_util::future::join_all(calls);
    tokio::time::timeout(std::time::Duration::from_secs(30), all)
        .await
        .expect("a wave of calls ended");
}

#[tokio::test]
async fn a_second_wave_of_calls_finds_the_first_waves_connections() {
    let server = Server {
        peers: Arc::default(),
        wave: Arc::new(Barrier::new(WAVE)),
    };
    let app = Router::new()
        .route("/", get(answer))
        .with_state(server.clone());
    // A queue that holds the whole wave: one that drops SYNs leaves calls waiting for a
    // connection another call has freed.
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
    wave(&client, &url).await;
    let first = server.peers.lock().unwrap().len();
    assert_eq!(first, WAVE, "the first wave opens one connection a call");
    // Let the last answers' connections go back to the pool (on this one thread, within
    // a few turns of it; a second leaves room for a loaded machine).
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    wave(&client, &url).await;
    let both = server.peers.lock().unwrap().len();
    assert_eq!(
        both,
        WAVE,
        "the second wave opened {} connections",
        both - WAVE
    );
}
