//! deploy/: the Kubernetes manifests parse and say what the server does (probes, ports,
//! snapshot volume, shutdown budget, admin token, network policy, spread over nodes), the
//! probes exactly as the manifest states them pass against a ready server with mTLS on,
//! `thunder-server --check-config` accepts the StatefulSet's arguments and refuses bad values
//! with exit code 2, and the Dockerfile's build script is sound.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use thunder_testbed::repo::{root, yaml_documents};
use thunder_testbed::server_process::ServerProcess;

/// Every manifest in deploy/k8s, by kind.
fn manifests() -> Vec<Value> {
    let mut docs = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(root().join("deploy/k8s"))
        .expect("deploy/k8s")
        .map(|e| e.expect("entry").path())
        .collect();
    paths.sort();
    for path in paths {
        assert_eq!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml"),
            "{}",
            path.display()
        );
        docs.extend(yaml_documents(&path));
    }
    docs
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deploy/k8s"))
}

/// The server container of the StatefulSet.
fn server_container(docs: &[Value]) -> &Value {
    &of_kind(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
}

/// The container's arguments, `--flag=value` each.
fn container_args(docs: &[Value]) -> Vec<String> {
    server_container(docs)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_owned())
        .collect()
}

fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} not in the manifest's args"))
}

/// `thunder-server --check-config ARGS` with the two secrets the manifest takes from its
/// Secret set in the environment, as the manifest sets them.
fn check_config(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_thunder-server"))
        .arg("--check-config")
        .args(args)
        .env("THUNDER_CURSOR_SECRET", "manifest-test-secret")
        .env("THUNDER_ADMIN_TOKEN", "manifest-test-token")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run thunder-server --check-config")
}

/// The container port a probe names (by name or by number).
fn probe_port(container: &Value, port: &Value) -> u64 {
    if let Some(number) = port.as_u64() {
        return number;
    }
    container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == *port)
        .unwrap_or_else(|| panic!("the probe's port {port} is not a named container port"))
        ["containerPort"]
        .as_u64()
        .expect("containerPort")
}

/// The port of a `host:port` flag value.
fn port_of(addr: &str) -> u64 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr}"))
}

/// The container's probes: (which, path) of each, all HTTP GETs on the admin port (a gRPC or
/// TLS probe cannot present a client certificate to an mTLS gRPC port).
fn http_probes(docs: &[Value]) -> Vec<(&'static str, String)> {
    let container = server_container(docs);
    let admin_port = port_of(flag(&container_args(docs), "--admin-addr"));
    let mut probes = Vec::new();
    for which in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let probe = &container[which];
        if probe.is_null() {
            continue;
        }
        let get = &probe["httpGet"];
        assert!(get.is_object(), "{which} is not an HTTP GET: {probe}");
        assert!(
            get["scheme"].is_null() || get["scheme"] == "HTTP",
            "{which}: plain HTTP"
        );
        assert_eq!(
            probe_port(container, &get["port"]),
            admin_port,
            "{which} probes the admin port"
        );
        probes.push((which, get["path"].as_str().expect("path").to_owned()));
    }
    probes
}

#[test]
fn manifests_probe_over_plain_http_on_the_admin_port() {
    let docs = manifests();
    let args = container_args(&docs);
    let container = server_container(&docs);
    assert!(
        flag(&args, "--admin-addr").starts_with("0.0.0.0:"),
        "the kubelet must reach the admin port"
    );
    let probes = http_probes(&docs);
    assert!(probes.contains(&("readinessProbe", "/readyz".to_owned())));
    assert!(probes.contains(&("livenessProbe", "/healthz".to_owned())));

    // The snapshot directory lives on the claimed volume.
    let snapshot_dir = flag(&args, "--snapshot-dir");
    let mount = &container["volumeMounts"][0];
    let claim = &of_kind(&docs, "StatefulSet")["spec"]["volumeClaimTemplates"][0];
    assert_eq!(mount["name"], claim["metadata"]["name"]);
    assert!(snapshot_dir.starts_with(mount["mountPath"].as_str().expect("mountPath")));

    let service = of_kind(&docs, "Service");
    assert_eq!(service["spec"]["clusterIP"], "None", "headless");
    let pdb = of_kind(&docs, "PodDisruptionBudget");
    assert_eq!(
        pdb["spec"]["selector"],
        of_kind(&docs, "StatefulSet")["spec"]["selector"]
    );
}

#[test]
fn manifests_cover_shutdown_version_logs_admin_token_policy_and_spread() {
    let docs = manifests();
    let args = container_args(&docs);
    let statefulset = of_kind(&docs, "StatefulSet");
    let pod = &statefulset["spec"]["template"]["spec"];
    let container = server_container(&docs);

    // The grace period covers the lame duck, the drain, the Kafka stop and a snapshot.
    let delay: u64 = flag(&args, "--shutdown-delay-secs").parse().expect("secs");
    let drain_ms: u64 = flag(&args, "--shutdown-timeout-ms").parse().expect("ms");
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("grace");
    assert!(delay >= 3, "a lame duck longer than endpoint propagation");
    // 10 s at most for the Kafka stop (main.rs), 20 s for a snapshot of 20M posts.
    assert!(
        grace >= delay + drain_ms.div_ceil(1000) + 10 + 20,
        "terminationGracePeriodSeconds {grace} leaves no room for the snapshot"
    );

    // A registry to replace, and a release tag, the workspace's version.
    let image = container["image"].as_str().expect("image");
    let (repository, tag) = image.rsplit_once(':').expect("a tag");
    assert_eq!(tag, env!("CARGO_PKG_VERSION"), "{image}");
    let registry = repository.split('/').next().unwrap_or_default();
    assert!(
        repository.contains('/') && (registry.contains('.') || registry.contains(':')),
        "the image names a registry host: {image}"
    );
    assert_eq!(flag(&args, "--log-format"), "json");

    // The admin token comes from a Secret, never from the manifest itself.
    let env = container["env"].as_array().expect("env");
    let token = env
        .iter()
        .find(|e| e["name"] == "THUNDER_ADMIN_TOKEN")
        .expect("THUNDER_ADMIN_TOKEN set");
    assert!(token["value"].is_null());
    assert!(token["valueFrom"]["secretKeyRef"]["key"].is_string());
    assert!(!args.iter().any(|a| a.starts_with("--admin-token")));

    // gRPC from the clients, the admin port from the monitoring namespace only.
    let policy = of_kind(&docs, "NetworkPolicy");
    assert_eq!(
        policy["spec"]["podSelector"],
        statefulset["spec"]["selector"]
    );
    let rules = policy["spec"]["ingress"].as_array().expect("ingress rules");
    let rule_for = |port: &str| {
        rules
            .iter()
            .find(|r| r["ports"][0]["port"] == port)
            .unwrap_or_else(|| panic!("no ingress rule for {port}"))
    };
    assert!(rule_for("grpc")["from"][0]["podSelector"].is_object());
    assert_eq!(
        rule_for("admin")["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    assert_eq!(rules.len(), 2, "nothing else is let in");

    // Replicas spread over nodes.
    let spread = pod["topologySpreadConstraints"]
        .as_array()
        .expect("topologySpreadConstraints");
    assert!(
        spread
            .iter()
            .any(|c| c["topologyKey"] == "kubernetes.io/hostname"
                && c["whenUnsatisfiable"] == "DoNotSchedule"
                && c["labelSelector"]["matchLabels"]
                    == statefulset["spec"]["selector"]["matchLabels"]),
        "{spread:?}"
    );
}

/// Every container of a pod spec, init and ephemeral ones included.
fn all_containers(pod: &Value) -> Vec<&Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|list| pod[*list].as_array())
        .flatten()
        .collect()
}

/// What keeps `pod` (a pod spec) out of a namespace enforcing the Kubernetes "restricted" Pod
/// Security Standard (its baseline rules included), one line a violation. The rules of
/// <https://kubernetes.io/docs/concepts/security/pod-security-standards/>.
fn restricted_violations(pod: &Value) -> Vec<String> {
    const VOLUME_TYPES: [&str; 8] = [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    const SAFE_SYSCTLS: [&str; 8] = [
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
    ];
    let mut violations = Vec::new();
    let mut refuse = |bad: bool, what: String| {
        if bad {
            violations.push(what);
        }
    };
    let pod_context = &pod["securityContext"];
    for namespace in ["hostNetwork", "hostPID", "hostIPC"] {
        refuse(
            pod[namespace] == true,
            format!("{namespace} shares a host namespace"),
        );
    }
    for volume in pod["volumes"].as_array().into_iter().flatten() {
        let kind = volume
            .as_object()
            .and_then(|v| v.keys().find(|k| *k != "name"))
            .map_or("?", String::as_str);
        refuse(
            !VOLUME_TYPES.contains(&kind),
            format!("volume {} is of type {kind}", volume["name"]),
        );
    }
    for sysctl in pod_context["sysctls"].as_array().into_iter().flatten() {
        let name = sysctl["name"].as_str().unwrap_or_default();
        refuse(!SAFE_SYSCTLS.contains(&name), format!("sysctl {name}"));
    }
    let seccomp_ok = |context: &Value| {
        matches!(
            context["seccompProfile"]["type"].as_str(),
            Some("RuntimeDefault" | "Localhost")
        )
    };
    let pod_seccomp = seccomp_ok(pod_context);
    let pod_non_root = pod_context["runAsNonRoot"] == true;
    refuse(
        pod_context["runAsUser"] == 0,
        "the pod runs as uid 0".into(),
    );
    refuse(
        pod_context["seccompProfile"]["type"] == "Unconfined",
        "the pod's seccomp profile is Unconfined".into(),
    );
    refuse(
        pod_context["appArmorProfile"]["type"] == "Unconfined",
        "the pod's AppArmor profile is Unconfined".into(),
    );
    refuse(
        pod_context["windowsOptions"]["hostProcess"] == true,
        "the pod is a Windows host process".into(),
    );
    for container in all_containers(pod) {
        let name = container["name"].as_str().unwrap_or("?");
        let context = &container["securityContext"];
        refuse(context["privileged"] == true, format!("{name}: privileged"));
        refuse(
            context["allowPrivilegeEscalation"] != false,
            format!("{name}: allowPrivilegeEscalation is not false"),
        );
        refuse(
            !(pod_non_root || context["runAsNonRoot"] == true) || context["runAsNonRoot"] == false,
            format!("{name}: runAsNonRoot is not true"),
        );
        refuse(context["runAsUser"] == 0, format!("{name}: runs as uid 0"));
        refuse(
            !(pod_seccomp || seccomp_ok(context))
                || context["seccompProfile"]["type"] == "Unconfined",
            format!("{name}: no RuntimeDefault or Localhost seccomp profile"),
        );
        refuse(
            context["appArmorProfile"]["type"] == "Unconfined",
            format!("{name}: AppArmor Unconfined"),
        );
        refuse(
            context["procMount"]
                .as_str()
                .is_some_and(|m| m != "Default"),
            format!("{name}: procMount {}", context["procMount"]),
        );
        refuse(
            context["seLinuxOptions"]["user"].is_string()
                || context["seLinuxOptions"]["role"].is_string(),
            format!("{name}: sets an SELinux user or role"),
        );
        let capabilities = &context["capabilities"];
        refuse(
            !capabilities["drop"]
                .as_array()
                .is_some_and(|d| d.iter().any(|c| c == "ALL")),
            format!("{name}: capabilities do not drop ALL"),
        );
        for added in capabilities["add"].as_array().into_iter().flatten() {
            refuse(
                added != "NET_BIND_SERVICE",
                format!("{name}: adds capability {added}"),
            );
        }
        for port in container["ports"].as_array().into_iter().flatten() {
            refuse(
                port["hostPort"].as_u64().is_some_and(|p| p != 0),
                format!("{name}: hostPort {}", port["hostPort"]),
            );
        }
    }
    violations
}

/// A namespace enforcing `pod-security.kubernetes.io/enforce: restricted` admits the
/// StatefulSet's pods; the check itself catches each kind of violation.
#[test]
fn the_pods_meet_the_restricted_pod_security_standard() {
    let docs = manifests();
    let pod = &of_kind(&docs, "StatefulSet")["spec"]["template"]["spec"];
    let violations = restricted_violations(pod);
    assert!(violations.is_empty(), "{violations:#?}");

    // Each mutation breaks one rule, and the check says so.
    let broken = |change: &dyn Fn(&mut Value), expect: &str| {
        let mut pod = pod.clone();
        change(&mut pod);
        let violations = restricted_violations(&pod);
        assert!(
            violations.iter().any(|v| v.contains(expect)),
            "{expect} not caught: {violations:?}"
        );
    };
    broken(
        &|pod| pod["securityContext"]["seccompProfile"] = Value::Null,
        "seccomp",
    );
    broken(
        &|pod| pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = true.into(),
        "allowPrivilegeEscalation",
    );
    broken(
        &|pod| pod["securityContext"]["runAsNonRoot"] = Value::Null,
        "runAsNonRoot",
    );
    broken(
        &|pod| pod["securityContext"]["runAsUser"] = 0.into(),
        "uid 0",
    );
    broken(
        &|pod| pod["containers"][0]["securityContext"]["capabilities"]["drop"] = Value::Null,
        "drop ALL",
    );
    broken(
        &|pod| {
            pod["containers"][0]["securityContext"]["capabilities"]["add"] =
                serde_json::json!(["SYS_ADMIN"]);
        },
        "SYS_ADMIN",
    );
    broken(
        &|pod| {
            pod["volumes"]
                .as_array_mut()
                .expect("volumes")
                .push(serde_json::json!({"name": "host", "hostPath": {"path": "/"}}));
        },
        "hostPath",
    );
    broken(&|pod| pod["hostNetwork"] = true.into(), "hostNetwork");
    broken(
        &|pod| {
            pod["initContainers"] = serde_json::json!([{"name": "init", "image": "x"}]);
        },
        "init: allowPrivilegeEscalation",
    );
}

/// One slow `/readyz` answer, or one failed one, does not take a replica out of service:
/// the probe waits longer than the kubelet's 1 s default and needs failures in a row.
#[test]
fn the_readiness_probe_rides_out_one_slow_answer() {
    let docs = manifests();
    let probe = &server_container(&docs)["readinessProbe"];
    let timeout = probe["timeoutSeconds"].as_u64().unwrap_or(1);
    let failures = probe["failureThreshold"].as_u64().unwrap_or(3);
    let period = probe["periodSeconds"].as_u64().unwrap_or(10);
    assert!(timeout >= 2, "timeoutSeconds {timeout}: {probe}");
    assert!(failures >= 2, "failureThreshold {failures}: {probe}");
    // Still out within seconds when a partition stalls.
    assert!(period * failures <= 10, "{probe}");
}

/// A Kubernetes quantity (`2560Mi`, `5Gi`) in bytes.
fn quantity_bytes(quantity: &str) -> u64 {
    let (number, unit) = quantity
        .find(|c: char| !c.is_ascii_digit())
        .map_or((quantity, ""), |at| quantity.split_at(at));
    let number: u64 = number.parse().unwrap_or_else(|_| panic!("{quantity}"));
    let scale = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("unit {other} of {quantity}"),
    };
    number * scale
}

/// docs/operating.md states the StatefulSet's memory request and limit and its volume as the
/// manifest has them, and its sizing's limit in GiB is the manifest's.
#[test]
fn the_docs_state_the_manifests_resources() {
    let docs = manifests();
    let resources = &server_container(&docs)["resources"];
    let request = resources["requests"]["memory"]
        .as_str()
        .expect("memory request");
    let limit = resources["limits"]["memory"]
        .as_str()
        .expect("memory limit");
    let statefulset = of_kind(&docs, "StatefulSet");
    let volume =
        statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
            .as_str()
            .expect("storage");
    let operating = std::fs::read_to_string(root().join("docs/operating.md")).expect("docs");
    let stated = format!(
        "memory request and limit (`{request}`, `{limit}`) and snapshot volume (`{volume}`)"
    );
    assert!(
        operating.contains(&stated),
        "docs/operating.md does not say {stated}"
    );
    let limit_gib = quantity_bytes(limit) as f64 / f64::from(1u32 << 30);
    assert!(
        operating.contains(&format!("a {limit_gib} GiB limit")),
        "docs/operating.md's sizing names another limit than {limit_gib} GiB"
    );
    assert!(quantity_bytes(request) <= quantity_bytes(limit));
}

/// The secured setup is wired: the commented-out flags name files in the Secret volumes the
/// header's commands create, the SASL password comes from that Secret into the environment,
/// both Secrets are optional (a pod starts without them), and with the flags uncommented and
/// those files in place `--check-config` accepts the whole configuration.
#[test]
fn the_secured_setup_is_wired_to_the_secrets_and_valid() {
    let text = std::fs::read_to_string(root().join("deploy/k8s/statefulset.yaml")).expect("read");
    let docs = manifests();
    let pod = &of_kind(&docs, "StatefulSet")["spec"]["template"]["spec"];
    let container = server_container(&docs);
    let commented: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("# - --"))
        .map(|flag| format!("--{flag}"))
        .collect();
    for flag in ["--kafka-security-protocol", "--tls-cert", "--tls-client-ca"] {
        assert!(
            commented.iter().any(|a| a.starts_with(flag)),
            "no commented {flag}: {commented:?}"
        );
    }
    // Secret volumes by mount path, each optional.
    let mut secret_mounts = Vec::new();
    for mount in container["volumeMounts"].as_array().expect("mounts") {
        let volume = pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == mount["name"]);
        if let Some(secret) = volume.map(|v| &v["secret"]).filter(|s| s.is_object()) {
            assert_eq!(secret["optional"], true, "{secret}");
            assert_eq!(mount["readOnly"], true, "{mount}");
            secret_mounts.push((
                mount["mountPath"].as_str().expect("path").to_owned(),
                secret["secretName"].as_str().expect("name").to_owned(),
            ));
        }
    }
    assert_eq!(secret_mounts.len(), 2, "{secret_mounts:?}");
    // The key a secret file comes from must be one the header's commands put in that Secret.
    let created = |secret: &str, key: &str| {
        let command = text
            .split("kubectl create secret generic ")
            .find(|c| c.starts_with(&format!("{secret} ")))
            .unwrap_or_else(|| panic!("the header does not create {secret}"));
        let command = command.split("\n#\n").next().unwrap_or(command);
        command.contains(&format!("--from-file={key}="))
            || command.contains(&format!("--from-literal={key}="))
    };
    let scratch = tempfile::tempdir().expect("tempdir");
    let pki = thunder_testbed::pki::new_pki();
    let contents = |file: &str| match file {
        "ca.pem" | "ca.crt" => pki.ca_pem.clone(),
        "client.pem" => pki.client.0.clone(),
        "client.key" => pki.client.1.clone(),
        "tls.crt" => pki.server.0.clone(),
        "tls.key" => pki.server.1.clone(),
        other => panic!("a secret file the test does not know: {other}"),
    };
    let mut uncommented = Vec::new();
    for flag in &commented {
        let Some((name, path)) = flag.split_once('=').filter(|(_, v)| v.starts_with('/')) else {
            uncommented.push(flag.clone());
            continue;
        };
        let (mount, secret) = secret_mounts
            .iter()
            .find(|(mount, _)| path.starts_with(&format!("{mount}/")))
            .unwrap_or_else(|| panic!("{flag}: not in a Secret volume"));
        let file = &path[mount.len() + 1..];
        assert!(
            created(secret, file),
            "{flag}: the header does not put {file} in {secret}"
        );
        let local = scratch.path().join(secret).join(file);
        std::fs::create_dir_all(local.parent().expect("dir")).expect("mkdir");
        std::fs::write(&local, contents(file)).expect("write");
        uncommented.push(format!("{name}={}", local.display()));
    }
    let password = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "THUNDER_KAFKA_SASL_PASSWORD")
        .expect("the SASL password from the Secret");
    let from = &password["valueFrom"]["secretKeyRef"];
    assert_eq!(from["optional"], true, "{password}");
    assert!(
        created(
            from["name"].as_str().expect("name"),
            from["key"].as_str().expect("key")
        ),
        "{password}"
    );
    // The live arguments with the secured ones, the snapshot directory moved to scratch.
    let snapshots = scratch.path().join("snapshots");
    let args: Vec<String> = container_args(&docs)
        .into_iter()
        .map(|a| {
            if a.starts_with("--snapshot-dir=") {
                format!("--snapshot-dir={}", snapshots.display())
            } else {
                a
            }
        })
        .chain(uncommented)
        .collect();
    let output = Command::new(env!("CARGO_BIN_EXE_thunder-server"))
        .arg("--check-config")
        .args(&args)
        .env("THUNDER_CURSOR_SECRET", "manifest-test-secret")
        .env("THUNDER_ADMIN_TOKEN", "manifest-test-token")
        .env("THUNDER_KAFKA_SASL_PASSWORD", "manifest-test-password")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run thunder-server --check-config");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}\n{stdout}\n{stderr}"
    );
    assert!(stderr.is_empty(), "{stderr}");
    assert!(
        stdout.lines().any(|l| l
            .split_whitespace()
            .take(2)
            .eq(["--kafka-security-protocol", "sasl_ssl"])),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_probes_pass_with_mtls_on_and_a_client_without_a_certificate_is_counted() {
    let docs = manifests();
    let probes = http_probes(&docs);
    let pki = thunder_testbed::pki::new_pki();
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = thunder_testbed::pki::write(dir.path(), "server.pem", &pki.server.0);
    let key = thunder_testbed::pki::write(dir.path(), "server.key", &pki.server.1);
    let ca = thunder_testbed::pki::write(dir.path(), "ca.pem", &pki.ca_pem);
    let log = dir.path().join("server.log");
    let (cert, key, ca) = (
        cert.display().to_string(),
        key.display().to_string(),
        ca.display().to_string(),
    );
    let server = ServerProcess::start_logged(
        &[
            "--demo-scale",
            "1000",
            "--demo-events-per-sec",
            "0",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &ca,
        ],
        thunder_testbed::PATIENCE,
        &log,
    );
    // Each probe as the kubelet sends it: GET path on the admin port, 200 wanted.
    for (which, path) in &probes {
        let until = Instant::now() + thunder_testbed::PATIENCE;
        loop {
            let response = thunder_testbed::http_get(server.admin, path).await;
            if response.status == 200 {
                break;
            }
            assert!(
                Instant::now() < until,
                "{which} GET {path}: {}",
                response.status
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // A TLS client without a certificate, and a plaintext one, are refused and counted.
    let url = format!("https://localhost:{}", server.grpc.port());
    let without_cert = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&pki.ca_pem))
        .domain_name("localhost");
    let refused = async |endpoint: tonic::transport::Endpoint| {
        let Ok(channel) = endpoint.connect().await else {
            return true;
        };
        let mut client =
            thunder_proto::in_network_posts_service_client::InNetworkPostsServiceClient::new(
                channel,
            );
        client
            .get_in_network_posts(thunder_testbed::request(&[1]))
            .await
            .is_err()
    };
    let tls = tonic::transport::Endpoint::from_shared(url)
        .expect("url")
        .timeout(thunder_testbed::PATIENCE)
        .tls_config(without_cert)
        .expect("TLS config");
    assert!(refused(tls).await, "served without a client certificate");
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .expect("url")
        .timeout(thunder_testbed::PATIENCE);
    assert!(refused(plain).await, "served over plaintext");

    let failures = |text: &str, reason: &str| {
        thunder_testbed::metrics::in_text(
            text,
            "grpc_tls_handshake_failures_total",
            &[("reason", reason)],
        )
        .unwrap_or(0.0)
    };
    let counted = thunder_testbed::eventually(|| async {
        let text = thunder_testbed::http_get(server.admin, "/metrics")
            .await
            .text();
        failures(&text, "no_client_certificate") >= 1.0 && failures(&text, "not_tls") >= 1.0
    })
    .await;
    let scrape = thunder_testbed::http_get(server.admin, "/metrics")
        .await
        .text();
    assert!(
        counted,
        "{}",
        scrape
            .lines()
            .filter(|l| l.contains("tls_handshake"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let logged = thunder_testbed::eventually(|| async {
        std::fs::read_to_string(&log).is_ok_and(|text| {
            text.contains("TLS handshake failed on the gRPC port")
                && text.contains("no_client_certificate")
        })
    })
    .await;
    assert!(
        logged,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn check_config_accepts_the_manifest_args() {
    let docs = manifests();
    let snapshots = tempfile::tempdir().expect("tempdir");
    // The manifest's own arguments, with the snapshot directory moved to a scratch one (the
    // volume's path does not exist here).
    let args: Vec<String> = container_args(&docs)
        .into_iter()
        .map(|a| {
            if a.starts_with("--snapshot-dir=") {
                format!("--snapshot-dir={}", snapshots.path().display())
            } else {
                a
            }
        })
        .collect();
    let output = check_config(&args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("configuration OK"), "{stdout}");
    assert!(stdout.contains("kafka-0.kafka:9092"), "{stdout}");
    assert!(stdout.contains("mode: Kafka ingestion"), "{stdout}");
    assert!(
        !stdout.contains("manifest-test-secret") && !stdout.contains("manifest-test-token"),
        "secret shown: {stdout}"
    );
    // Nothing to warn about in the shipped configuration.
    assert!(stderr.is_empty(), "{stderr}");
    // Nothing was served and nothing was left in the snapshot directory.
    assert_eq!(std::fs::read_dir(snapshots.path()).expect("dir").count(), 0);
}

/// The command, `THUNDER_ADMIN_TOKEN=... thunder-server --check-config --admin-addr
/// 0.0.0.0:8080`, for every secret flag at once (each flag clap marks as hiding its value),
/// given once through its environment variable and once on the command line: no output of
/// the process holds any of them.
#[test]
fn check_config_prints_no_secret_of_any_flag() {
    use clap::CommandFactory as _;
    let command = thunder_server::Args::command();
    let secrets: Vec<(String, String)> = command
        .get_arguments()
        .filter(|arg| arg.is_hide_env_values_set())
        .map(|arg| {
            let env = arg.get_env().expect("a THUNDER_* variable");
            (
                arg.get_long().expect("a long flag").to_owned(),
                env.to_string_lossy().into_owned(),
            )
        })
        .collect();
    assert!(secrets.len() >= 4, "{secrets:?}");
    let marker = |flag: &str| format!("s3cr3t-of-{flag}");
    let run = |through_env: bool| {
        let mut check = Command::new(env!("CARGO_BIN_EXE_thunder-server"));
        check
            .args(["--check-config", "--admin-addr", "0.0.0.0:8080"])
            .args(["--kafka-brokers", "127.0.0.1:9"])
            .env("RUST_LOG", "warn");
        for (flag, variable) in &secrets {
            if through_env {
                check.env(variable, marker(flag));
            } else {
                check
                    .env_remove(variable)
                    .arg(format!("--{flag}={}", marker(flag)));
            }
        }
        check.output().expect("run thunder-server --check-config")
    };
    for through_env in [true, false] {
        let output = run(through_env);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
        for (flag, variable) in &secrets {
            assert!(
                !stdout.contains(&marker(flag)) && !stderr.contains(&marker(flag)),
                "--{flag} shown:\n{stdout}\n{stderr}"
            );
            let line = stdout
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("--{flag} ")))
                .unwrap_or_else(|| panic!("--{flag} not listed:\n{stdout}"));
            let source = if through_env {
                variable.as_str()
            } else {
                "command line"
            };
            assert!(
                line.contains("<redacted>") && line.contains(source),
                "{line}"
            );
        }
    }
}

#[test]
fn check_config_refuses_bad_values_with_exit_code_2() {
    // A value clap cannot parse.
    let output = check_config(&["--qps-limit=many".to_owned()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--qps-limit"));
    // A value clap parses but the server refuses.
    let output = check_config(&["--qps-limit=0".to_owned()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("configuration invalid")
            && stderr.contains("--qps-limit must be greater than 0"),
        "{stderr}"
    );
    // A librdkafka property librdkafka does not know, and a key that is not the certificate's.
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, cert.cert.pem()).expect("write cert");
    std::fs::write(&key_path, other.signing_key.serialize_pem()).expect("write key");
    let output = check_config(&[
        "--kafka-brokers=127.0.0.1:9".to_owned(),
        "-X".to_owned(),
        "fetch.wait.max.ms=soon".to_owned(),
        format!("--tls-cert={}", cert_path.display()),
        format!("--tls-key={}", key_path.display()),
        format!("--tls-client-ca={}", cert_path.display()),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("fetch.wait.max.ms"), "{stderr}");
    assert!(stderr.contains("does not fit --tls-cert"), "{stderr}");
    // The matching key passes.
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).expect("write key");
    let output = check_config(&[
        format!("--tls-cert={}", cert_path.display()),
        format!("--tls-key={}", key_path.display()),
        format!("--tls-client-ca={}", cert_path.display()),
    ]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn dockerfile_builds_with_the_release_script_of_existing_binaries() {
    let dockerfile =
        std::fs::read_to_string(root().join("deploy/Dockerfile")).expect("deploy/Dockerfile");
    assert!(dockerfile.contains("RUN deploy/build-release.sh "));
    assert!(dockerfile.contains("\nUSER 10001"), "non-root");
    // .git is not in the build context: the commit comes in as a build argument.
    assert!(
        dockerfile.contains("ENV THUNDER_GIT_SHA=${GIT_SHA}"),
        "the image's binaries name their commit"
    );
    assert!(
        dockerfile.matches("\nFROM ").count() + usize::from(dockerfile.starts_with("FROM ")) >= 2
    );

    let script = root().join("deploy/build-release.sh");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("bash -n");
    assert!(
        syntax.status.success(),
        "{}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    let text = std::fs::read_to_string(&script).expect("read the script");
    let binaries: Vec<&str> = text
        .lines()
        .find_map(|l| l.strip_prefix("BINARIES=("))
        .and_then(|l| l.strip_suffix(')'))
        .expect("a BINARIES=(...) line")
        .split_whitespace()
        .collect();
    assert!(!binaries.is_empty());
    // The workspace's binary targets, as cargo sees them.
    let metadata = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata");
    assert!(metadata.status.success());
    let metadata: Value = serde_json::from_slice(&metadata.stdout).expect("metadata JSON");
    let bins: Vec<&str> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["name"] == "thunder-server" || p["name"] == "thunder-cli")
        .flat_map(|p| p["targets"].as_array().expect("targets"))
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    for binary in &binaries {
        assert!(
            bins.contains(binary),
            "{binary} is not a binary of thunder-server or thunder-cli: {bins:?}"
        );
        assert!(
            dockerfile.contains(&format!("/out/{binary}")),
            "the image does not copy {binary}"
        );
    }
    for expected in ["thunder-server", "thunder-cli"] {
        assert!(binaries.contains(&expected), "{expected} not built");
    }
}

/// Prometheus' name for a Kubernetes label in discovery meta labels: `[^a-zA-Z0-9_]` -> `_`.
fn sanitized(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[test]
fn the_pod_monitor_and_the_scrape_job_find_the_admin_ports_as_job_thunder() {
    let docs = manifests();
    let args = container_args(&docs);
    let pod_labels = of_kind(&docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("pod labels")
        .clone();
    let admin_port: u64 = flag(&args, "--admin-addr")
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("admin port");
    let ports = server_container(&docs)["ports"]
        .as_array()
        .expect("ports")
        .clone();
    let port_number = |name: &str| {
        ports
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
    };

    // The operator's PodMonitor.
    let monitor = &yaml_documents(&root().join("deploy/prometheus-operator/podmonitor.yaml"))[0];
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["kind"], "PodMonitor");
    let spec = &monitor["spec"];
    for (key, value) in spec["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(pod_labels.get(key), Some(value), "selector {key}");
    }
    let job_label = spec["jobLabel"].as_str().expect("jobLabel");
    assert_eq!(pod_labels[job_label], "thunder", "the rules' job");
    let endpoints = spec["podMetricsEndpoints"].as_array().expect("endpoints");
    assert_eq!(endpoints.len(), 1);
    let port_name = endpoints[0]["port"].as_str().expect("port name");
    assert_eq!(port_number(port_name), Some(admin_port), "{port_name}");
    assert_eq!(endpoints[0]["path"], "/metrics");

    // The scrape job for a Prometheus configured by hand: pod discovery, kept to the same pods
    // and port, job from the same label.
    let scrape = &yaml_documents(&root().join("deploy/prometheus/scrape.yml"))[0];
    let job = &scrape["scrape_configs"][0];
    assert_eq!(job["kubernetes_sd_configs"][0]["role"], "pod");
    let relabels = job["relabel_configs"].as_array().expect("relabel_configs");
    let source = |rule: &Value| rule["source_labels"][0].as_str().unwrap_or("").to_owned();
    let mut kept_labels = 0;
    let mut kept_port = false;
    for rule in relabels.iter().filter(|r| r["action"] == "keep") {
        let alternatives: Vec<&str> = rule["regex"].as_str().expect("regex").split('|').collect();
        let source = source(rule);
        if let Some(label) = source.strip_prefix("__meta_kubernetes_pod_label_") {
            let (_, value) = pod_labels
                .iter()
                .find(|(name, _)| sanitized(name) == label)
                .unwrap_or_else(|| panic!("keeps pods by {label}, which the pods lack"));
            assert!(alternatives.contains(&value.as_str().expect("label value")));
            kept_labels += 1;
        } else if source == "__meta_kubernetes_pod_container_port_name" {
            assert_eq!(
                alternatives,
                [port_name],
                "the admin port, as the PodMonitor's"
            );
            kept_port = true;
        } else {
            panic!("an unexpected keep rule: {rule}");
        }
    }
    assert!(kept_labels > 0 && kept_port, "{relabels:?}");
    let job_rule = relabels
        .iter()
        .find(|r| r["target_label"] == "job")
        .expect("a relabel to job");
    assert_eq!(
        source(job_rule),
        format!("__meta_kubernetes_pod_label_{}", sanitized(job_label)),
        "job from the PodMonitor's jobLabel"
    );
}
