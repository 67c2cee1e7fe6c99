//! Unit tests of embedded mode and its launcher, each against a real
//! `redis-server`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::time::Instant;

use super::launcher::url_path;
use super::*;

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("info")
        .try_init();
}

fn opts(data_dir: &Path) -> EmbeddedOptions {
    EmbeddedOptions {
        redis_server: PathBuf::from("/usr/bin/redis-server"),
        data_dir: data_dir.to_path_buf(),
        appendfsync: AppendFsync::Everysec,
    }
}

async fn connect(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

async fn ping(url: &str) -> redis::RedisResult<String> {
    let mut con = connect(url).await?;
    redis::cmd("PING").query_async(&mut con).await
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Start answers PING at its URL with AOF under data_dir; stop ends the process and the socket.
#[tokio::test]
async fn start_ping_stop() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data"); // does not exist yet
    let er = EmbeddedRedis::start(opts(&dir)).await.unwrap();
    let canon = fs::canonicalize(&dir).unwrap();
    assert_eq!(
        er.url(),
        format!("redis+unix://{}", canon.join("redis.sock").display())
    );
    assert_eq!(ping(er.url()).await.unwrap(), "PONG");
    assert!(dir.join("appendonlydir").is_dir(), "AOF dir missing");
    assert!(dir.join("redis.log").is_file());
    let pid = er.inner.pid.load(Ordering::SeqCst);
    assert!(pid > 0 && alive(pid));
    er.stop().await;
    assert!(!alive(pid), "redis-server {pid} still running after stop");
    let sock = dir.join("redis.sock");
    assert!(!sock.exists() || UnixStream::connect(&sock).await.is_err());
}

/// A key written before stop is still there after starting again on the same dir.
#[tokio::test]
async fn data_survives_restart() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
    let mut con = connect(er.url()).await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("durable")
        .query_async(&mut con)
        .await
        .unwrap();
    drop(con);
    er.stop().await;

    let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
    let mut con = connect(er.url()).await.unwrap();
    let v: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("durable"));
    drop(con);
    er.stop().await;
}

/// After the child is SIGKILLed the supervisor restarts it and PING works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_restarts_killed_child() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
    let old = er.inner.pid.load(Ordering::SeqCst);
    // SAFETY: plain kill of our own child.
    assert_eq!(unsafe { libc::kill(old, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pid = er.inner.pid.load(Ordering::SeqCst);
        if pid != 0 && pid != old && ping(er.url()).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "not restarted in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive(old));
    let new = er.inner.pid.load(Ordering::SeqCst);
    er.stop().await;
    assert!(!alive(new));
}

/// A missing binary gives NotInstalled with a one-line message naming the apt package.
#[tokio::test]
async fn missing_binary_is_not_installed() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut o = opts(tmp.path());
    o.redis_server = PathBuf::from("/nonexistent/bin/redis-server");
    let err = EmbeddedRedis::start(o).await.unwrap_err();
    assert!(
        matches!(&err, EmbeddedError::NotInstalled { binary } if binary == Path::new("/nonexistent/bin/redis-server")),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(!msg.contains('\n'), "{msg}");
    assert!(msg.contains("apt-get install redis-server"), "{msg}");
    assert!(msg.contains("\"/nonexistent/bin/redis-server\""), "{msg}");
}

/// A second start on a data dir whose server is running fails with AlreadyRunning and leaves the first alone.
#[tokio::test]
async fn second_start_is_already_running() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let first = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
    let err = EmbeddedRedis::start(opts(tmp.path())).await.unwrap_err();
    assert!(
        matches!(err, EmbeddedError::AlreadyRunning { .. }),
        "{err:?}"
    );
    assert_eq!(ping(first.url()).await.unwrap(), "PONG");
    first.stop().await;
}

/// A leftover socket file that nothing answers on is removed and the start succeeds.
#[tokio::test]
async fn stale_socket_is_removed() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("redis.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap()); // leaves the file
    assert!(sock.exists());
    let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
    assert_eq!(ping(er.url()).await.unwrap(), "PONG");
    er.stop().await;
}

/// A data dir whose socket path exceeds 100 bytes falls back to loopback TCP, which works and is guarded too.
#[tokio::test]
async fn long_path_falls_back_to_tcp() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp
        .path()
        .join("a-rather-long-directory-name-to-overflow-sun-path")
        .join("and-another-long-directory-name-for-good-measure");
    assert!(dir.join("redis.sock").as_os_str().len() > 100);
    let er = EmbeddedRedis::start(opts(&dir)).await.unwrap();
    assert!(er.url().starts_with("redis://127.0.0.1:"), "{}", er.url());
    assert_eq!(ping(er.url()).await.unwrap(), "PONG");
    assert!(!dir.join("redis.sock").exists());
    let err = EmbeddedRedis::start(opts(&dir)).await.unwrap_err();
    assert!(
        matches!(err, EmbeddedError::AlreadyRunning { .. }),
        "{err:?}"
    );
    let pid = er.inner.pid.load(Ordering::SeqCst);
    er.stop().await;
    assert!(!alive(pid));
}

/// Dropping the handle without stop still terminates the child.
#[tokio::test]
async fn drop_terminates_child() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let er = EmbeddedRedis::start(opts(tmp.path())).await.unwrap();
    let pid = er.inner.pid.load(Ordering::SeqCst);
    drop(er);
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(pid) {
        assert!(Instant::now() < deadline, "child survived drop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A child that dies before answering gives NotReady carrying the tail of redis.log.
#[tokio::test]
async fn early_exit_is_not_ready_with_log_tail() {
    init_tracing();
    let tmp = tempfile::tempdir().unwrap();
    let mut o = opts(tmp.path());
    // sh rejects redis's arguments on stderr, which goes to redis.log.
    o.redis_server = PathBuf::from("/bin/sh");
    let err = EmbeddedRedis::start(o).await.unwrap_err();
    let EmbeddedError::NotReady { reason, tail, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(reason.contains("exited"), "{reason}");
    assert!(tail.contains("Illegal option"), "{tail}");
    assert!(err.to_string().contains("Illegal option"));
}

/// The URL percent-encodes characters a path may hold but a URL may not.
#[test]
fn url_path_encodes() {
    assert_eq!(url_path(Path::new("/a b/c%d.sock")), "/a%20b/c%25d.sock");
}

/// The launcher's defaults: a free loopback port, its own temp dir, ready on return; drop kills the child and removes the dir.
#[test]
fn launcher_start_then_drop_kills_and_cleans_up() {
    let server = launcher::Launch::new()
        .binary("/usr/bin/redis-server")
        .start()
        .unwrap();
    let port = server.port().expect("a TCP port");
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    let (pid, dir) = (server.pid().unwrap(), server.dir().to_path_buf());
    assert!(server.is_running() && dir.join(launcher::LOG_NAME).is_file());
    drop(server);
    assert!(!alive(i32::try_from(pid).unwrap()), "child survived drop");
    assert!(!dir.exists(), "temp dir left behind");
}

/// A start on a port another server holds fails with AddressInUse, not by mistaking that server for its own.
#[test]
fn launcher_taken_port_is_address_in_use() {
    let first = launcher::Launch::new()
        .binary("/usr/bin/redis-server")
        .start()
        .unwrap();
    let port = first.port().unwrap();
    let err = launcher::Launch::new()
        .binary("/usr/bin/redis-server")
        .listen(launcher::Listen::Port(port))
        .start()
        .unwrap_err();
    assert!(
        matches!(err, launcher::LaunchError::AddressInUse { .. }),
        "{err}"
    );
    assert!(first.is_running());
}

/// start_async passes extra `--flag value` arguments, and terminate_async stops the child in time.
#[tokio::test]
async fn launcher_async_args_and_terminate() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = launcher::Launch::new()
        .binary("/usr/bin/redis-server")
        .dir(tmp.path())
        .config("maxmemory-policy", "allkeys-lru")
        .start_async()
        .await
        .unwrap();
    let mut con = connect(server.url()).await.unwrap();
    let policy: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(policy[1], "allkeys-lru");
    let pid = server.pid().unwrap();
    assert_eq!(server.dir(), tmp.path());
    assert!(server.terminate_async(Duration::from_secs(10)).await);
    assert!(server.pid().is_none() && !alive(i32::try_from(pid).unwrap()));
}
