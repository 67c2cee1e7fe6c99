//! A real local Redis Cluster: [`Cluster`] (`launcher`: its nodes, each
//! started by the service's own launcher, which the bench starts too), one
//! per test ([`start`]) or one shared by every test of a binary
//! ([`shared`]).

mod launcher;

use std::sync::{Mutex, OnceLock, mpsc};

pub use self::launcher::{
    Cluster, ClusterNode, ClusterOptions, ClusterTls, DEFAULT_CLUSTER_TIMEOUT, DEFAULT_NODE_TIMEOUT,
};
use batcher::config::AppendFsync;

/// Starts a cluster of `masters` masters with `replicas` replicas each, with
/// AOF and the given fsync policy if any. Panics with the nodes' logs.
/// Nodes die with the calling thread, so call it from the test's own.
pub fn start(masters: usize, replicas: usize, appendfsync: Option<AppendFsync>) -> Cluster {
    let options = ClusterOptions {
        masters,
        replicas_per_master: replicas,
        appendfsync,
        ..ClusterOptions::default()
    };
    Cluster::start(&options).unwrap_or_else(|e| panic!("starting a Redis Cluster: {e}"))
}

/// What tests of the shared cluster need to know of it.
pub struct Shared {
    /// Every node's URL.
    pub urls: Vec<String>,
    /// The masters' ports (the shared cluster never fails over).
    pub masters: Vec<u16>,
}

/// The shared cluster, owned here so that `drop_shared` can kill it at exit.
static SHARED: Mutex<Option<Cluster>> = Mutex::new(None);

/// Kills the shared cluster and removes its dirs when the process exits.
extern "C" fn drop_shared() {
    if let Ok(mut cluster) = SHARED.lock() {
        cluster.take();
    }
}

/// One cluster of 3 masters and 3 replicas shared by every test of the
/// binary (each test uses its own key prefix). It is started on a thread
/// that lives as long as the process, since nodes die with their spawner.
pub fn shared() -> &'static Shared {
    static INFO: OnceLock<Shared> = OnceLock::new();
    INFO.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let started = Cluster::start(&ClusterOptions::default()).map(|cluster| {
                let info = Shared {
                    urls: cluster.urls(),
                    masters: cluster.masters().iter().filter_map(|m| m.port()).collect(),
                };
                *SHARED.lock().unwrap() = Some(cluster);
                // SAFETY: registers a plain extern "C" fn with no arguments.
                unsafe { libc::atexit(drop_shared) };
                info
            });
            tx.send(started).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv()
            .unwrap()
            .unwrap_or_else(|e| panic!("starting the shared Redis Cluster: {e}"))
    })
}

/// The id (`CLUSTER MYID`) of a node.
pub fn node_id(node: &ClusterNode) -> String {
    node.query(redis::cmd("CLUSTER").arg("MYID")).unwrap()
}
