//! Probes of a local server through redis-rs: the readiness check (PING,
//! then `INFO server` names our pid), and the few questions embedded mode
//! asks before it starts a child.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;

use super::PROBE_TIMEOUT;

/// One readiness check: `PING` answers (not `-LOADING`), and `INFO server`
/// names `pid` as the answering process.
pub(super) fn probe(url: &str, pid: u32) -> Result<(), String> {
    let check = || -> redis::RedisResult<redis::InfoDict> {
        let mut con = redis::Client::open(url)?.get_connection_with_timeout(PROBE_TIMEOUT)?;
        con.set_read_timeout(Some(PROBE_TIMEOUT))?;
        con.set_write_timeout(Some(PROBE_TIMEOUT))?;
        redis::cmd("PING").query::<String>(&mut con)?;
        redis::cmd("INFO").arg("server").query(&mut con)
    };
    is_ours(&check().map_err(|e| e.to_string())?, pid)
}

/// [`probe`] for async callers.
pub(super) async fn probe_async(url: &str, pid: u32) -> Result<(), String> {
    let check = async {
        let mut con = connect_async(url).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await?;
        redis::cmd("INFO")
            .arg("server")
            .query_async::<redis::InfoDict>(&mut con)
            .await
    };
    let info = tokio::time::timeout(PROBE_TIMEOUT, check)
        .await
        .map_err(|_| "probe timed out".to_string())?
        .map_err(|e| e.to_string())?;
    is_ours(&info, pid)
}

/// Whether `INFO server` came from process `pid`.
fn is_ours(info: &redis::InfoDict, pid: u32) -> Result<(), String> {
    match info.get::<u32>("process_id") {
        Some(answering) if answering == pid => Ok(()),
        Some(answering) => Err(format!(
            "another redis-server (pid {answering}) answers there; ours is {pid}"
        )),
        None => Err("INFO server has no process_id".into()),
    }
}

/// A connection to a local server at `url`, within the probe timeout.
pub(crate) async fn connect_async(
    url: &str,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    tokio::time::timeout(PROBE_TIMEOUT, client.get_multiplexed_async_connection())
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "redis connect timed out"))?
}

/// Whether some server answers `PING` at `url` within the probe timeout.
pub(crate) async fn answers(url: &str) -> bool {
    let ping = async {
        let mut con = connect_async(url).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await
    };
    matches!(tokio::time::timeout(PROBE_TIMEOUT, ping).await, Ok(Ok(_)))
}

/// The `dir` the server at `url` reports (`CONFIG GET dir`), if it answers
/// within the probe timeout.
pub(crate) async fn config_dir(url: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let get = async {
        let mut con = connect_async(url).await?;
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("dir")
            .query_async::<Vec<Vec<u8>>>(&mut con)
            .await
    };
    let mut reply = tokio::time::timeout(PROBE_TIMEOUT, get).await.ok()?.ok()?;
    (reply.len() == 2).then(|| PathBuf::from(OsString::from_vec(reply.swap_remove(1))))
}
