//! The Redis that `batcher-bench instructions` counts: a `redis-server`
//! under callgrind, counting only inside [`TOGGLE`], whose dumps give the
//! instructions between two points; a connection to it; and which Redis
//! build it is.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use batcher::embedded::launcher::{self, Launch, LaunchError};
use redis::aio::MultiplexedConnection;

/// The function callgrind counts inside (see the docs of [`super`]).
pub(super) const TOGGLE: &str = "processInputBuffer";

/// Fails early, with the fix, when valgrind or callgrind_control is missing.
pub(super) fn check_tools() -> Result<(), String> {
    for tool in ["valgrind", "callgrind_control"] {
        let found = std::process::Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if found.is_err() {
            return Err(format!(
                "{tool} not found: install valgrind (scripts/ensure-valgrind; Debian: \
                 sudo apt-get install valgrind)"
            ));
        }
    }
    Ok(())
}

/// A `redis-server` under callgrind, counting only inside [`TOGGLE`];
/// killed on drop.
pub(super) struct Profiled {
    /// Declared first, so it is killed before its dir is removed.
    server: launcher::RedisServer,
    /// callgrind's output file; the n-th dump is `<out>.<n>`.
    out: PathBuf,
    /// valgrind's `--vgdb-prefix`, which callgrind_control must be given too.
    vgdb_prefix: PathBuf,
    dumps: u32,
    _dir: tempfile::TempDir,
}

impl Profiled {
    pub(super) async fn start() -> Result<Profiled, String> {
        let dir = tempfile::Builder::new()
            .prefix("batcher-instructions-")
            .tempdir()
            .map_err(|e| format!("creating a temporary dir: {e}"))?;
        // The launcher runs `<binary> --port … --dir … <config>`: a wrapper
        // puts valgrind in front, and execs, so the pid the launcher checks
        // (INFO's process_id) and signals is valgrind's, which is Redis's.
        // `BATCHER_CALLGRIND_ARGS`, when set, goes to callgrind as it is
        // (see the module docs of `super`).
        let wrapper = dir.path().join("redis-server-under-callgrind");
        let script = format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind $BATCHER_CALLGRIND_ARGS \
             --collect-atstart=no --toggle-collect={TOGGLE} \
             --vgdb-prefix=\"$BATCHER_VGDB_PREFIX\" \
             --callgrind-out-file=\"$BATCHER_CALLGRIND_OUT\" redis-server \"$@\"\n"
        );
        std::fs::write(&wrapper, script).map_err(|e| format!("writing the wrapper: {e}"))?;
        set_executable(&wrapper)?;
        let out = dir.path().join("callgrind.out");
        // vgdb's FIFOs, through which callgrind_control talks to it, go in
        // the temporary dir too: a killed valgrind leaves them behind.
        let vgdb_prefix = dir.path().join("vgdb-pipe");
        let launch = Launch::new()
            .binary(&wrapper)
            .dir(dir.path().join("redis"))
            .env("BATCHER_CALLGRIND_OUT", &out)
            .env("BATCHER_VGDB_PREFIX", &vgdb_prefix)
            .config("appendonly", "no")
            // Timing out of the count: see the docs of `super` (mod.rs).
            .config("activerehashing", "no")
            .config("slowlog-log-slower-than", "-1")
            .config("latency-tracking", "no")
            .ready_timeout(Duration::from_secs(120));
        let server = match launch.start_async().await {
            Ok(server) => server,
            Err(LaunchError::NotInstalled { .. }) => {
                return Err("cannot run the callgrind wrapper".into());
            }
            Err(e) => {
                return Err(format!(
                    "redis-server under callgrind did not start (scripts/ensure-redis \
                     installs redis-server, scripts/ensure-valgrind valgrind): {e}"
                ));
            }
        };
        Ok(Profiled {
            server,
            out,
            vgdb_prefix,
            dumps: 0,
            _dir: dir,
        })
    }

    pub(super) fn url(&self) -> &str {
        self.server.url()
    }

    /// Dumps callgrind's counts, which zeroes them, and returns the
    /// instructions counted since the previous dump (or the start).
    pub(super) async fn dump(&mut self) -> Result<u64, String> {
        let pid = self.server.pid().ok_or("redis-server has exited")?;
        self.dumps += 1;
        dump_counts(pid, &self.vgdb_prefix, &self.out, self.dumps).await
    }
}

/// Has callgrind in the valgrind process `pid` (started with
/// `--vgdb-prefix=<vgdb_prefix>` and `--callgrind-out-file=<out>`) dump
/// its counts, which zeroes them, as its `n`-th dump, and returns the
/// instructions it counted since the dump before (or its start).
async fn dump_counts(pid: u32, vgdb_prefix: &Path, out: &Path, n: u32) -> Result<u64, String> {
    let output = tokio::process::Command::new("callgrind_control")
        .arg(format!("--vgdb-prefix={}", vgdb_prefix.display()))
        .arg("-d")
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("callgrind_control: {e}"))?;
    let path = PathBuf::from(format!("{}.{n}", out.display()));
    // callgrind_control returns once the dump is written; allow a moment
    // all the same before calling it missing.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(&path)
            && let Some(total) = totals(&text)
        {
            // Kept for a closer look when asked (see the module docs).
            if let Ok(keep) = std::env::var("BATCHER_CALLGRIND_KEEP") {
                let copy = PathBuf::from(keep).join(format!("{pid}.{n}"));
                std::fs::copy(&path, &copy)
                    .map_err(|e| format!("keeping the dump as {}: {e}", copy.display()))?;
            }
            return Ok(total);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "callgrind wrote no dump at {} (callgrind_control said: {} {})",
                path.display(),
                String::from_utf8_lossy(&output.stdout).trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

/// The instruction count of a callgrind dump: its `totals:` line (its
/// `summary:` line in older formats). Only `Ir` is collected, so it is the
/// line's first number.
fn totals(dump: &str) -> Option<u64> {
    let line = dump
        .lines()
        .find(|l| l.starts_with("totals:"))
        .or_else(|| dump.lines().find(|l| l.starts_with("summary:")))?;
    line.split_once(':')?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The Redis a figure was counted on.
pub(super) struct RedisBuild {
    pub(super) version: String,
    pub(super) build_id: String,
}

impl RedisBuild {
    pub(super) async fn of(url: &str) -> Result<RedisBuild, String> {
        let mut conn = connection(url).await?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("INFO server: {e}"))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map_or_else(|| "?".to_string(), |v| v.trim().to_string())
        };
        Ok(RedisBuild {
            version: field("redis_version"),
            build_id: field("redis_build_id"),
        })
    }
}

/// A plain connection with no response timeout (callgrind slows Redis
/// some fifty times).
pub(super) async fn connection(url: &str) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("redis: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_callgrind_totals() {
        let dump =
            "version: 1\ncmd: redis-server\nevents: Ir\nsummary: 123\nfn=x\n1 2\ntotals: 12345\n";
        assert_eq!(totals(dump), Some(12345));
        assert_eq!(totals("summary: 77\n"), Some(77));
        assert_eq!(totals("events: Ir\n"), None);
    }
}
