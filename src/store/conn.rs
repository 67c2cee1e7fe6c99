//! Connections: to one Redis, or to a Redis Cluster, behind one type.
//!
//! [`Conn`] is what every store call runs on. On a single Redis it is a
//! self-reconnecting multiplexed connection; on a cluster it is redis-rs's
//! cluster client, which routes each command to the master of its key's
//! slot and follows MOVED and ASK. Both implement redis-rs's
//! `ConnectionLike`, so a command or a script runs on either. The store
//! sends commands one by one (the multiplexed connection pipelines
//! concurrent ones by itself), so redis-rs routes and redirects each.
//!
//! Credentials come in the URLs, or the password from `[redis]
//! password_file` for the URLs that carry none; a `rediss://` URL connects over TLS
//! (rustls), verifying the server against the configured root CA, or else
//! the public web PKI roots.
//!
//! [`invoke`] runs a function of the library or a script and, when writes must reach replicas, `WAIT`
//! right behind it in the store's one explicit pipeline: same node, same
//! connection, so the `WAIT` covers the script's writes.

use std::io;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{
    Cmd, ConnectionInfo, ErrorKind, FromRedisValue, IntoConnectionInfo, Pipeline, RedisError,
    RedisFuture, ServerErrorKind, TlsCertificates, Value,
};

use super::Result;
use crate::keys::debug_assert_one_slot;
use crate::scripts::{Function, LIBRARY};

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// One Redis (it may have replicas): its URL.
    Single(String),
    /// A Redis Cluster: the URLs of some of its nodes, to discover the rest.
    Cluster(Vec<String>),
}

/// How a write waits for replicas before it is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitReplicas {
    /// How many replicas must confirm each write script.
    pub replicas: u32,
    /// How long `WAIT` may block for them.
    pub timeout: Duration,
}

/// Timeouts of the command connection.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

/// How to reach Redis and how writes are acknowledged.
#[derive(Clone, Debug)]
pub struct RedisTarget {
    pub endpoint: Endpoint,
    pub timeouts: Timeouts,
    /// `None`: a write is acknowledged once its script ran on the master.
    pub wait: Option<WaitReplicas>,
    /// PEM root certificate(s) that `rediss://` connections verify the
    /// server's certificate against; `None`: the public web PKI roots.
    pub tls_ca: Option<Vec<u8>>,
    /// The password for every URL that carries none of its own (from
    /// `[redis] password_file`); `None`: the URLs say it all.
    pub password: Option<Password>,
}

/// A Redis password; its `Debug` form does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    pub fn new(password: impl Into<String>) -> Password {
        Password(password.into())
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(<hidden>)")
    }
}

impl RedisTarget {
    /// The root CA for TLS connections, if one is given.
    fn certificates(&self) -> Option<TlsCertificates> {
        self.tls_ca.as_ref().map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        })
    }

    /// A single Redis at `url`, with `timeouts`, not waiting for replicas.
    pub fn single(url: &str, timeouts: Timeouts) -> RedisTarget {
        RedisTarget {
            endpoint: Endpoint::Single(url.to_owned()),
            timeouts,
            wait: None,
            tls_ca: None,
            password: None,
        }
    }

    /// `url` as redis-rs connection info, with [`RedisTarget::password`]
    /// when the URL carries no password of its own.
    fn connection_info(&self, url: &str) -> Result<ConnectionInfo> {
        let info = url.into_connection_info()?;
        Ok(match &self.password {
            Some(Password(password)) if info.redis_settings().password().is_none() => {
                let redis = info.redis_settings().clone().set_password(password);
                info.set_redis_settings(redis)
            }
            _ => info,
        })
    }
}

/// A connection to Redis, or to a Redis Cluster.
#[derive(Clone)]
pub enum Conn {
    /// Shared by every request to one Redis; reconnects by itself.
    Managed(ConnectionManager),
    /// A connection of its own to one Redis, for blocking reads.
    Dedicated(MultiplexedConnection),
    /// A cluster connection (shared, or of its own for blocking reads).
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Managed(c) => c.req_packed_command(cmd),
            Conn::Dedicated(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Managed(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Dedicated(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Managed(c) => c.get_db(),
            Conn::Dedicated(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// What opens connections: a client for one Redis, or for a cluster.
#[derive(Clone)]
pub enum Connector {
    Single(Box<redis::Client>),
    Cluster(Box<ClusterClient>),
}

/// How many times the cluster client retries a command (on MOVED, ASK,
/// TRYAGAIN or a lost node) before the error reaches the caller; the
/// response timeout bounds the whole.
const CLUSTER_RETRIES: u32 = 6;

/// A blocking read's connection waits this long for a reply at most: longer
/// than any block the subscribers ask for.
const BLOCKING_RESPONSE_TIMEOUT: Duration = Duration::from_secs(300);

impl Connector {
    /// A connector for `target`. Connects to nothing yet.
    pub fn new(target: &RedisTarget) -> Result<Connector> {
        // No Nagle: every command is a small write that must not wait for
        // Redis's delayed ACK (redis-rs leaves TCP_NODELAY off by default).
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        Ok(match &target.endpoint {
            Endpoint::Single(url) => {
                let info = target.connection_info(url)?.set_tcp_settings(tcp);
                Connector::Single(Box::new(match target.certificates() {
                    Some(certs) => redis::Client::build_with_tls(info, certs)?,
                    None => redis::Client::open(info)?,
                }))
            }
            Endpoint::Cluster(nodes) => {
                // The first node's user, password and TLS mode hold for
                // every node (the config checks that all the seeds agree).
                let nodes = nodes.iter().map(|url| target.connection_info(url));
                let mut builder = ClusterClientBuilder::new(nodes.collect::<Result<Vec<_>>>()?)
                    .tcp_settings(tcp)
                    .connection_timeout(target.timeouts.connect)
                    .response_timeout(target.timeouts.response)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(10)
                    .max_retry_wait(200);
                if let Some(certs) = target.certificates() {
                    builder = builder.certs(certs);
                }
                Connector::Cluster(Box::new(builder.build()?))
            }
        })
    }

    /// The shared command connection. Connects lazily, so the service starts
    /// (and answers UNAVAILABLE) while Redis is down.
    pub fn shared(&self, timeouts: Timeouts) -> Result<Conn> {
        Ok(match self {
            Connector::Single(client) => {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeouts.connect))
                    .set_response_timeout(Some(timeouts.response))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                Conn::Managed(ConnectionManager::new_lazy_with_config(
                    client.as_ref().clone(),
                    config,
                )?)
            }
            Connector::Cluster(client) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(timeouts.connect)
                    .set_response_timeout(timeouts.response);
                Conn::Cluster(client.get_pending_async_connection_with_config(config))
            }
        })
    }

    /// A connection of the caller's own, for blocking reads, with no short
    /// response timeout (a blocking read is meant to wait). On a cluster it
    /// follows its slot when the slot moves to another node.
    pub async fn dedicated(&self, connect: Duration) -> Result<Conn> {
        Ok(match self {
            Connector::Single(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect))
                    .set_response_timeout(None);
                Conn::Dedicated(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                )
            }
            Connector::Cluster(client) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(connect)
                    .set_response_timeout(BLOCKING_RESPONSE_TIMEOUT);
                Conn::Cluster(client.get_async_connection_with_config(config).await?)
            }
        })
    }
}

/// What a store call runs in Redis: a function of the library, or one of
/// the scripts that touch no group.
#[derive(Clone, Copy)]
pub(super) enum Code<'a> {
    Function(Function),
    Script(&'a redis::Script),
}

impl Code<'_> {
    /// The command that runs it: `FCALL` or `EVALSHA`, with its keys and arguments.
    fn command(&self, keys: &[&str], args: &[Vec<u8>]) -> Cmd {
        let mut cmd = self.start(keys.len(), args.len(), 0);
        cmd.arg(keys).arg(args);
        cmd
    }

    /// The start of the command that runs it with `keys` keys: `FCALL` or
    /// `EVALSHA`, its name, and the key count, with room for `keys + args`
    /// arguments of about `bytes` bytes in all, which the caller writes.
    pub(super) fn start(&self, keys: usize, args: usize, bytes: usize) -> Cmd {
        let (command, code) = match self {
            Code::Function(function) => ("FCALL", function.name()),
            Code::Script(script) => ("EVALSHA", script.get_hash()),
        };
        let mut cmd = Cmd::with_capacity(3 + keys + args, 64 + bytes);
        cmd.arg(command).arg(code).arg(keys);
        cmd
    }

    /// Whether `err` says the node does not have it: Redis restarted
    /// without persistence, or a node joined or failed over without it.
    fn is_missing(&self, err: &RedisError) -> bool {
        match self {
            Code::Function(_) => err.to_string().contains("Function not found"),
            Code::Script(_) => err.kind() == ErrorKind::Server(ServerErrorKind::NoScript),
        }
    }

    /// Loads it: on a cluster, `FUNCTION LOAD` and `SCRIPT LOAD` go to every master.
    async fn load(&self, conn: &mut Conn) -> redis::RedisResult<()> {
        match self {
            Code::Function(_) => {
                redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&LIBRARY.code)
                    .query_async::<()>(conn)
                    .await
            }
            Code::Script(script) => script.prepare_invoke().load_async(conn).await.map(drop),
        }
    }
}

/// Runs a function or script with all of its keys in KEYS (checked, in
/// debug builds, to share one cluster slot), loading it first when the
/// node lacks it, and decodes its reply. With `wait`, see [`invoke_and_wait`].
pub(super) async fn invoke<T: FromRedisValue>(
    conn: &Conn,
    wait: Option<WaitReplicas>,
    code: Code<'_>,
    keys: &[&str],
    args: Vec<Vec<u8>>,
) -> Result<T> {
    debug_assert_one_slot(keys);
    let cmd = code.command(keys, &args);
    run_command(
        conn,
        wait,
        code,
        &cmd,
        keys.first().copied().unwrap_or_default(),
    )
    .await
}

/// [`invoke`] for a command already written by [`Code::start`] and its
/// caller, whose first key is `first_key`; its keys may span slots only on
/// one Redis, never a cluster (the add function's sections of several shards).
pub(super) async fn run_command<T: FromRedisValue>(
    conn: &Conn,
    wait: Option<WaitReplicas>,
    code: Code<'_>,
    cmd: &Cmd,
    first_key: &str,
) -> Result<T> {
    let mut conn = conn.clone();
    if let Some(wait) = wait {
        return invoke_and_wait(&mut conn, wait, code, cmd, first_key).await;
    }
    match cmd.query_async(&mut conn).await {
        Err(err) if code.is_missing(&err) => {
            code.load(&mut conn).await?;
            Ok(cmd.query_async(&mut conn).await?)
        }
        done => Ok(done?),
    }
}

/// How often a script and its `WAIT` are sent again after a redirect, a
/// slot in migration or a lost script cache, before the error stands.
const PIPELINE_ATTEMPTS: u32 = 5;

/// Runs a function or script and `WAIT` right behind it, in one pipeline:
/// same node, same connection, so the `WAIT` counts the replicas that have
/// its writes. Fails as unavailable unless enough of them confirmed.
///
/// redis-rs follows MOVED and ASK for single commands but returns them for
/// a pipeline, so this follows them itself: MOVED refreshes the slot map (a
/// plain read of the first key follows it) and sends again; ASK sends
/// `ASKING` and the pipeline to the node that imports the slot.
async fn invoke_and_wait<T: FromRedisValue>(
    conn: &mut Conn,
    wait: WaitReplicas,
    code: Code<'_>,
    cmd: &Cmd,
    first_key: &str,
) -> Result<T> {
    let mut pipe = redis::pipe();
    pipe.add_command(cmd.clone())
        .cmd("WAIT")
        .arg(wait.replicas)
        .arg(wait.timeout.as_millis() as u64);
    let mut asking: Option<String> = None;
    let mut attempt = 0;
    let (reply, confirmed): (T, u32) = loop {
        let sent = match &asking {
            None => pipe.query_async(conn).await,
            Some(node) => conn.query_asking(&pipe, node).await,
        };
        let err = match sent {
            Ok(done) => break done,
            Err(err) if attempt + 1 < PIPELINE_ATTEMPTS => err,
            Err(err) => return Err(err.into()),
        };
        attempt += 1;
        asking = None;
        if code.is_missing(&err) {
            code.load(conn).await?;
            continue;
        }
        match err.kind() {
            ErrorKind::Server(ServerErrorKind::Ask) => {
                asking = err.redirect_node().map(|(node, _)| node.to_owned());
            }
            ErrorKind::Server(ServerErrorKind::Moved) => {
                redis::cmd("EXISTS")
                    .arg(first_key)
                    .query_async::<()>(conn)
                    .await?;
            }
            ErrorKind::Server(
                ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly,
            ) => {
                tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
            }
            _ => return Err(err.into()),
        }
    };
    if confirmed < wait.replicas {
        return Err(RedisError::from(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "{confirmed} of {} replicas confirmed the write within {:?}",
                wait.replicas, wait.timeout
            ),
        ))
        .into());
    }
    Ok(reply)
}

impl Conn {
    /// Runs `pipe` after `ASKING` on the cluster node `node` ("host:port"),
    /// which is importing the slot of the pipeline's keys.
    async fn query_asking<T: FromRedisValue>(
        &mut self,
        pipe: &Pipeline,
        node: &str,
    ) -> redis::RedisResult<T> {
        let Conn::Cluster(cluster) = self else {
            return Err(RedisError::from((
                ErrorKind::Client,
                "ASK redirect outside a cluster",
            )));
        };
        let (host, port) = node
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
            .ok_or_else(|| RedisError::from((ErrorKind::Parse, "ASK redirect address")))?;
        let mut asking = redis::pipe();
        asking.cmd("ASKING").ignore();
        for cmd in pipe.cmd_iter() {
            asking.add_command(cmd.clone());
        }
        let mut node = NodeConn {
            cluster,
            route: SingleNodeRoutingInfo::ByAddress { host, port },
        };
        asking.query_async(&mut node).await
    }
}

/// One node of a cluster, as a connection: what a pipeline needs to be
/// sent to that node and decoded like any other.
struct NodeConn<'a> {
    cluster: &'a mut ClusterConnection,
    route: SingleNodeRoutingInfo,
}

impl ConnectionLike for NodeConn<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.cluster.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let route = self.route.clone();
        Box::pin(
            self.cluster
                .route_pipeline(pipeline.clone(), offset, count, route),
        )
    }

    fn get_db(&self) -> i64 {
        0
    }
}
