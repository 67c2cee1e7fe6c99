//! Supervision of the embedded `redis-server`: launching it (after the
//! already-running check) from one long-lived spawner thread, and restarting
//! it with backoff whenever it dies unexpectedly, until cancelled.

use std::fs;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::launcher::{self, Launch, LaunchError, Listen, RedisServer};
use super::{EmbeddedError, Inner, PORT_FILE_NAME};

/// How long a clean shutdown (which fsyncs the AOF) may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// First delay before restarting a crashed server.
const RESTART_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest delay between restart attempts.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A child that ran at least this long resets the restart backoff.
const STABLE_RUN: Duration = Duration::from_secs(30);

impl Inner {
    /// Spawns a child and waits until it answers PING. `Ok(None)` means the
    /// token was cancelled meanwhile (the child is then shut down again).
    pub(super) async fn launch(
        &self,
        spawner: &Spawner,
        cancel: &CancellationToken,
    ) -> Result<Option<RedisServer>, EmbeddedError> {
        self.preflight().await?;
        let mut server = spawner.spawn(self.launch.clone()).await?;
        let pid = server.pid().and_then(|p| i32::try_from(p).ok());
        self.pid.store(pid.unwrap_or(0), Ordering::SeqCst);
        if let Listen::Port(port) = self.listen {
            let path = self.data_dir.join(PORT_FILE_NAME);
            if let Err(e) = fs::write(&path, format!("{port}\n")) {
                tracing::warn!(path = %path.display(), error = %e, "could not record embedded redis port");
            }
        }
        let ready = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            ready = server.wait_ready_async() => Some(ready),
        };
        match ready {
            Some(Ok(())) => Ok(Some(server)),
            None => {
                self.terminate(&mut server).await;
                Ok(None)
            }
            Some(Err(e)) => {
                self.terminate(&mut server).await;
                Err(e.into())
            }
        }
    }

    /// Clean shutdown of `server`: SIGTERM (redis fsyncs the AOF), bounded
    /// wait, then SIGKILL.
    async fn terminate(&self, server: &mut RedisServer) {
        if !server.terminate_async(STOP_TIMEOUT).await {
            tracing::warn!(timeout = ?STOP_TIMEOUT, "embedded redis-server ignored SIGTERM; it was sent SIGKILL");
        }
        self.pid.store(0, Ordering::SeqCst);
    }
}

/// Watches the child and restarts it with backoff until `cancel` fires, then
/// shuts it down.
pub(super) async fn supervise(
    inner: Arc<Inner>,
    spawner: Spawner,
    mut server: RedisServer,
    cancel: CancellationToken,
) {
    let mut backoff = RESTART_BACKOFF_MIN;
    loop {
        let started = Instant::now();
        let status = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                inner.terminate(&mut server).await;
                return;
            }
            status = server.exited() => status,
        };
        inner.pid.store(0, Ordering::SeqCst);
        if cancel.is_cancelled() {
            return;
        }
        if started.elapsed() >= STABLE_RUN {
            backoff = RESTART_BACKOFF_MIN;
        }
        let status = match status {
            Ok(status) => describe_status(status),
            Err(e) => format!("unknown ({e})"),
        };
        tracing::error!(
            status = %status,
            log = %inner.log_path.display(),
            restart_in = ?backoff,
            "embedded redis-server exited unexpectedly; last lines of its log:\n{}",
            launcher::log_tail(&inner.log_path, launcher::LOG_TAIL_LINES)
        );
        match restart(&inner, &spawner, &cancel, &mut backoff).await {
            Some(new_server) => server = new_server,
            None => return,
        }
    }
}

/// Relaunches after `backoff`, doubling it after each failed attempt, until a
/// child is ready (`Some`) or `cancel` fires (`None`).
async fn restart(
    inner: &Inner,
    spawner: &Spawner,
    cancel: &CancellationToken,
    backoff: &mut Duration,
) -> Option<RedisServer> {
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return None,
            _ = tokio::time::sleep(*backoff) => {}
        }
        *backoff = (*backoff * 2).min(RESTART_BACKOFF_MAX);
        match inner.launch(spawner, cancel).await {
            Ok(Some(server)) => {
                tracing::info!(url = %inner.url, "embedded redis-server restarted");
                return Some(server);
            }
            Ok(None) => return None,
            Err(e) => {
                tracing::error!(error = %e, restart_in = ?backoff, "restarting embedded redis-server failed");
            }
        }
    }
}

/// Exit status as text, naming the signal if there was one.
fn describe_status(status: ExitStatus) -> String {
    match status.signal() {
        Some(sig) => format!("killed by signal {sig}"),
        None => status.to_string(),
    }
}

/// A request to the spawner thread: how to launch, and where to send the child.
type SpawnRequest = (Launch, oneshot::Sender<Result<RedisServer, LaunchError>>);

/// Spawns children from one dedicated thread that lives as long as the
/// supervisor: `PR_SET_PDEATHSIG` fires when the *thread* that forked the
/// child exits, and tokio's worker and blocking-pool threads come and go.
#[derive(Debug)]
pub(super) struct Spawner {
    /// Requests to the thread; dropping it ends the thread.
    tx: std::sync::mpsc::Sender<SpawnRequest>,
}

impl Spawner {
    /// Starts the thread.
    pub(super) fn new() -> io::Result<Spawner> {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("embedded-redis-spawner".into())
            .spawn(move || {
                while let Ok((launch, reply)) = rx.recv() {
                    // If nobody waits any more, dropping the server signals it.
                    let _ = reply.send(launch.spawn());
                }
            })?;
        Ok(Spawner { tx })
    }

    /// Spawns a child per `launch` on the spawner thread (not yet ready).
    async fn spawn(&self, launch: Launch) -> Result<RedisServer, EmbeddedError> {
        let gone = || {
            EmbeddedError::Io(
                "spawning redis-server".into(),
                io::Error::other("redis-server spawner thread is gone"),
            )
        };
        let (reply, rx) = oneshot::channel();
        self.tx.send((launch, reply)).map_err(|_| gone())?;
        Ok(rx.await.map_err(|_| gone())??)
    }
}
