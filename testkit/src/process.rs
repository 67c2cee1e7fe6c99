//! Child processes of the tests and the bench: [`ChildGuard`] (killed and
//! reaped on drop), [`die_with_parent`], and [`Spawn`], the one launcher of
//! a service as a child process: `batcher serve` for the tests
//! ([`Spawn::serve`]), the bench binary's own serving subcommands for the
//! bench. The child writes its output to a log file and binds port 0
//! itself, so no other bind can take its port; [`Spawn::run`] returns once
//! the log names the address it got.
//!
//! Every child gets `PR_SET_PDEATHSIG = SIGKILL`, so none outlives the
//! process that started it, even one killed with SIGKILL. Linux sends that
//! signal when the *thread* that spawned the child exits: spawn from a
//! thread that lives as long as the child should (a test's own thread, the
//! bench's main thread), never from a blocking-pool thread.

use std::ffi::OsStr;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use batcher::embedded::launcher;

use crate::grpc;
use crate::wait::{DEADLINE, Wait};

/// The pause between two reads of a log that should soon name an address
/// (short, as the bench times a service's start from its spawn).
const LOG_POLL: Duration = Duration::from_millis(5);
/// The pause between two looks at a child that should soon exit.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// The message `batcher serve` logs, with `addr=`, once its gRPC port is bound.
const SERVING: &str = "serving";
/// The message `batcher serve` logs, with `addr=`, once its HTTP port is bound.
const SERVING_HTTP: &str = "serving http (GET /metrics, the web view at /)";

/// Makes `cmd`'s child receive SIGKILL when the spawning thread exits, and
/// fail to start if its parent is already gone by then.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    launcher::set_parent_death_signal(cmd, libc::SIGKILL)
}

/// A child process that is killed and reaped when the guard is dropped.
#[derive(Debug)]
pub struct ChildGuard {
    /// The child; std remembers once it is reaped, so a later kill never
    /// signals a pid that another process may have been given since.
    child: Child,
}

impl ChildGuard {
    /// Guards `child`.
    pub fn new(child: Child) -> ChildGuard {
        ChildGuard { child }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's exit status if it has exited (it is reaped then).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait on a child")
    }

    /// SIGKILLs and reaps the child; does nothing once it is reaped.
    pub fn kill(&mut self) {
        // Errors only mean it has already exited, which is what we want.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Which line of a child's log names the address it listens on; the
/// address is the first IPv4 `IP:PORT` on that line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddrLine {
    /// A tracing event with exactly this message, in the text form
    /// (`LEVEL target: message addr=...`) or the JSON form.
    Event(String),
    /// A line that starts with this text, e.g. `LISTENING `.
    Prefix(String),
}

impl AddrLine {
    /// Whether `line` (without colours) is the line.
    fn matches(&self, line: &str) -> bool {
        match self {
            AddrLine::Event(message) => {
                line.contains(&format!(": {message} addr="))
                    || line.contains(&format!("\"message\":\"{message}\""))
            }
            AddrLine::Prefix(prefix) => line.starts_with(prefix.as_str()),
        }
    }
}

/// How to start a service as a child process; see the module docs.
#[derive(Debug)]
pub struct Spawn {
    /// The program, its arguments and environment.
    command: Command,
    /// What the messages call the child.
    name: String,
    /// Where its stdout (and stderr, unless inherited) go.
    log: PathBuf,
    /// Whether stderr goes to the log too (else to ours).
    stderr_to_log: bool,
    /// The line that names its address.
    addr_line: AddrLine,
    /// How long the address may take to appear.
    timeout: Duration,
}

impl Spawn {
    /// `program`, writing its stdout and stderr to `log` (created anew),
    /// which names its address on the line `addr_line` finds.
    pub fn new(program: impl AsRef<OsStr>, log: impl Into<PathBuf>, addr_line: AddrLine) -> Spawn {
        let program = program.as_ref();
        let name = Path::new(program).file_name().unwrap_or(program);
        Spawn {
            command: Command::new(program),
            name: name.to_string_lossy().into_owned(),
            log: log.into(),
            stderr_to_log: true,
            addr_line,
            timeout: DEADLINE,
        }
    }

    /// `batcher serve --config CONFIG` of the binary at `batcher`, with its
    /// gRPC and HTTP listeners on port 0 and `RUST_LOG=info`, logging into
    /// a new file in `log_dir`.
    pub fn serve(batcher: impl AsRef<OsStr>, config: &Path, log_dir: &Path) -> Spawn {
        static SPAWNED: AtomicUsize = AtomicUsize::new(0);
        let n = SPAWNED.fetch_add(1, Ordering::Relaxed);
        let log = log_dir.join(format!("batcher-{}-{n}.log", std::process::id()));
        Spawn::new(batcher, log, AddrLine::Event(SERVING.into()))
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Spawn {
        self.command.arg(arg);
        self
    }

    /// Adds arguments.
    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Spawn {
        self.command.args(args);
        self
    }

    /// Sets an environment variable of the child.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Spawn {
        self.command.env(key, value);
        self
    }

    /// Keeps every variable of this process's environment whose name starts
    /// with `prefix` from the child (set them again with [`Spawn::env`]).
    pub fn env_remove_prefix(mut self, prefix: &str) -> Spawn {
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with(prefix) {
                self.command.env_remove(name);
            }
        }
        self
    }

    /// Leaves the child's stderr on this process's stderr, out of the log.
    pub fn stderr_inherit(mut self) -> Spawn {
        self.stderr_to_log = false;
        self
    }

    /// How long the child may take to name its address ([`DEADLINE`] by default).
    pub fn timeout(mut self, timeout: Duration) -> Spawn {
        self.timeout = timeout;
        self
    }

    /// Spawns the child and waits until its log names its address; an
    /// error (with the log) if it exits first or takes too long, and the
    /// child is killed then.
    pub async fn run(mut self) -> Result<Process, String> {
        let log_err = |e| format!("log file {}: {e}", self.log.display());
        let out = File::create(&self.log).map_err(log_err)?;
        let err = match self.stderr_to_log {
            true => Stdio::from(out.try_clone().map_err(log_err)?),
            false => Stdio::inherit(),
        };
        self.command.stdin(Stdio::null()).stdout(out).stderr(err);
        die_with_parent(&mut self.command);
        let spawned = self.command.spawn();
        let child = spawned.map_err(|e| format!("spawn {}: {e}", self.name))?;
        let mut process = Process {
            child: ChildGuard::new(child),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log: self.log,
            name: self.name,
        };
        let what = "the address it listens on";
        process.addr = process
            .wait_addr(&self.addr_line, what, self.timeout)
            .await?;
        Ok(process)
    }

    /// [`Spawn::run`], panicking with the log if the child does not come
    /// up: it has bound its port, but may not serve yet (a TLS port needs a
    /// client of its own to tell when it is up).
    pub async fn bound(self) -> Process {
        self.run().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Spawn::bound`], then waits until the child accepts gRPC connections.
    pub async fn start(self) -> Process {
        let process = self.bound().await;
        grpc::client(process.addr).await;
        process
    }
}

/// A service running as a child process, killed on drop.
#[derive(Debug)]
pub struct Process {
    /// The child.
    child: ChildGuard,
    /// Where it serves gRPC.
    pub addr: SocketAddr,
    /// Its log file.
    pub log: PathBuf,
    /// What messages call it.
    name: String,
}

impl Process {
    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The address on the first complete line of the log that `line`
    /// finds, once the child has logged it (`what` names it in errors).
    /// An error with the log if the child exits first, or after `timeout`.
    pub async fn wait_addr(
        &mut self,
        line: &AddrLine,
        what: &str,
        timeout: Duration,
    ) -> Result<SocketAddr, String> {
        let wait = Wait::new(format!("{} to log {what}", self.name), timeout).every(LOG_POLL);
        let found = wait
            .until(|| {
                let found = self.logged_addr(line, what);
                async move { found }
            })
            .await;
        match found {
            Ok(found) => found,
            Err(e) => Err(format!("{e}; its log:\n{}", self.read_log())),
        }
    }

    /// Where `batcher serve` serves HTTP (`GET /metrics`): the address its
    /// log gives once the listener is bound. A child process has a metrics
    /// recorder of its own, so its counters move only with its own calls.
    pub async fn http_addr(&mut self) -> SocketAddr {
        let line = AddrLine::Event(SERVING_HTTP.into());
        let found = self.wait_addr(&line, "its HTTP port", DEADLINE).await;
        found.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Sends a signal to the child.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        let rc = unsafe { libc::kill(self.pid() as i32, signal) };
        assert_eq!(rc, 0, "kill({signal}) failed");
    }

    /// Waits, until [`DEADLINE`], for the child to exit; its exit status.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let wait = Wait::new(format!("{} to exit", self.name), DEADLINE).every(EXIT_POLL);
        let exited = wait
            .until(|| {
                let status = self.child.try_wait();
                async move { status }
            })
            .await;
        exited.unwrap_or_else(|e| panic!("{e}; its log:\n{}", self.read_log()))
    }

    /// Stops the child with SIGTERM and checks that it exits cleanly, in time.
    pub async fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit().await;
        assert!(
            status.success(),
            "exit {status:?}; its log:\n{}",
            self.log()
        );
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// The child's log so far. Panics when the log cannot be read, so a
    /// check that a line is absent cannot pass on a failed read.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.log.display()))
    }

    /// The log so far for a message, or why it cannot be read.
    fn read_log(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()))
    }

    /// One look at the log: Some(Ok) once it names the address, Some(Err)
    /// if the child has exited without naming it, None while it may still.
    fn logged_addr(&mut self, line: &AddrLine, what: &str) -> Option<Result<SocketAddr, String>> {
        let log = self.read_log();
        // Only whole lines: a line being written may hold part of a port.
        let complete = &log[..log.rfind('\n').map_or(0, |end| end + 1)];
        let mut lines = complete.lines().map(without_colours);
        let found = lines.find(|l| line.matches(l));
        if let Some(addr) = found.as_deref().and_then(first_addr) {
            return Some(Ok(addr));
        }
        let status = self.child.try_wait()?;
        let name = &self.name;
        Some(Err(format!(
            "{name} exited ({status}) before it logged {what}; its log:\n{log}"
        )))
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

/// The first IPv4 `IP:PORT` in a log line (`addr=127.0.0.1:PORT`,
/// `"addr":"0.0.0.0:PORT"`, `LISTENING 127.0.0.1:PORT`).
fn first_addr(line: &str) -> Option<SocketAddr> {
    let addr_char = |c: char| c.is_ascii_digit() || c == '.' || c == ':';
    let mut rest = line;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        let run = &rest[start..];
        let end = run.find(|c| !addr_char(c)).unwrap_or(run.len());
        if let Ok(addr) = run[..end].parse() {
            return Some(addr);
        }
        rest = &run[end..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address is found in the text and JSON forms of `batcher serve`'s
    /// log, in the bench's `LISTENING` line, and past a timestamp.
    #[test]
    fn finds_the_address_on_its_line() {
        let serving = AddrLine::Event(SERVING.into());
        let text = "2025-01-02T03:04:05.678Z  INFO batcher::server: serving addr=127.0.0.1:4321";
        assert!(serving.matches(text));
        assert_eq!(
            first_addr(text),
            Some(SocketAddr::from(([127, 0, 0, 1], 4321)))
        );
        let json = r#"{"timestamp":"2025-01-02T03:04:05Z","fields":{"message":"serving","addr":"0.0.0.0:80"}}"#;
        assert!(serving.matches(json));
        assert_eq!(first_addr(json), Some(SocketAddr::from(([0, 0, 0, 0], 80))));
        let listening = AddrLine::Prefix("LISTENING ".into());
        assert!(listening.matches("LISTENING 127.0.0.1:9"));
        assert!(
            !serving.matches("INFO batcher::http: serving http (GET /metrics) addr=127.0.0.1:1")
        );
        assert_eq!(first_addr("no address here: 12:30"), None);
    }

    /// Colour sequences go, the text stays.
    #[test]
    fn strips_colours() {
        assert_eq!(without_colours("\u{1b}[32mINFO\u{1b}[0m x"), "INFO x");
    }
}
