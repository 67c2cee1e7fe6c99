//! A local Redis Cluster for the tests and the bench: [`Cluster::start`]
//! launches `masters * (1 + replicas_per_master)` cluster-enabled nodes with
//! [`Launch`] (each on a free loopback port with a free cluster-bus port, in
//! its own dir under one temporary root), joins them with
//! `redis-cli --cluster create ... --cluster-yes`, and returns once every node
//! reports `cluster_state:ok` and every master has its replicas online, so
//! `WAIT` is answered from the first write.
//!
//! With a password, every node requires it of clients and of each other
//! (`requirepass`, `masterauth`), and every URL here carries it. With TLS,
//! every node also listens on a TLS port, and speaks TLS on the cluster bus
//! and to its master; the cluster announces the TLS ports
//! (`tls-cluster yes`), so clients of [`Cluster::tls_urls`] use TLS
//! throughout. The plain port stays open, for the launcher's own probes.
//!
//! Roles are read from the nodes themselves (`INFO replication`), so they
//! follow failovers. A [`ClusterNode`] can be killed and restarted on its old
//! port and dir, where it rejoins (as a replica once it has been failed over).
//! Nodes are killed on drop and the root dir removed. Like every launched
//! child, a node dies with the *thread* that spawned it: start a cluster, and
//! restart its nodes, from a thread that lives as long as they should.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use batcher::config::AppendFsync;
use batcher::embedded::launcher::{
    LOG_TAIL_LINES, Launch, LaunchError, Listen, PORT_ATTEMPTS, RedisServer, free_port, log_tail,
    set_parent_death_signal,
};

/// Default `cluster-node-timeout`: short, so a failover takes seconds.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(2);
/// Default bound on a whole cluster start.
pub const DEFAULT_CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a restart retries a port that the killed node's socket still holds.
const RESTART_PORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two polls of the nodes.
const POLL: Duration = Duration::from_millis(50);

/// What cluster to start; see [`Cluster::start`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// How many masters share the 16384 slots (Redis needs at least 3).
    pub masters: usize,
    /// How many replicas follow each master.
    pub replicas_per_master: usize,
    /// `Some(policy)`: AOF on with this fsync policy; `None`: no persistence.
    pub appendfsync: Option<AppendFsync>,
    /// The `redis-server` binary: a path, or a bare name looked up in `PATH`.
    pub binary: PathBuf,
    /// `cluster-node-timeout`: how long a silent master lasts before failover.
    pub node_timeout: Duration,
    /// Bound on the whole start, and on each [`Cluster::wait_healthy`] of it.
    pub ready_timeout: Duration,
    /// `Some`: every node requires this password (URL-safe).
    pub password: Option<String>,
    /// `Some`: every node also serves TLS with these files.
    pub tls: Option<ClusterTls>,
}

/// The PEM files of a TLS cluster; the server certificate must be valid for
/// 127.0.0.1.
#[derive(Debug, Clone)]
pub struct ClusterTls {
    /// The nodes' certificate (`tls-cert-file`).
    pub cert_file: PathBuf,
    /// Its private key (`tls-key-file`).
    pub key_file: PathBuf,
    /// The CA that signed it (`tls-ca-cert-file`), which the nodes and
    /// `redis-cli` verify each other with.
    pub ca_file: PathBuf,
}

impl Default for ClusterOptions {
    /// 3 masters with 1 replica each, no persistence, `redis-server` from `PATH`.
    fn default() -> Self {
        ClusterOptions {
            masters: 3,
            replicas_per_master: 1,
            appendfsync: None,
            binary: PathBuf::from("redis-server"),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            ready_timeout: DEFAULT_CLUSTER_TIMEOUT,
            password: None,
            tls: None,
        }
    }
}

/// One node of a [`Cluster`]: its running server and how to start it again.
#[derive(Debug)]
pub struct ClusterNode {
    /// Fixed port, cluster-bus port and dir, so a restart rejoins as itself.
    launch: Launch,
    /// The child; killed (and reaped) by [`ClusterNode::kill`].
    server: RedisServer,
    /// Its TLS port, in a TLS cluster.
    tls_port: Option<u16>,
}

impl ClusterNode {
    /// The node's server handle.
    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// `redis://127.0.0.1:PORT`, with `:PASSWORD@` in a cluster that has one.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// `rediss://127.0.0.1:TLS_PORT` (with the password, if any), in a TLS
    /// cluster.
    pub fn tls_url(&self) -> Option<String> {
        let tls_port = self.tls_port?;
        // "redis://[:PASSWORD@]127.0.0.1:" of the plain URL.
        let base = self.url().strip_suffix(&self.port().to_string())?;
        Some(format!("rediss{}{tls_port}", base.strip_prefix("redis")?))
    }

    /// Its client port (the same across restarts).
    pub fn port(&self) -> u16 {
        self.server.port().expect("cluster nodes listen on TCP")
    }

    /// Whether the node's process is alive.
    pub fn is_running(&self) -> bool {
        self.server.is_running()
    }

    /// SIGKILL and reap: a crash.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// Kills the node if it runs, then starts it again on the same ports and
    /// dir; it reloads `nodes.conf` (and its AOF) and rejoins the cluster.
    /// Follow with [`Cluster::wait_healthy`] to wait until it has.
    pub fn restart(&mut self) -> Result<(), LaunchError> {
        self.server.kill();
        let deadline = Instant::now() + RESTART_PORT_TIMEOUT;
        loop {
            match self.launch.start() {
                Ok(server) => {
                    self.server = server;
                    return Ok(());
                }
                Err(LaunchError::AddressInUse { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(POLL);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One command to the node, bounded by short timeouts.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, String> {
        let timeout = Duration::from_secs(2);
        let query = || {
            let mut con = redis::Client::open(self.url())?.get_connection_with_timeout(timeout)?;
            con.set_read_timeout(Some(timeout))?;
            cmd.query(&mut con)
        };
        query().map_err(|e| format!("{}: {e}", self.url()))
    }

    /// Its `INFO replication` text, if it answers.
    fn replication(&self) -> Result<String, String> {
        self.query(redis::cmd("INFO").arg("replication"))
    }
}

/// A running local Redis Cluster; see the module docs.
#[derive(Debug)]
pub struct Cluster {
    /// Every node, masters and replicas, in creation order.
    nodes: Vec<ClusterNode>,
    /// What it was started with (the health checks need the counts).
    options: ClusterOptions,
    /// The nodes' dirs; declared last so it is removed after they are killed.
    root: TempDir,
}

impl Cluster {
    /// Starts the cluster and blocks until it is healthy; see the module docs.
    pub fn start(options: &ClusterOptions) -> Result<Cluster, LaunchError> {
        let root = tempfile::Builder::new()
            .prefix("redis-cluster-")
            .tempdir()
            .map_err(|e| LaunchError::Io("creating a temporary dir".into(), e))?;
        let count = options.masters * (1 + options.replicas_per_master);
        let nodes = (0..count)
            .map(|i| start_node(options, root.path().join(format!("node-{i}"))))
            .collect::<Result<_, _>>()?;
        let cluster = Cluster {
            nodes,
            options: options.clone(),
            root,
        };
        cluster.create()?;
        cluster.wait_healthy(options.replicas_per_master, options.ready_timeout)?;
        Ok(cluster)
    }

    /// Every node's URL, `redis://127.0.0.1:PORT` (with the password, if
    /// any), in creation order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url().to_owned()).collect()
    }

    /// Every node's [`ClusterNode::tls_url`], in creation order; empty unless
    /// the cluster serves TLS.
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes.iter().filter_map(ClusterNode::tls_url).collect()
    }

    /// The running nodes that say they are masters now.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .filter(|n| n.replication().is_ok_and(|r| r.contains("role:master")))
            .map(ClusterNode::server)
            .collect()
    }

    /// Every node, masters and replicas, in creation order.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Every node, to kill or restart one.
    pub fn nodes_mut(&mut self) -> &mut [ClusterNode] {
        &mut self.nodes
    }

    /// Waits, up to `timeout`, until every running node reports
    /// `cluster_state:ok`, exactly `masters` of them are masters, each with at
    /// least `replicas` replicas online, and every replica's link is up.
    /// After a kill, `replicas = 0` waits for the failover; after the restart,
    /// `replicas_per_master` waits for the node to be a replica again.
    pub fn wait_healthy(&self, replicas: usize, timeout: Duration) -> Result<(), LaunchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let reason = match self.health(replicas) {
                Ok(()) => return Ok(()),
                Err(reason) => reason,
            };
            if Instant::now() >= deadline {
                return Err(self.error(format!("not healthy within {timeout:?}: {reason}")));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Why the cluster is not healthy yet, if it is not.
    fn health(&self, replicas: usize) -> Result<(), String> {
        let mut masters = 0;
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let info: String = node.query(redis::cmd("CLUSTER").arg("INFO"))?;
            if !info.contains("cluster_state:ok") {
                return Err(format!("{} is not cluster_state:ok", node.url()));
            }
            let repl = node.replication()?;
            if repl.contains("role:master") {
                masters += 1;
                let online = repl.matches("state=online").count();
                if online < replicas {
                    return Err(format!("{} has {online} replicas online", node.url()));
                }
            } else if !repl.contains("master_link_status:up") {
                return Err(format!("{}'s link to its master is down", node.url()));
            }
        }
        match masters == self.options.masters {
            true => Ok(()),
            false => Err(format!("{masters} nodes are masters")),
        }
    }

    /// Runs `redis-cli --cluster create` over every node, killed by
    /// `timeout(1)` if it takes longer than the ready timeout.
    fn create(&self) -> Result<(), LaunchError> {
        let mut cmd = Command::new("timeout");
        cmd.arg(self.options.ready_timeout.as_secs().max(1).to_string());
        cmd.arg("redis-cli");
        if let Some(password) = &self.options.password {
            cmd.args(["--no-auth-warning", "-a", password]);
        }
        if let Some(tls) = &self.options.tls {
            cmd.args(["--tls", "--cacert"]).arg(&tls.ca_file);
        }
        cmd.args(["--cluster", "create"]);
        cmd.args(self.nodes.iter().map(|n| {
            // With TLS, redis-cli reaches every node (the ones it learns of
            // too) through the ports the cluster announces: the TLS ones.
            format!("127.0.0.1:{}", n.tls_port.unwrap_or_else(|| n.port()))
        }));
        let replicas = self.options.replicas_per_master.to_string();
        cmd.args(["--cluster-replicas", &replicas, "--cluster-yes"]);
        set_parent_death_signal(cmd.stdin(Stdio::null()), libc::SIGKILL);
        let out = cmd
            .output()
            .map_err(|e| LaunchError::Io("running timeout redis-cli".into(), e))?;
        if out.status.success() {
            return Ok(());
        }
        let (stdout, stderr) = (out.stdout.as_slice(), out.stderr.as_slice());
        Err(self.error(format!(
            "redis-cli --cluster create failed ({}; 124 means timed out, 127 not installed):\n{}{}",
            out.status,
            String::from_utf8_lossy(stdout),
            String::from_utf8_lossy(stderr)
        )))
    }

    /// A `NotReady` error for the whole cluster, with each node's log tail.
    fn error(&self, reason: String) -> LaunchError {
        let tail = self
            .nodes
            .iter()
            .map(|n| {
                let log = log_tail(n.server.log_path(), LOG_TAIL_LINES);
                format!("=== {} ===\n{log}", n.url())
            })
            .collect::<Vec<_>>()
            .join("\n");
        LaunchError::NotReady {
            reason,
            log: self.root.path().to_path_buf(),
            tail,
        }
    }
}

/// Starts one cluster-enabled node in `dir`, on a free port and a free bus
/// port, retrying with other ports while they turn out to be taken.
fn start_node(options: &ClusterOptions, dir: PathBuf) -> Result<ClusterNode, LaunchError> {
    let port_err = |e| LaunchError::Io("picking a free port".into(), e);
    let mut tries = PORT_ATTEMPTS;
    loop {
        let port = free_port().map_err(port_err)?;
        let bus = free_port().map_err(port_err)?;
        let tls_port = match options.tls {
            Some(_) => Some(free_port().map_err(port_err)?),
            None => None,
        };
        if bus == port || tls_port.is_some_and(|t| t == port || t == bus) {
            continue;
        }
        let mut launch = Launch::new()
            .binary(&options.binary)
            .dir(&dir)
            .listen(Listen::Port(port))
            .ready_timeout(options.ready_timeout)
            .config("cluster-enabled", "yes")
            .config("cluster-config-file", "nodes.conf")
            .config("cluster-port", bus.to_string())
            .config(
                "cluster-node-timeout",
                options.node_timeout.as_millis().to_string(),
            );
        launch = match options.appendfsync {
            Some(policy) => launch
                .config("appendonly", "yes")
                .config("appendfsync", policy.as_str()),
            None => launch.config("appendonly", "no"),
        };
        launch = secure(launch, options, tls_port);
        tries -= 1;
        match launch.start() {
            Ok(server) => {
                return Ok(ClusterNode {
                    launch,
                    server,
                    tls_port,
                });
            }
            Err(LaunchError::AddressInUse { .. }) if tries > 0 => {
                // A node that lost its bus port may have written its identity.
                let _ = fs::remove_file(dir.join("nodes.conf"));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Adds the password and the TLS settings of `options` to a node's launch.
fn secure(mut launch: Launch, options: &ClusterOptions, tls_port: Option<u16>) -> Launch {
    if let Some(password) = &options.password {
        launch = launch.password(password).config("masterauth", password);
    }
    if let (Some(tls), Some(port)) = (&options.tls, tls_port) {
        launch = launch
            .tls(port, &tls.cert_file, &tls.key_file, &tls.ca_file)
            .config("tls-cluster", "yes")
            .config("tls-replication", "yes");
    }
    launch
}
