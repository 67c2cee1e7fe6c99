//! The container image of `scripts/build-image`: its config (entrypoint,
//! user, ports, labels, nothing secret), and the service run from its
//! unpacked layers in a chroot, as the image's user, against a real
//! redis-server.
//!
//! The build fetches Debian packages and the run needs root (mmdebstrap's
//! root mode, `chroot`), so the test is ignored by `cargo test`; `.ci/run`'s
//! `image` stage runs it as root: `cargo test --test it image:: -- --ignored`.
//! It builds the image from the binary this test build made (the debug one),
//! with `--binary`, as CI should.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{self, RedisServer, Spawn};
use batcher::pb;
use batcher_testkit::AddrLine;

/// The image's user and group, as its config names them.
const USER: &str = "65532:65532";
/// The repository the test names as the image's source.
const SOURCE: &str = "https://git.example.com/batcher.git";

/// Runs `program args`, panicking with its output unless it succeeds; its stdout.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Builds the image from this build's binary into `dir`; the archive's path.
fn build(dir: &Path) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(root, "scripts/build-image and chroot need root");
    let archive = dir.join("batcher.tar");
    let binary = env!("CARGO_BIN_EXE_batcher");
    let output = archive.to_str().unwrap();
    let args = ["--binary", binary, "--output", output, "--source", SOURCE];
    run("scripts/build-image", &args);
    archive
}

/// Unpacks the archive's one layer with skopeo and umoci; the root file system.
fn unpack(archive: &Path, dir: &Path) -> PathBuf {
    let layout = format!("oci:{}:batcher", dir.join("oci").display());
    let source = format!("docker-archive:{}", archive.display());
    run("skopeo", &["copy", "--quiet", &source, &layout]);
    let bundle = dir.join("bundle");
    let image = format!("{}:batcher", dir.join("oci").display());
    run(
        "umoci",
        &["unpack", "--image", &image, bundle.to_str().unwrap()],
    );
    bundle.join("rootfs")
}

/// What the image's config says: the entrypoint, the user, the ports, the
/// labels, and no variable, label or history line that could hold a secret.
fn check_config(archive: &Path) {
    let source = format!("docker-archive:{}", archive.display());
    let image: Value = serde_json::from_str(&run("skopeo", &["inspect", "--config", &source]))
        .expect("the image's config is JSON");
    let config = &image["config"];
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/batcher"])
    );
    assert_eq!(
        config["Cmd"],
        serde_json::json!(["serve", "--config", "/etc/batcher/batcher.toml"])
    );
    assert_eq!(
        config["User"], USER,
        "a numeric non-root user, which Kubernetes can check"
    );
    let ports: Vec<&String> = config["ExposedPorts"]
        .as_object()
        .expect("ExposedPorts")
        .keys()
        .collect();
    assert_eq!(ports, ["50051/tcp", "9464/tcp"]);
    let labels = &config["Labels"];
    let label = |name: &str| {
        labels[format!("org.opencontainers.image.{name}")]
            .as_str()
            .unwrap_or_else(|| panic!("no label {name}: {labels}"))
            .to_owned()
    };
    assert_eq!(label("version"), env!("CARGO_PKG_VERSION"));
    let head = run("git", &["rev-parse", "HEAD"]);
    assert!(label("revision").starts_with(head.trim()), "{labels}");
    assert_eq!(label("created"), image["created"].as_str().unwrap());
    assert_eq!(label("licenses"), env!("CARGO_PKG_LICENSE"));
    assert_eq!(label("title"), "batcher");
    assert_eq!(label("source"), SOURCE);
    // Nothing that names a secret, in the variables, labels or history.
    let said = format!("{}{}{}", config["Env"], labels, image["history"]).to_lowercase();
    for word in ["password", "token", "secret", "private", "key="] {
        assert!(
            !said.contains(word),
            "the image's config mentions {word}: {said}"
        );
    }
}

/// What the root file system holds: the binary, its libraries, CA roots,
/// time zones and the user, and no shell.
fn check_files(rootfs: &Path) {
    for path in [
        "usr/local/bin/batcher",
        "lib64/ld-linux-x86-64.so.2",
        "usr/share/zoneinfo/Europe/Berlin",
        "etc/batcher/batcher.toml",
    ] {
        assert!(rootfs.join(path).exists(), "no /{path} in the image");
    }
    let roots = std::fs::read_to_string(rootfs.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    let count = roots.matches("BEGIN CERTIFICATE").count();
    assert!(count > 100, "only {count} CA roots");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.contains("batcher:x:65532:65532:"), "{passwd}");
    for shell in ["bin/sh", "bin/bash", "usr/bin/sh", "usr/bin/dash"] {
        assert!(
            !rootfs.join(shell).exists(),
            "a shell in the image: /{shell}"
        );
    }
}

/// The image's config is right, and the service runs from its unpacked
/// layers as its user: it reports SERVING over gRPC health, takes an add
/// into Redis, and serves /metrics.
#[tokio::test]
#[ignore = "builds the image as root from Debian packages: run by .ci/run's image stage"]
async fn the_image_serves_from_its_layers_as_its_user() {
    let dir = tempfile::tempdir().unwrap();
    let archive = build(dir.path());
    check_config(&archive);
    let rootfs = unpack(&archive, dir.path());
    check_files(&rootfs);
    let userspec = format!("--userspec={USER}");
    let chroot = |args: &[&str]| {
        let mut all = vec![userspec.as_str(), rootfs.to_str().unwrap()];
        all.extend(args);
        run("chroot", &all)
    };
    // The image's own config is one the service takes.
    chroot(&[
        "/usr/local/bin/batcher",
        "config",
        "check",
        "/etc/batcher/batcher.toml",
    ]);

    let redis = RedisServer::start();
    let config = support::config_text(&redis.url(), "");
    std::fs::write(rootfs.join("etc/batcher/test.toml"), config).unwrap();
    let serving = AddrLine::Event("serving".into());
    let mut service = Spawn::new("chroot", dir.path().join("serve.log"), serving)
        .args([userspec.as_str(), rootfs.to_str().unwrap()])
        .args([
            "/usr/local/bin/batcher",
            "serve",
            "--config",
            "/etc/batcher/test.toml",
        ])
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .start()
        .await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", service.pid())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(uid.split_whitespace().nth(1), Some("65532"), "{uid}");

    support::wait_health(service.addr, ServingStatus::Serving).await;
    let mut client = support::client(service.addr).await;
    let added = client
        .add(support::add("north", "parcel-1", b"from the image"))
        .await
        .expect("an add through the image's service")
        .into_inner();
    assert_eq!(added.outcome, pb::AddOutcome::Added as i32);
    let key = "north".to_owned();
    let got = client.get_group(pb::GetGroupRequest { key }).await;
    let group = got.expect("GetGroup").into_inner().group;
    assert_eq!(group.expect("the group is open").size, 1);
    let http = service.http_addr().await;
    support::scrape::scrape(http).await;
    service.stop().await;
}
