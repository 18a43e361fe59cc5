//! The `configure` phase: containerd, kubelet and CNI configuration and the cluster CA,
//! rendered from the node config and written atomically.
//!
//! Files only: restarting what changed is `start-node`'s job, which is why the report names
//! each group that changed. The directories come from `setup-host`; this phase creates none,
//! so its grants can stay exact file paths. Every path written *into* a file is absolute on
//! the real host (`input.layout.abs`), so a node beneath a test root points at its own files.
//!
//! The bootstrap kubeconfig is not this phase's: the host renders it from the node config
//! (server, CA, token) before this phase runs and gives it only the path
//! (`input.bootstrapKubeconfig`, granted as the `bootstrap-kubeconfig` input part), which the
//! kubelet's flags name. This phase never writes it, so it never decides where the token goes.
//!
//! # Version awareness
//! - containerd 1.x reads config `version = 2` (CRI plugin `io.containerd.grpc.v1.cri`),
//!   2.x reads `version = 3` (`io.containerd.cri.v1.*`); other majors are refused.
//! - The kubelet below 1.24 needs `--container-runtime=remote`; below 1.27 the runtime
//!   endpoint is a flag, from 1.27 the `containerRuntimeEndpoint` config field.

wit_bindgen::generate!({ world: "configure", path: "../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::types::Error;
use nodeward::host::{fs, log};
use nodeward_guest_common::{check_plain_path, major_minor};
use nodeward_node_config::layout::{self, Layout};
use nodeward_node_config::{NodeConfig, defaults, merge};
use serde_json::{Value, json};

nodeward_guest_common::phase_helpers!();

const HEADER: &str = "# managed by nodeward (configure); local edits are overwritten\n";

/// One file this phase owns. `group` is the report tag a later phase restarts on.
struct File {
    path: &'static str,
    mode: u32,
    group: &'static str,
    contents: String,
}

/// The Kubernetes `major.minor` of the kubelet.
fn kube_version(c: &NodeConfig) -> Result<(u32, u32), String> {
    let v = &c.cluster.kubernetes_version;
    major_minor(v).ok_or_else(|| format!("cluster.kubernetesVersion {v:?} has no major.minor"))
}

/// containerd's config as a tree, per containerd major version: systemd cgroups for runc (to
/// match the kubelet's cgroupDriver), the sandbox image, the CNI paths, and root, state and
/// socket beneath the host root.
fn containerd_tree(c: &NodeConfig, l: &Layout) -> Result<Value, String> {
    let v = &c.components.containerd;
    let common = json!({
        "root": l.abs(layout::CONTAINERD_ROOT),
        "state": l.abs(layout::CONTAINERD_STATE),
        "grpc": { "address": l.abs(layout::CONTAINERD_SOCKET) },
    });
    let runc = json!({
        "runtime_type": "io.containerd.runc.v2",
        // runc's state beneath the root too (its default is /run/containerd/runc).
        "options": { "SystemdCgroup": true, "Root": l.abs("run/containerd/runc") },
    });
    let mut tree = match major_minor(v) {
        Some((1, _)) => json!({
            "version": 2,
            "plugins": {
                "io.containerd.internal.v1.opt": { "path": l.abs(layout::CONTAINERD_OPT) },
                "io.containerd.grpc.v1.cri": {
                    // Pod network namespaces beneath containerd's state (not /run/netns), so
                    // a reset finds and unmounts them there.
                    "netns_mounts_under_state_dir": true,
                    "sandbox_image": c.components.sandbox_image,
                    "containerd": {
                        "default_runtime_name": "runc",
                        "runtimes": { "runc": runc },
                    },
                    "cni": {
                        "bin_dir": l.abs(layout::CNI_BIN_DIR),
                        "conf_dir": l.abs(layout::CNI_CONF_DIR),
                    },
                },
            },
        }),
        // `bin_dirs` because `bin_dir` is deprecated from containerd 2.1; the sandbox image is
        // pinned so it is never garbage collected.
        Some((2, _)) => json!({
            "version": 3,
            "plugins": {
                "io.containerd.internal.v1.opt": { "path": l.abs(layout::CONTAINERD_OPT) },
                "io.containerd.cri.v1.images": {
                    "pinned_images": { "sandbox": c.components.sandbox_image },
                },
                "io.containerd.cri.v1.runtime": {
                    "netns_mounts_under_state_dir": true,
                    "containerd": {
                        "default_runtime_name": "runc",
                        "runtimes": { "runc": runc },
                    },
                    "cni": {
                        "bin_dirs": [l.abs(layout::CNI_BIN_DIR)],
                        "conf_dir": l.abs(layout::CNI_CONF_DIR),
                    },
                },
            },
        }),
        _ => {
            return Err(format!(
                "components.containerd {v:?}: nodeward renders configuration for containerd 1.x and 2.x only"
            ));
        }
    };
    merge(&mut tree, &common);
    Ok(tree)
}

/// containerd's `config.toml`: the rendered tree with `containerd.config` merged over it.
fn containerd_config(c: &NodeConfig, l: &Layout) -> Result<String, String> {
    let mut tree = containerd_tree(c, l)?;
    let patch = Value::Object(c.containerd.config.clone().into_iter().collect());
    merge(&mut tree, &patch);
    let table = toml::Table::try_from(&tree).map_err(|e| {
        format!("containerd.config: the merged configuration is not TOML (null values?): {e}")
    })?;
    let body = toml::to_string(&table)
        .map_err(|e| format!("containerd.config: cannot write TOML: {e}"))?;
    Ok(format!("{HEADER}{body}"))
}

/// The kubelet's own settings. Anonymous access is off; the API server's client certificate
/// is checked against the cluster CA, and everything else goes through webhook authn/authz.
/// The node status is computed every `kubelet.nodeStatusUpdateFrequency` (1 s by default, not
/// the kubelet's 10 s: a kubelet that registers its node before the runtime check is in has
/// its Ready one interval later) and posted on change or every 5 minutes: the report
/// frequency is always written, since a kubelet given only the update frequency posts at
/// that frequency too. `kubelet.config` is merged over it.
fn kubelet_config(c: &NodeConfig, l: &Layout) -> Result<String, String> {
    let mut v = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "systemd",
        "clusterDNS": [c.cluster.cluster_dns],
        "clusterDomain": c.cluster.cluster_domain,
        "maxPods": c.kubelet.max_pods,
        "staticPodPath": l.abs(layout::MANIFESTS_DIR),
        "authentication": {
            "anonymous": { "enabled": false },
            "webhook": { "enabled": true },
            "x509": { "clientCAFile": l.abs(layout::CA_CERT) },
        },
        "authorization": { "mode": "Webhook" },
        "rotateCertificates": true,
        "serverTLSBootstrap": false,
        "failSwapOn": true,
        "nodeStatusUpdateFrequency": c.kubelet.node_status_update_frequency,
        "nodeStatusReportFrequency": defaults::NODE_STATUS_REPORT_FREQUENCY,
    });
    if kube_version(c)? >= (1, 27) {
        v["containerRuntimeEndpoint"] =
            json!(format!("unix://{}", l.abs(layout::CONTAINERD_SOCKET)));
    }
    merge(
        &mut v,
        &Value::Object(c.kubelet.config.clone().into_iter().collect()),
    );
    let body = serde_yaml_ng::to_string(&v)
        .map_err(|e| format!("kubelet.config: cannot write YAML: {e}"))?;
    Ok(format!("{HEADER}{body}"))
}

/// The kubelet's command line, as the words of `$KUBELET_ARGS`; `bootstrap_kubeconfig` is the
/// host-rendered file's absolute path.
fn kubelet_flags(
    c: &NodeConfig,
    l: &Layout,
    bootstrap_kubeconfig: &str,
) -> Result<Vec<String>, String> {
    let mut args = vec![
        format!("--config={}", l.abs(layout::KUBELET_CONFIG)),
        format!("--bootstrap-kubeconfig={bootstrap_kubeconfig}"),
        format!("--kubeconfig={}", l.abs(layout::KUBELET_KUBECONFIG)),
        format!("--root-dir={}", l.abs(layout::KUBELET_DIR)),
        format!("--cert-dir={}", l.abs(layout::KUBELET_PKI)),
        format!("--hostname-override={}", c.machine_name),
    ];
    // A BTreeMap: sorted by key, so the file (and its outcome) is stable.
    let labels: Vec<String> = c
        .kubelet
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !labels.is_empty() {
        args.push(format!("--node-labels={}", labels.join(",")));
    }
    let taints: Vec<String> = c
        .kubelet
        .register_with_taints
        .iter()
        .map(|t| match t.value.as_str() {
            "" => format!("{}:{}", t.key, t.effect),
            v => format!("{}={v}:{}", t.key, t.effect),
        })
        .collect();
    if !taints.is_empty() {
        args.push(format!("--register-with-taints={}", taints.join(",")));
    }
    let version = kube_version(c)?;
    if version < (1, 24) {
        args.push("--container-runtime=remote".to_string());
    }
    if version < (1, 27) {
        args.push(format!(
            "--container-runtime-endpoint=unix://{}",
            l.abs(layout::CONTAINERD_SOCKET)
        ));
    }
    for (i, f) in c.kubelet.flags.iter().enumerate() {
        // systemd splits `$KUBELET_ARGS` at whitespace and honours no quotes inside it.
        if f.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "kubelet.flags[{i}] contains whitespace or a control character, which $KUBELET_ARGS cannot carry as one word"
            ));
        }
        args.push(f.clone());
    }
    Ok(args)
}

/// `KUBELET_ARGS=...` for the unit's `EnvironmentFile=`. The value is double-quoted, and
/// within it systemd's env-file parser takes `\"`, `\\`, `` \` `` and `\$` literally, so those
/// four are escaped; the words never hold whitespace (checked above).
fn kubelet_flags_env(
    c: &NodeConfig,
    l: &Layout,
    bootstrap_kubeconfig: &str,
) -> Result<String, String> {
    let mut value = String::new();
    for c in kubelet_flags(c, l, bootstrap_kubeconfig)?.join(" ").chars() {
        if "\"\\`$".contains(c) {
            value.push('\\');
        }
        value.push(c);
    }
    Ok(format!("{HEADER}KUBELET_ARGS=\"{value}\"\n"))
}

/// CNI bridge network (cniVersion 0.4.0: Debian's CNI plugins 1.1.1 and containerd 1.6 read
/// it; 1.0.0 needs a newer libcni): pods on the bridge get addresses from the node's pod CIDR,
/// the bridge is their gateway and (with ipMasq) masquerades traffic leaving the node; leases
/// live beneath the root; portmap serves hostPort.
fn cni_conflist(c: &NodeConfig, l: &Layout) -> String {
    let v = json!({
        "cniVersion": "0.4.0",
        "name": "nodeward",
        "plugins": [
            {
                "type": "bridge",
                "bridge": c.network.bridge_name,
                "isGateway": true,
                "ipMasq": c.network.ip_masq,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": c.network.pod_cidr }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": format!("{}/networks", l.abs(layout::CNI_STATE_DIR)),
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    });
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}

/// Every file, in write order. The CA goes before the files that point at it.
fn files(c: &NodeConfig, l: &Layout, bootstrap_kubeconfig: &str) -> Result<Vec<File>, String> {
    check_plain_path(&l.abs(""))?;
    check_plain_path(bootstrap_kubeconfig)?;
    let ca = c
        .ca_cert_pem()
        .map_err(|e| format!("invalid node config: {e}"))?;
    let file = |path, mode, group, contents| File {
        path,
        mode,
        group,
        contents,
    };
    Ok(vec![
        file(
            layout::CONTAINERD_CONFIG,
            0o644,
            "containerd-config",
            containerd_config(c, l)?,
        ),
        file(layout::CA_CERT, 0o644, "kubelet-config", ca),
        file(
            layout::KUBELET_CONFIG,
            0o644,
            "kubelet-config",
            kubelet_config(c, l)?,
        ),
        file(
            layout::KUBELET_FLAGS,
            0o644,
            "kubelet-config",
            kubelet_flags_env(c, l, bootstrap_kubeconfig)?,
        ),
        file(
            layout::CNI_CONFLIST,
            0o644,
            "cni-config",
            cni_conflist(c, l),
        ),
    ])
}

/// Writes one file; the error names the path and never the contents.
fn write(f: &File) -> Result<nodeward::host::types::Outcome, String> {
    fs::write_file(f.path, f.contents.as_bytes(), f.mode).map_err(|e| match e {
        Error::NotFound(m) => format!(
            "writing {}: parent directory missing ({m}); run setup-host first",
            f.path
        ),
        e => format!("writing {}: {}", f.path, describe(e)),
    })
}

const GROUPS: &[(&str, &str)] = &[
    ("containerd-config", "containerd config"),
    ("kubelet-config", "kubelet config"),
    ("cni-config", "cni config"),
];

struct Configure;

impl Guest for Configure {
    fn run(input: String) -> Result<Report, String> {
        let input = nodeward_guest_common::parse_input(&input)?;
        let mut changed: Vec<String> = Vec::new();
        let kubeconfig = input.bootstrap_kubeconfig()?;
        for f in files(input.config()?, &input.layout, kubeconfig)? {
            let o = write(&f)?;
            if touched(o) {
                log::log(log::Level::Info, &format!("{} {}", f.path, verb(o)));
                if !changed.iter().any(|g| g == f.group) {
                    changed.push(f.group.to_string());
                }
            }
        }

        let summary = GROUPS
            .iter()
            .map(|(tag, name)| match changed.iter().any(|g| g == tag) {
                true => format!("{name} written"),
                false => format!("{name} unchanged"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        Ok(Report { summary, changed })
    }
}

export!(Configure);
