//! Test support: real Redis servers (see `redis`), the service in-process or
//! as a child process, and waiting for events with deadlines.
#![allow(dead_code)]

pub mod browser;
pub mod cli;
pub mod cluster;
pub mod layout;
pub mod load;
pub mod policy;
pub mod proxy;
pub mod python;
pub mod redis;
pub mod scrape;
pub mod tls;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batcher::batch::{Batch, StreamId};
use batcher::config::Config;
use batcher::keys::Keyspace;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
use batcher::policy::PolicyHandle;
use batcher::store::{Endpoint, RedisTarget, Store, Timeouts};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub use self::redis::RedisServer;

/// A deadline long enough for a loaded CI machine, short enough to fail fast.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A config for tests against `url`: `extra` TOML (top-level keys, then
/// tables other than `[redis]`), then the `[redis]` table. `[http] listen`
/// is 127.0.0.1:0, so parallel tests never collide on the default port.
pub fn config(url: &str, extra: &str) -> Config {
    let text = config_text(url, extra);
    let mut config =
        Config::parse(&text, "test.toml").unwrap_or_else(|e| panic!("test config: {e}"));
    config.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config
}

/// The text of [`config`], for a config file: `extra`, then `[redis]` with
/// `url` and the tests' 4 shards.
pub fn config_text(url: &str, extra: &str) -> String {
    format!("{extra}\n[redis]\nurl = \"{url}\"\nshards = 4\n")
}

/// Writes `text` as `batcher.toml` in `dir` and starts `batcher serve` on
/// it, logging into `dir` too.
pub async fn process_with(dir: &Path, text: &str) -> Process {
    let path = dir.join("batcher.toml");
    std::fs::write(&path, text).expect("write the config file");
    Process::start(&path, dir).await
}

/// The service running in this process on a free port.
pub struct Service {
    pub addr: SocketAddr,
    /// Where `GET /metrics` is served (a free port too); None when the
    /// config disables `[http]`.
    pub http_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<Result<(), batcher::server::ServerError>>,
}

impl Service {
    /// Starts the service with `config` on 127.0.0.1:0, and its HTTP
    /// listener (unless disabled) on another free port, whatever
    /// `[http] listen` says.
    pub async fn start(config: Config) -> Service {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await;
        Service::start_on(listener.expect("bind"), config).await
    }

    /// [`Service::start`] on `listener`: a test that binds a fixed address
    /// can stop the service and start another where its clients point.
    pub async fn start_on(listener: tokio::net::TcpListener, config: Config) -> Service {
        let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let http = match config.http.enabled {
            true => Some(bind().await.expect("bind http")),
            false => None,
        };
        let http_addr = http.as_ref().map(|l| l.local_addr().expect("local addr"));
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(batcher::server::run(
            listener,
            http,
            config,
            None,
            shutdown.clone(),
        ));
        Service {
            addr,
            http_addr,
            shutdown,
            handle,
        }
    }

    /// A connected client.
    pub async fn client(&self) -> BatcherClient<Channel> {
        client(self.addr).await
    }

    /// Stops the service and checks that it shut down cleanly, in time.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(DEADLINE, self.handle)
            .await
            .expect("service did not stop within the deadline")
            .expect("service task panicked");
        result.expect("service returned an error");
    }
}

/// A loopback port held for a service that restarts. It is bound with
/// SO_REUSEPORT, so the next holder can bind it while a service still
/// listens on it, and while none listens, no client's ephemeral port (nor a
/// client connecting to itself) can take it.
pub struct HeldPort {
    socket: tokio::net::TcpSocket,
    pub addr: SocketAddr,
}

impl HeldPort {
    /// Holds a free loopback port.
    pub fn new() -> HeldPort {
        HeldPort::at(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Holds `addr` too, beside its current holder.
    pub fn at(addr: SocketAddr) -> HeldPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_reuseport(true).expect("SO_REUSEPORT");
        socket.bind(addr).expect("bind a held port");
        let addr = socket.local_addr().expect("local addr");
        HeldPort { socket, addr }
    }

    /// Starts listening, for a service to serve on.
    pub fn listen(self) -> tokio::net::TcpListener {
        self.socket.listen(1024).expect("listen")
    }
}

/// The error that stops the service from starting on `config`.
pub async fn start_error(config: Config) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let run = batcher::server::run(listener, None, config, None, CancellationToken::new());
    let result = tokio::time::timeout(DEADLINE, run).await;
    result
        .expect("the start did not fail in time")
        .unwrap_err()
        .to_string()
}

/// A client connected to `addr`, retrying until the server listens.
pub async fn client(addr: SocketAddr) -> BatcherClient<Channel> {
    let url = format!("http://{addr}");
    eventually("the service to accept connections", || {
        let url = url.clone();
        async move { BatcherClient::connect(url).await.ok() }
    })
    .await
}

/// A plaintext channel to `addr`; it connects on first use, so `addr` must
/// be bound already (a service's listener is bound before it starts).
pub fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("a URI")
        .connect_lazy()
}

/// Polls `probe` until it returns Some, or panics after DEADLINE.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// The stream of `shard` under the default prefix and the tests' 4 shards.
pub fn stream_key(shard: u16) -> String {
    Keyspace::new("batcher", 4).shard(shard).stream
}

/// Waits until the standard health service reports `want` for the Batcher
/// service at `addr`.
pub async fn wait_health(
    addr: SocketAddr,
    want: tonic_health::pb::health_check_response::ServingStatus,
) {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let health = HealthClient::new(channel(addr));
    eventually(&format!("health to report {want:?}"), || {
        let mut health = health.clone();
        async move {
            let service = "batcher.v1.Batcher".to_owned();
            let resp = health.check(HealthCheckRequest { service }).await.ok()?;
            (resp.into_inner().status == want as i32).then_some(())
        }
    })
    .await;
}

/// Builds an AddRequest.
pub fn add(key: &str, id: &str, payload: &[u8]) -> pb::AddRequest {
    pb::AddRequest {
        key: key.into(),
        item: Some(pb::Item {
            id: id.to_string(),
            payload: payload.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Receives the next batch from a subscription, or panics after DEADLINE.
pub async fn next_batch(stream: &mut tonic::Streaming<pb::Batch>) -> pb::Batch {
    tokio::time::timeout(DEADLINE, stream.message())
        .await
        .expect("no batch arrived within the deadline")
        .expect("subscription failed")
        .expect("subscription ended")
}

/// A store over the same Redis as `config`, for reading state directly.
pub fn store(config: &Config) -> Store {
    let endpoint = match &config.redis.url {
        Some(url) => Endpoint::Single(url.clone()),
        None => Endpoint::Cluster(config.redis.cluster_nodes.clone()),
    };
    let target = RedisTarget {
        endpoint,
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(5),
        },
        wait: None,
        tls_ca: config
            .redis
            .tls_ca_file
            .as_ref()
            .map(|f| std::fs::read(f).unwrap()),
        password: None,
    };
    Store::open(
        &target,
        Keyspace::new(&config.redis.prefix, config.redis.shards.get()),
        config.dedup.window,
        PolicyHandle::new(config.policies()),
    )
    .expect("store")
}

/// Every batch retained in every shard stream, in stream order per shard.
pub async fn all_batches(store: &Store) -> Vec<Batch> {
    let mut out = Vec::new();
    for shard in 0..store.keyspace().shards() {
        let mut after = StreamId::ZERO;
        loop {
            let page = store
                .read_batches(shard, after, 1000)
                .await
                .expect("read stream");
            let Some(last) = page.last() else { break };
            after = last.stream_id;
            out.extend(page);
        }
    }
    out
}

/// How many batches hold each (key, item id), over all retained batches.
pub fn placements(batches: &[Batch]) -> HashMap<(String, String), usize> {
    let mut seen = HashMap::new();
    for batch in batches {
        for item in &batch.items {
            *seen
                .entry((
                    batch.key.clone(),
                    String::from_utf8_lossy(&item.id).into_owned(),
                ))
                .or_insert(0) += 1;
        }
    }
    seen
}

/// The `batcher` binary as a child process.
pub struct Process {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

impl Process {
    /// Starts `batcher serve --config <path>` on a free port (and its HTTP
    /// listener on another) and waits until it accepts gRPC connections.
    pub async fn start(config_path: &Path, log_dir: &Path) -> Process {
        Process::start_logging(config_path, log_dir, "info").await
    }

    /// [`Process::start`], with `RUST_LOG` set to `rust_log`.
    pub async fn start_logging(config_path: &Path, log_dir: &Path, rust_log: &str) -> Process {
        let process = Process::spawn_logging(config_path, log_dir, rust_log).await;
        client(process.addr).await;
        process
    }

    /// Starts `batcher serve --config <path>` on a free port and waits until
    /// it has bound it, but not until it serves (a TLS port needs a client
    /// of its own to tell when it is up).
    pub async fn spawn(config_path: &Path, log_dir: &Path) -> Process {
        Process::spawn_logging(config_path, log_dir, "info").await
    }

    /// [`Process::spawn`], with `RUST_LOG` set to `rust_log`. The process
    /// binds port 0 itself and logs the address it got, so no other bind can
    /// take its port between a probe and its own bind.
    async fn spawn_logging(config_path: &Path, log_dir: &Path, rust_log: &str) -> Process {
        static SPAWNED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SPAWNED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = log_dir.join(format!("batcher-{}-{n}.log", std::process::id()));
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_batcher"))
            .args(["serve", "--config"])
            .arg(config_path)
            .args(["--listen", "127.0.0.1:0"])
            .args(["--http-listen", "127.0.0.1:0"])
            .env("RUST_LOG", rust_log)
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn batcher");
        let unbound = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut process = Process {
            child,
            addr: unbound,
            log,
        };
        process.addr = process.logged_addr("serving", "the gRPC port").await;
        process
    }

    /// The address on the first line of the log whose message is exactly
    /// `message` (in text or JSON logs), once the process has logged it.
    /// Panics with the log if the process exits first, or after DEADLINE.
    async fn logged_addr(&mut self, message: &str, what: &str) -> SocketAddr {
        let start = Instant::now();
        // The text form, colours removed: "LEVEL target: message addr=...".
        let text_form = format!(": {message} addr=");
        let json_form = format!("\"message\":\"{message}\"");
        loop {
            let log = self.log();
            let line = log
                .lines()
                .map(without_colours)
                .find(|l| l.contains(&text_form) || l.contains(&json_form));
            if let Some(addr) = line.as_deref().and_then(loopback_addr) {
                return addr;
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!("batcher exited ({status}) before it logged {what}:\n{log}");
            }
            assert!(
                start.elapsed() < DEADLINE,
                "batcher did not log {what} within the deadline:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends a signal to the process.
    pub fn signal(&self, signal: i32) {
        let rc = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(rc, 0, "kill({signal}) failed");
    }

    /// Waits, until DEADLINE, for the process to exit; its exit status.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let child = &mut self.child;
        let log = &self.log;
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "the process did not exit within the deadline; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the process with SIGTERM and checks that it exits cleanly, in time.
    pub async fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit().await;
        assert!(
            status.success(),
            "exit {status:?}; its log:\n{}",
            self.log()
        );
    }

    /// SIGKILLs the process and reaps it.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        self.child.wait().expect("wait");
    }

    /// The process's log so far. Panics when the log cannot be read, so a
    /// check that a line is absent cannot pass on a failed read.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.log.display()))
    }

    /// Where the process serves HTTP (`GET /metrics`): the address its log
    /// gives once the listener is bound. A child process has a metrics
    /// recorder of its own, so its counters move only with its own calls.
    pub async fn http_addr(&mut self) -> SocketAddr {
        let message = "serving http (GET /metrics, the web view at /)";
        self.logged_addr(message, "its HTTP port").await
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `line` without its ANSI colour sequences (`ESC [ ... m`).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// The first `127.0.0.1:PORT` in a log line.
fn loopback_addr(line: &str) -> Option<SocketAddr> {
    let at = line.find("127.0.0.1:")?;
    let addr: String = line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    addr.parse().ok()
}

/// Asserts that `status` is INVALID_ARGUMENT with a message naming `field`,
/// an `ErrorInfo` (reason INVALID_FIELD, domain batcher) and a `BadRequest`
/// whose first violation is `field`.
#[track_caller]
pub fn assert_invalid(status: &tonic::Status, field: &str) {
    use tonic_types::StatusExt;
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "{field}: {status:?}"
    );
    assert!(
        status.message().starts_with(&format!("{field}:")),
        "expected a message naming {field}: {}",
        status.message()
    );
    assert_error_info(status, "INVALID_FIELD");
    let bad = status
        .get_details_bad_request()
        .expect("a BadRequest detail");
    assert_eq!(bad.field_violations[0].field, field, "{bad:?}");
}

/// Asserts that `status` carries a `google.rpc.ErrorInfo` with `reason` in
/// the `batcher` domain, and returns its metadata.
#[track_caller]
pub fn assert_error_info(status: &tonic::Status, reason: &str) -> HashMap<String, String> {
    use tonic_types::StatusExt;
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.reason, reason, "{status:?}");
    assert_eq!(info.domain, "batcher", "{status:?}");
    info.metadata
}

/// The commands a script call can be counted under.
const SCRIPT_CALLS: &[&str] = &["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"];

/// Waits until each of the 4 test shards' sweepers has scanned once: before
/// any add, the sweepers' due scans are the only scripts run on a fresh
/// Redis, and each scans once before its first sleep.
pub async fn wait_for_first_sweeps(redis: &RedisServer) {
    eventually("each sweeper's first scan", || {
        let scans = command_calls(redis, SCRIPT_CALLS);
        async move { (scans >= 4).then_some(()) }
    })
    .await;
}

/// How many times Redis has run the named commands successfully so far
/// (from INFO commandstats; failed calls are not counted). Lets a test wait
/// for work the service does on its own, such as a sweep or a trim.
pub fn command_calls(redis: &RedisServer, commands: &[&str]) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    let mut total = 0;
    for line in stats.lines() {
        let Some((name, fields)) = line.trim().split_once(':') else {
            continue;
        };
        let Some(name) = name.strip_prefix("cmdstat_") else {
            continue;
        };
        if !commands.contains(&name) {
            continue;
        }
        let field = |wanted: &str| -> u64 {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(wanted)?.strip_prefix('='))
                .map_or(0, |v| v.parse().expect("a commandstats counter"))
        };
        total += field("calls") - field("failed_calls");
    }
    total
}

/// Waits until Redis has run the named commands `more` further times.
pub async fn wait_for_calls(redis: &RedisServer, commands: &[&str], more: u64) {
    let target = command_calls(redis, commands) + more;
    eventually(&format!("{more} more calls of {commands:?}"), || {
        let done = command_calls(redis, commands) >= target;
        async move { done.then_some(()) }
    })
    .await;
}

/// A redis-server hung with SIGSTOP, as a stalled Redis would be: it keeps
/// its connections but answers nothing. SIGCONT when dropped, so a failing
/// test does not leave it stopped.
pub struct Paused(u32);

impl Paused {
    pub fn new(redis: &RedisServer) -> Paused {
        let pid = redis.pid().expect("redis-server runs");
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// Batches retained over the 4 shard streams of a test config.
pub fn stream_len(redis: &RedisServer) -> usize {
    (0..4)
        .map(|shard| {
            let out = redis.cli(&["XLEN", &stream_key(shard)]);
            out.parse::<usize>()
                .unwrap_or_else(|_| panic!("XLEN answered {out:?}"))
        })
        .sum()
}
