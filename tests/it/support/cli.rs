//! The `batcher` operator CLI as a child process: one-shot commands run to
//! the end, and a running `tail` whose stdout lines a test reads with a
//! deadline (its stderr goes to a file, shown when a line does not come).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{ExitStatus, Output, Stdio};

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use super::DEADLINE;

/// The binary, with no `BATCHER_*` variables of the caller's environment.
fn batcher() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_batcher"));
    command
        .env_remove("BATCHER_ADDR")
        .env_remove("BATCHER_TOKEN");
    command.kill_on_drop(true).stdin(Stdio::null());
    command
}

/// Runs `batcher ARGS` to the end.
pub async fn run(args: &[&str]) -> Output {
    run_with(args, &[]).await
}

/// Runs `batcher ARGS` to the end, with the environment variables `env`
/// set; panics if it has not ended within DEADLINE (it is then killed).
pub async fn run_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = batcher();
    command.args(args).envs(env.iter().copied());
    tokio::time::timeout(DEADLINE, command.output())
        .await
        .unwrap_or_else(|_| panic!("batcher {args:?} did not end in time"))
        .expect("run batcher")
}

/// Runs `batcher ARGS --addr ADDR` to the end.
pub async fn at(addr: SocketAddr, args: &[&str]) -> Output {
    let addr = addr.to_string();
    run(&[args, &["--addr", &addr]].concat()).await
}

/// The stdout of a run that must have succeeded.
#[track_caller]
pub fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "batcher failed: {:?}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

/// The stderr of a run that must have failed with exit code `code`.
#[track_caller]
pub fn failed(output: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "stderr: {stderr}");
    stderr
}

/// Each line of `text` parsed as JSON.
#[track_caller]
pub fn json_lines(text: &str) -> Vec<serde_json::Value> {
    let parse = |line: &str| {
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
    };
    text.lines().map(parse).collect()
}

/// A running `batcher tail`.
pub struct Tail {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: tempfile::NamedTempFile,
}

impl Tail {
    /// Starts `batcher tail ARGS --addr ADDR`.
    pub fn start(addr: SocketAddr, args: &[&str]) -> Tail {
        let stderr = tempfile::NamedTempFile::new().expect("temp file");
        let mut child = batcher()
            .arg("tail")
            .args(args)
            .args(["--addr", &addr.to_string()])
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().expect("temp file"))
            .spawn()
            .expect("spawn batcher tail");
        let stdout = child.stdout.take().expect("piped stdout");
        Tail {
            child,
            lines: BufReader::new(stdout).lines(),
            stderr,
        }
    }

    /// The next line the tail prints, or a panic after DEADLINE.
    pub async fn line(&mut self) -> String {
        let next = tokio::time::timeout(DEADLINE, self.lines.next_line()).await;
        match next {
            Ok(Ok(Some(line))) => line,
            other => panic!(
                "no line from tail ({other:?}); its stderr:\n{}",
                std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
            ),
        }
    }

    /// The next line, parsed as JSON.
    pub async fn json(&mut self) -> serde_json::Value {
        let line = self.line().await;
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
    }

    /// What the tail wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }

    /// Sends SIGINT (Ctrl-C) and waits for the exit.
    pub async fn interrupt(mut self) -> ExitStatus {
        let pid = self.child.id().expect("tail runs") as i32;
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .expect("tail did not exit on SIGINT in time")
            .expect("wait for tail")
    }

    /// SIGKILLs the tail, as a crash would end it.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("kill tail");
    }
}
