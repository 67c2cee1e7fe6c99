//! A real local Redis Cluster for tests: the testkit's (one shared per test
//! binary, or one per test), and the service's config over it.

use batcher::config::Config;
use batcher::pb;
use batcher::pb::batcher_client::BatcherClient;
pub use batcher_testkit::cluster::{Cluster, ClusterNode, node_id, shared, start};
use tonic::transport::Channel;

use super::eventually;

/// A config for tests over the cluster at `urls`: `extra` TOML (top-level
/// keys, then tables other than `[redis]`), then `[redis]` with these seed
/// nodes, key prefix `prefix` and the lines of `redis` (8 shards unless
/// they say otherwise).
pub fn config(urls: &[String], prefix: &str, extra: &str, redis: &str) -> Config {
    let nodes: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    let shards = if redis.contains("shards") {
        ""
    } else {
        "shards = 8"
    };
    let text = format!(
        "{extra}\n[redis]\ncluster_nodes = [{}]\nprefix = \"{prefix}\"\n{shards}\n{redis}\n",
        nodes.join(", ")
    );
    Config::parse(&text, "test.toml").unwrap_or_else(|e| panic!("test config: {e}"))
}

/// Waits until the service has no open group left.
pub async fn wait_all_flushed(client: &BatcherClient<Channel>) {
    eventually("every group to flush", || {
        let mut client = client.clone();
        async move {
            let request = pb::ListGroupsRequest::default();
            let page = client.list_groups(request).await.ok()?.into_inner();
            // A page can come back empty while groups remain (its group
            // flushed between the scan and the read): only an empty page
            // with no next page means none is open.
            (page.groups.is_empty() && page.next_page_token.is_empty()).then_some(())
        }
    })
    .await;
}
