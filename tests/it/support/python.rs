//! The Python client of `examples/python` for tests: a virtualenv with its
//! requirements, its stubs generated from `proto/`, and its scripts run as
//! child processes with their output in files.
//!
//! The virtualenv is built once per `requirements.txt` and Python, under
//! `target/tmp/python-venv-<hash>`, and reused while it imports grpc (pip
//! install takes tens of seconds). It is built beside its final place and
//! renamed into it, so a half-built one is never reused. A machine without
//! `python3 -m venv` fails the test with a message that names
//! `scripts/ensure-python`, which installs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use tempfile::TempDir;

use super::DEADLINE;

/// The examples' directory in this checkout.
fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python")
}

/// The examples with a ready virtualenv and freshly generated stubs.
pub struct Python {
    venv: &'static Path,
    /// Holds the generated stubs (`gen/`) and the scripts' output files.
    dir: TempDir,
}

impl Python {
    /// Builds (or reuses) the virtualenv and generates the stubs with
    /// `generate.py`. Blocks: call it before starting anything else.
    pub fn new() -> Python {
        let venv = venv();
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("gen");
        let mut generate = Command::new(venv.join("bin/python"));
        generate
            .arg(examples().join("generate.py"))
            .arg("--out")
            .arg(&out);
        check(&mut generate, "generate.py");
        Python { venv, dir }
    }

    /// Starts `script` (such as "producer.py") with `args`, separated by
    /// whitespace; `name` tells its output files apart.
    pub fn spawn(&self, name: &str, script: &str, args: &str) -> Script {
        let stdout = self.dir.path().join(format!("{name}.out"));
        let stderr = self.dir.path().join(format!("{name}.err"));
        let child = tokio::process::Command::new(self.venv.join("bin/python"))
            .arg(examples().join(script))
            .args(args.split_whitespace())
            .env("PYTHONPATH", self.dir.path().join("gen"))
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {script}: {e}"));
        Script {
            name: name.to_owned(),
            child,
            stdout,
            stderr,
        }
    }
}

/// A running example script; killed when dropped.
pub struct Script {
    name: String,
    child: tokio::process::Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Script {
    /// What the script has printed to stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// What the script has logged (stderr) so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for the script to exit 0 and returns its stdout; panics with its
    /// output if it fails or outlives the deadline.
    pub async fn success(mut self) -> String {
        let status = tokio::time::timeout(DEADLINE, self.child.wait()).await;
        match status {
            Ok(Ok(status)) if status.success() => self.stdout(),
            other => panic!(
                "{} did not exit 0 in time ({other:?})\n--- stdout\n{}\n--- stderr\n{}",
                self.name,
                self.stdout(),
                self.stderr()
            ),
        }
    }
}

/// The shared virtualenv, built on first use.
fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let requirements = examples().join("requirements.txt");
        let mut key = std::fs::read(&requirements).expect("read requirements.txt");
        key.extend(python_identity().as_bytes());
        let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let venv = target.join(format!("python-venv-{:016x}", fnv1a(&key)));
        if !imports_grpc(&venv) {
            build_venv(&venv, &requirements);
        }
        venv
    })
}

/// The version and path of `python3`: a venv links to the Python that made it.
fn python_identity() -> String {
    let mut command = Command::new("python3");
    command.args(["-c", "import sys; print(sys.version, sys.executable)"]);
    String::from_utf8_lossy(&check(&mut command, "python3").stdout).into_owned()
}

/// Whether `venv` exists and its Python imports the requirements.
fn imports_grpc(venv: &Path) -> bool {
    Command::new(venv.join("bin/python"))
        .args(["-c", "import grpc, grpc_tools"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A virtualenv being built, removed if it is dropped before it is moved
/// into place (a failed pip install, a panic).
struct Building(PathBuf);

impl Drop for Building {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes what an interrupted build of `venv` left beside it: directories
/// `<venv>.building-<pid>` whose process is gone.
fn remove_interrupted_builds(venv: &Path) {
    let (Some(dir), Some(name)) = (venv.parent(), venv.file_name()) else {
        return;
    };
    let prefix = format!("{}.building-", name.to_string_lossy());
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_string_lossy()
            .strip_prefix(&prefix)
            .map(str::to_owned)
        else {
            continue;
        };
        if !Path::new("/proc").join(&pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Creates a virtualenv with `requirements` beside `venv`, then moves it there.
fn build_venv(venv: &Path, requirements: &Path) {
    remove_interrupted_builds(venv);
    let guard = Building(venv.with_extension(format!("building-{}", std::process::id())));
    let building = &guard.0;
    let _ = std::fs::remove_dir_all(building);
    let mut create = Command::new("python3");
    create.args(["-m", "venv"]).arg(building);
    check(&mut create, "python3 -m venv");
    let mut install = Command::new(building.join("bin/python"));
    install
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg("-r")
        .arg(requirements);
    check(
        &mut install,
        "pip install -r examples/python/requirements.txt",
    );
    let _ = std::fs::remove_dir_all(venv);
    // If another test process got there first, its venv serves as well, and
    // the guard removes ours.
    let _ = std::fs::rename(building, venv);
}

/// Runs `command` to its end; panics with its output unless it exits 0.
fn check(command: &mut Command, what: &str) -> Output {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what} could not start ({e}); run scripts/ensure-python"));
    assert!(
        output.status.success(),
        "{what} failed ({}); scripts/ensure-python installs python3-venv\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// 64-bit FNV-1a: a stable name for the venv's inputs.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
