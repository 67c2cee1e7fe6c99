//! The Kubernetes manifests in `deploy/kubernetes`: valid against the
//! Kubernetes schemas offline (`scripts/validate-kubernetes`, with the
//! schemas kubernetes-validate carries, in a virtualenv that
//! `scripts/ensure-kubernetes-validate` makes once), their config one the
//! service accepts, and the pieces agreeing with each other and with the
//! config: ports, probes, mounted files, the drain within the grace period,
//! the image's user, and KEDA's query on the metric the service exports.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use batcher::config::Config;
use serde_json::Value;

/// The manifests' directory.
fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// Runs `cmd`, panicking with its output unless it succeeds; its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The validated resources, as `scripts/validate-kubernetes --json` renders them.
fn resources() -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/validate-kubernetes");
    let json = run(Command::new(script).arg(dir()).arg("--json"));
    serde_json::from_str(&json).expect("a JSON array of resources")
}

/// The resource of `kind` named `name`.
fn find<'a>(resources: &'a [Value], kind: &str, name: &str) -> &'a Value {
    resources
        .iter()
        .find(|r| r["kind"] == kind && r["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

/// A duration field of the config's top level, if the file sets it.
fn duration(toml: &toml::Table, field: &str) -> Option<Duration> {
    let text = toml.get(field)?.as_str().expect("a duration string");
    Some(humantime::parse_duration(text).expect("a humantime duration"))
}

/// A container's port number by name.
fn port(container: &Value, name: &str) -> u64 {
    let ports = container["ports"].as_array().expect("ports");
    let found = ports.iter().find(|p| p["name"] == name);
    found.unwrap_or_else(|| panic!("no port {name}"))["containerPort"]
        .as_u64()
        .unwrap()
}

/// Where the pod mounts the volume that holds `source` (a ConfigMap's or a
/// Secret's name).
fn mount_of(pod: &Value, container: &Value, source: &str) -> String {
    let volumes = pod["volumes"].as_array().expect("volumes");
    let volume = volumes
        .iter()
        .find(|v| v["configMap"]["name"] == source || v["secret"]["secretName"] == source)
        .unwrap_or_else(|| panic!("no volume of {source}"));
    let mounts = container["volumeMounts"].as_array().expect("mounts");
    let mount = mounts.iter().find(|m| m["name"] == volume["name"]);
    let mount = mount.unwrap_or_else(|| panic!("{source} is not mounted"));
    mount["mountPath"].as_str().unwrap().to_owned()
}

/// The manifests validate against the Kubernetes schemas (and KEDA's), the
/// ConfigMap's config passes `batcher config check`, and the Deployment,
/// its Service, budget, policy and scaler fit that config and each other.
#[test]
fn the_kubernetes_manifests_validate_and_agree_with_the_config() {
    let resources = resources();
    let config_file = dir().join("batcher.toml");
    let checked = run(Command::new(env!("CARGO_BIN_EXE_batcher"))
        .args(["config", "check"])
        .arg(&config_file));
    assert!(checked.contains("ok"), "{checked}");
    let text = std::fs::read_to_string(&config_file).unwrap();
    let config = Config::load(&config_file).unwrap();
    let table: toml::Table = text.parse().unwrap();
    let config_map = find(&resources, "ConfigMap", "batcher-config");
    assert_eq!(config_map["data"]["batcher.toml"], text.as_str());

    let deployment = find(&resources, "Deployment", "batcher");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    // The ports are the config's, on every address.
    assert_eq!(port(container, "grpc"), u64::from(config.listen.port()));
    assert_eq!(
        port(container, "http"),
        u64::from(config.http.listen.port())
    );
    assert!(config.listen.ip().is_unspecified() && config.http.listen.ip().is_unspecified());
    // Readiness drops at a drain, liveness does not; both on the HTTP port.
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "http", "{probe}");
    }
    // The config file, the TLS key and the Redis password are where the
    // config says, in the ConfigMap and Secrets.
    let args = container["args"].as_array().unwrap();
    let config_path = format!(
        "{}/batcher.toml",
        mount_of(pod, container, "batcher-config")
    );
    assert_eq!(args[args.len() - 1], config_path.as_str());
    let tls = config.tls.as_ref().expect("[tls]");
    let tls_dir = mount_of(pod, container, "batcher-tls");
    assert_eq!(tls.cert, Path::new(&tls_dir).join("tls.crt"));
    assert_eq!(tls.key, Path::new(&tls_dir).join("tls.key"));
    let password = config.redis.password_file.as_ref().expect("password_file");
    let redis_dir = mount_of(pod, container, "batcher-redis");
    assert_eq!(password, &Path::new(&redis_dir).join("password"));
    // The drain fits in the grace period, with 5 s to spare: the delay
    // (5 s unless set) and the drain's timeout (`drain_timeout`, formerly
    // `shutdown_grace`).
    let delay = duration(&table, "drain_delay").unwrap_or(Duration::from_secs(5));
    let timeout = duration(&table, "drain_timeout")
        .or_else(|| duration(&table, "shutdown_grace"))
        .expect("the config sets the drain's timeout");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        Duration::from_secs(grace) >= delay + timeout + Duration::from_secs(5),
        "terminationGracePeriodSeconds {grace} against a drain of {delay:?} + {timeout:?}"
    );
    // The image's user, and requests for the scheduler.
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["requests"]["memory"].is_string());

    // The Service, the budget and the policy pick the Deployment's pods.
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    let service = find(&resources, "Service", "batcher");
    assert_eq!(&service["spec"]["selector"], selector);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "grpc");
    let budget = find(&resources, "PodDisruptionBudget", "batcher");
    assert_eq!(&budget["spec"]["selector"]["matchLabels"], selector);
    let policy = find(&resources, "NetworkPolicy", "batcher");
    assert_eq!(&policy["spec"]["podSelector"]["matchLabels"], selector);
    for (key, value) in selector.as_object().unwrap() {
        assert_eq!(&labels[key], value);
    }
    // The consumer carries the label the policy lets in to the gRPC port.
    let consumer = find(&resources, "Deployment", "batcher-consumer");
    let consumer_pod = &consumer["spec"]["template"];
    let ingress = &policy["spec"]["ingress"][0];
    let client = ingress["from"][0]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap();
    for (key, value) in client {
        assert_eq!(&consumer_pod["metadata"]["labels"][key], value);
    }
    assert_eq!(ingress["ports"][0]["port"], "grpc");

    // KEDA scales the consumer on its group's lag, as the service exports it.
    let scaler = find(&resources, "ScaledObject", "batcher-consumer");
    assert_eq!(scaler["spec"]["scaleTargetRef"]["name"], "batcher-consumer");
    let trigger = &scaler["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "prometheus");
    let query = trigger["metadata"]["query"].as_str().unwrap();
    let group = consumer_pod["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--group="))
        .expect("the consumer's --group");
    assert_eq!(
        query,
        format!(
            "max({}{{consumer_group=\"{group}\"}})",
            batcher::metrics::CONSUMER_LAG
        )
    );

    kustomize(&resources);
}

/// With kubectl on the PATH, `kubectl kustomize` renders the same
/// resources, and the Deployment mounts the ConfigMap under the name with
/// the hash kustomize gave it. Without kubectl, says so and checks nothing.
fn kustomize(resources: &[Value]) {
    let Ok(out) = Command::new("kubectl").arg("kustomize").arg(dir()).output() else {
        eprintln!("kubectl is not installed: `kubectl kustomize` not checked");
        return;
    };
    let rendered = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = rendered
        .split("\n---\n")
        .map(|doc| {
            let field = |name: &str| {
                doc.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_else(|| panic!("no {name} in\n{doc}"))
                    .trim()
                    .to_owned()
            };
            let name = doc
                .split("\nmetadata:\n")
                .nth(1)
                .and_then(|m| m.lines().find_map(|l| l.strip_prefix("  name: ")))
                .expect("metadata.name")
                .to_owned();
            format!("{}/{name}", field("kind: "))
        })
        .collect();
    let config_map = names
        .iter()
        .find_map(|n| n.strip_prefix("ConfigMap/"))
        .expect("the generated ConfigMap")
        .to_owned();
    assert!(config_map.starts_with("batcher-config-"), "{config_map}");
    assert!(rendered.contains(&format!("name: {config_map}\n")));
    let mut ours: Vec<String> = resources
        .iter()
        .map(|r| {
            let name = r["metadata"]["name"].as_str().unwrap();
            let name = if name == "batcher-config" {
                &config_map
            } else {
                name
            };
            format!("{}/{name}", r["kind"].as_str().unwrap())
        })
        .collect();
    let mut theirs = names.clone();
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);
}
