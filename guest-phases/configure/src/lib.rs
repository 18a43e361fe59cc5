//! The `configure` phase: containerd, kubelet and CNI configuration, the cluster CA and the
//! bootstrap kubeconfig, rendered from the node config and written atomically.
//!
//! Files only: restarting what changed is a later phase's job, which is why the report names
//! each group that changed. The directories come from `setup-host`; this phase creates none,
//! so its grants can stay exact file paths.

wit_bindgen::generate!({ world: "configure", path: "../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::types::{Error, Outcome};
use nodeward::host::{fs, log};
use nodeward_node_config::NodeConfig;

const CA_CERT: &str = "/etc/kubernetes/pki/ca.crt";
const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
const BOOTSTRAP_KUBECONFIG: &str = "/etc/kubernetes/bootstrap-kubelet.conf";
const KUBELET_BIN: &str = "/opt/nodeward/node/current/bin/kubelet";
const CNI_BIN_DIR: &str = "/opt/cni/bin";
const CNI_CONF_DIR: &str = "/etc/cni/net.d";
const HEADER: &str = "# managed by nodeward (configure); local edits are overwritten\n";

/// One file this phase owns. `group` is the report tag a later phase restarts on.
struct File {
    path: &'static str,
    mode: u32,
    group: &'static str,
    contents: String,
}

/// A string as a quoted scalar: JSON is valid YAML, and serde_json escapes everything needed.
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

/// A TOML basic string. Like JSON, but TOML also forbids a raw DEL, so escape it too.
fn toml_quote(s: &str) -> String {
    quote(s).replace('\u{7f}', "\\u007F")
}

/// One word of a systemd command line. `%` (specifiers) and `$` (variables) are expanded even
/// inside quotes, so they are doubled; anything unusual is double-quoted.
fn systemd_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/_.:=,+@-".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.to_string();
    }
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            c if c.is_control() => {
                let mut buf = [0; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\x{b:02x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// containerd 2.x (config version 3): systemd cgroups for runc, to match the kubelet's
/// cgroupDriver; the pinned sandbox image so it is never garbage collected; the CNI paths.
/// `bin_dirs` because `bin_dir` is deprecated from containerd 2.1.
fn containerd_config(c: &NodeConfig) -> String {
    format!(
        r#"{HEADER}version = 3

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = {sandbox}

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [{bin_dir}]
  conf_dir = {conf_dir}
"#,
        sandbox = toml_quote(&c.components.sandbox_image),
        bin_dir = toml_quote(CNI_BIN_DIR),
        conf_dir = toml_quote(CNI_CONF_DIR),
    )
}

/// The kubelet's own settings. Anonymous access is off; the API server's client certificate
/// is checked against the cluster CA, and everything else goes through webhook authn/authz.
fn kubelet_config(c: &NodeConfig) -> String {
    format!(
        r#"{HEADER}apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
clusterDNS:
  - {dns}
clusterDomain: {domain}
maxPods: {max_pods}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {CA_CERT}
authorization:
  mode: Webhook
rotateCertificates: true
serverTLSBootstrap: false
failSwapOn: true
"#,
        dns = quote(&c.cluster.cluster_dns),
        domain = quote(&c.cluster.cluster_domain),
        max_pods = c.kubelet.max_pods,
    )
}

/// The kubelet's command line. `ExecStart=` empty first clears any packaged command (systemd
/// allows several only for oneshot units); `Environment=` empty drops packaged variables so
/// this drop-in alone decides how the kubelet runs. Flags with an empty list are omitted.
fn kubelet_drop_in(c: &NodeConfig) -> String {
    let mut args = vec![
        KUBELET_BIN.to_string(),
        format!("--config={KUBELET_CONFIG}"),
        format!("--bootstrap-kubeconfig={BOOTSTRAP_KUBECONFIG}"),
        "--kubeconfig=/var/lib/kubelet/kubeconfig".to_string(),
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
    let words: Vec<String> = args.iter().map(|a| systemd_word(a)).collect();
    format!(
        "{HEADER}[Service]\nEnvironment=\nExecStart=\nExecStart={}\n",
        words.join(" \\\n    ")
    )
}

/// Kubeconfig for the kubelet's first request (TLS bootstrap). It holds the bootstrap token,
/// so it is written 0600 and never logged.
fn bootstrap_kubeconfig(c: &NodeConfig) -> String {
    format!(
        r#"{HEADER}apiVersion: v1
kind: Config
clusters:
  - name: kubernetes
    cluster:
      server: {server}
      certificate-authority: {CA_CERT}
users:
  - name: kubelet-bootstrap
    user:
      token: {token}
contexts:
  - name: kubelet-bootstrap@kubernetes
    context:
      cluster: kubernetes
      user: kubelet-bootstrap
current-context: kubelet-bootstrap@kubernetes
"#,
        server = quote(&c.cluster.api_server),
        token = quote(c.kubelet.auth.bootstrap_token.expose()),
    )
}

/// CNI 1.0.0 bridge network: pods on `cni0` get addresses from the node's pod CIDR, the bridge
/// is their gateway and masquerades traffic leaving the node; portmap serves hostPort.
fn cni_conflist(c: &NodeConfig) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "nodeward",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{ "subnet": {subnet} }}]],
        "routes": [{{ "dst": "0.0.0.0/0" }}]
      }}
    }},
    {{
      "type": "portmap",
      "capabilities": {{ "portMappings": true }}
    }}
  ]
}}
"#,
        subnet = quote(&c.network.pod_cidr),
    )
}

/// Every file, in write order. The CA goes before the files that point at it.
fn files(c: &NodeConfig) -> Result<Vec<File>, String> {
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
            "etc/containerd/config.toml",
            0o644,
            "containerd-config",
            containerd_config(c),
        ),
        file("etc/kubernetes/pki/ca.crt", 0o644, "kubelet-config", ca),
        file(
            "etc/kubernetes/bootstrap-kubelet.conf",
            0o600,
            "kubelet-config",
            bootstrap_kubeconfig(c),
        ),
        file(
            "var/lib/kubelet/config.yaml",
            0o644,
            "kubelet-config",
            kubelet_config(c),
        ),
        file(
            "etc/systemd/system/kubelet.service.d/10-nodeward.conf",
            0o644,
            "kubelet-config",
            kubelet_drop_in(c),
        ),
        file(
            "etc/cni/net.d/10-nodeward-bridge.conflist",
            0o644,
            "cni-config",
            cni_conflist(c),
        ),
    ])
}

fn verb(o: Outcome) -> &'static str {
    match o {
        Outcome::Created => "created",
        Outcome::Changed => "changed",
        Outcome::Unchanged => "unchanged",
        Outcome::Removed => "removed",
    }
}

/// Writes one file; the error names the path and never the contents.
fn write(f: &File) -> Result<Outcome, String> {
    fs::write_file(f.path, f.contents.as_bytes(), f.mode).map_err(|e| match e {
        Error::NotFound(m) => format!(
            "writing {}: parent directory missing ({m}); run setup-host first",
            f.path
        ),
        Error::Denied(m) => format!("writing {}: denied: {m}", f.path),
        Error::InvalidArgument(m) => format!("writing {}: invalid argument: {m}", f.path),
        Error::Escape(m) => format!("writing {}: escape: {m}", f.path),
        Error::Io(m) => format!("writing {}: io: {m}", f.path),
        Error::Failed(m) => format!("writing {}: failed: {m}", f.path),
        Error::Timeout(m) => format!("writing {}: timeout: {m}", f.path),
        Error::Unavailable(m) => format!("writing {}: unavailable: {m}", f.path),
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
        let input: nodeward_node_config::input::PhaseInput = serde_json::from_str(&input)
            .map_err(|e| format!("input is not a phase input: {e}"))?;
        let config = input.config;
        config
            .validate()
            .map_err(|e| format!("invalid node config: {e}"))?;

        let mut changed: Vec<String> = Vec::new();
        for f in files(&config)? {
            let o = write(&f)?;
            if !matches!(o, Outcome::Unchanged) {
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
