//! A TCP relay on 127.0.0.1:0 in front of a real server, which a test cuts and restores: the
//! network between the service and its database, failing the way a partition does.
//!
//! Cut, every relayed connection is closed at once and new connections are accepted but never
//! relayed (a connect "succeeds", then nothing answers, as behind a dead route); restored,
//! connections are relayed again (those held while it was cut included).

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// See the module docs. Stops relaying when dropped.
pub struct Proxy {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Relays 127.0.0.1:<random port> to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (open, _) = watch::channel(true);
        let accept = tokio::spawn({
            let open = open.clone();
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    tokio::spawn(relay(inbound, upstream, open.subscribe()));
                }
            }
        });
        Self { addr, open, accept }
    }

    /// Where the service should connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every relayed connection and stops relaying.
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Relays again.
    pub fn restore(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// One connection: held while cut, relayed while open, closed at the next cut.
async fn relay(mut inbound: TcpStream, upstream: SocketAddr, mut open: watch::Receiver<bool>) {
    if open.wait_for(|open| *open).await.is_err() {
        return;
    }
    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = open.wait_for(|open| !*open) => {}
    }
    // Both sockets close here.
}
