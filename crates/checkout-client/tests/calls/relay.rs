//! A TCP relay between the client and a test checkout, to fail the transport for real: it
//! copies bytes both ways, counts the connections it accepted, and on demand resets every
//! connection open through it (RST to the client, the upstream connection dropped), as a
//! crashed proxy or a broken network path would.

use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the relay shares with its connection tasks.
#[derive(Debug, Default)]
struct State {
    /// Connections accepted so far.
    accepted: usize,
    /// The tasks copying the open connections; aborting one drops both its sockets.
    open: Vec<JoinHandle<()>>,
}

/// A running relay.
pub struct Relay {
    /// Where it listens (`http://127.0.0.1:port`).
    pub uri: String,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Relays every connection made to it to `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> Relay {
        let upstream = upstream
            .strip_prefix("http://")
            .expect("a plaintext upstream")
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let uri = format!("http://{}", listener.local_addr().expect("relay address"));
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                // On close (when the task is aborted), send RST rather than FIN: a reset.
                client
                    .set_zero_linger()
                    .expect("SO_LINGER 0 on the client side");
                let upstream = upstream.clone();
                let copying = tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ended = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                let mut state = shared.lock().expect("relay state");
                state.accepted += 1;
                state.open.push(copying);
            }
        });
        Relay { uri, state, task }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.lock().expect("relay state").accepted
    }

    /// Resets every connection open through the relay now; new ones are relayed as before.
    pub fn reset_all(&self) {
        for copying in self.state.lock().expect("relay state").open.drain(..) {
            copying.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
        self.reset_all();
    }
}
