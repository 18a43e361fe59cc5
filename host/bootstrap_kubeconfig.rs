//! The bootstrap kubeconfig, which the host renders itself.
//!
//! # Background
//! The kubelet's first request, its TLS bootstrap, carries the bootstrap token to the server
//! its bootstrap kubeconfig names. Whoever writes that file decides where the token goes. It
//! used to be the `configure` phase (writing the token's reference, which the host replaced by
//! the token on the way to disk), so a phase granted that file chose the `server` the kubelet
//! sends the token to. Now the host renders the file from the node config alone
//! (`cluster.apiServer`, `cluster.caCertData`, `kubelet.auth.bootstrapToken`) right before a
//! phase whose grants name the `bootstrap-kubeconfig` input part runs, and tells that phase
//! only its path (`PhaseInput::bootstrap_kubeconfig`), for the kubelet's
//! `--bootstrap-kubeconfig`. `crate::session` does this for every run of such a phase: the
//! none-mode pipelines, `restart --phase`, and `plan`/`apply --phase`.
//!
//! # Guarantees
//! - The contents are a function of the node config and the layout only: no phase's output
//!   reaches them, and the default bundle grants no phase a write of the file.
//! - Written 0600 as [`crate::rootfs::RootFs::write_secret_file`] writes: atomically and
//!   durably, never through a link, never changed in place; an identical file is `unchanged`
//!   (a re-run changes nothing), so a changed `cluster.apiServer` or token (an upgrade)
//!   re-renders it. In plan mode the change lists the path, mode and whether the file is
//!   created or replaced, never its contents, size or digest.
//! - When the file changed, the phase's report names [`RESTART_GROUP`], so `start-node`
//!   restarts a running kubelet (one retrying its bootstrap keeps the credentials it read).
//! - The contents are those `configure` wrote before (the header line aside), but for the CA:
//!   one cluster with `server` and the CA's data, one user with the token, one context.
//!
//! - The CA the kubelet checks the server against during its bootstrap is the config's
//!   `cluster.caCertData`, embedded (`certificate-authority-data`, as `kubeadm join` writes it),
//!   not the CA file a phase writes (`layout::CA_CERT`): a phase that wrote another CA there
//!   could otherwise have the token presented to a server of its choosing at that address. The
//!   kubelet copies the embedded CA into the kubeconfig it writes after its bootstrap (so a CA
//!   rotated in the config reaches a bootstrapped kubelet by a re-bootstrap, as with kubeadm).
//!
//! # Caveats
//! - A phase that writes the kubelet's flags or configuration (or `layout::CA_CERT`, its
//!   `clientCAFile`) still steers the kubelet: such grants are root-equivalent and reviewed as
//!   such (`docs/bundle-format.md`).
//! - A bundle built for an earlier agent, whose `configure` writes this file itself through a
//!   `secrets` grant and is not granted the input part, keeps doing so: the host renders the
//!   file only for a phase granted the part (`docs/capabilities.md`).
//! - A reset removes the file with the rest of `etc/kubernetes` (`teardown`).

use crate::caps::{RunContext, describe_error};
use crate::grants::Grants;
use crate::hostpath::HostPath;
use crate::wit::Outcome;
use nodeward_node_config::NodeConfig;
use nodeward_node_config::input::{InputPart, PhaseInput};
use nodeward_node_config::layout::BOOTSTRAP_KUBECONFIG;
use nodeward_node_config::secret::BOOTSTRAP_TOKEN_REF;

/// The writer the change list names for the file (as the node state files do).
pub const WRITER: &str = "nodeward";

/// The restart group (`PhaseInput::restart`) of the kubelet's configuration, which this file
/// belongs to.
pub const RESTART_GROUP: &str = "kubelet-config";

/// The mode of the file: it holds the token.
pub const MODE: u32 = 0o600;

/// The first line of the file: who owns it (the preflight check of another installation's
/// file looks for `# managed by nodeward`).
const HEADER: &str = "# managed by nodeward (agent); local edits are overwritten\n";

/// Why the file could not be rendered or written; names it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The run's input carries no config, or one whose bootstrap token is the phase's
    /// reference or empty (a host bug: the host's input holds the operator's config).
    #[error(
        "{BOOTSTRAP_KUBECONFIG}: the run's node config holds no bootstrap token to render it with"
    )]
    NoToken,
    /// The file could not be written (the message names the path and the cause).
    #[error("{BOOTSTRAP_KUBECONFIG}: {0}")]
    Write(String),
    /// The config's CA is not a PEM certificate (the config's own validation refuses it first;
    /// kept so rendering never embeds what the kubelet could not read).
    #[error("{BOOTSTRAP_KUBECONFIG}: {0}")]
    Ca(#[source] nodeward_node_config::InvalidField),
}

/// Whether the host renders the file before a phase with `grants` runs: the phase is granted
/// the `bootstrap-kubeconfig` input part.
pub fn needed_by(grants: &Grants) -> bool {
    grants.input.contains(&InputPart::BootstrapKubeconfig)
}

/// `s` as a double-quoted YAML scalar (a JSON string is one).
fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// The file's contents for `config`: `cluster.apiServer`, `cluster.caCertData` (its PEM,
/// re-encoded, so the config's line breaks do not matter) and the bootstrap token.
pub fn render(config: &NodeConfig) -> Result<String, Error> {
    use base64::Engine as _;
    let ca_pem = config.ca_cert_pem().map_err(Error::Ca)?;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    let token = config.kubelet.auth.bootstrap_token.expose();
    if token.is_empty() || token == BOOTSTRAP_TOKEN_REF {
        return Err(Error::NoToken);
    }
    Ok(format!(
        r#"{HEADER}apiVersion: v1
kind: Config
clusters:
  - name: kubernetes
    cluster:
      server: {server}
      certificate-authority-data: {ca}
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
        server = quote(&config.cluster.api_server),
        ca = quote(&ca),
        token = quote(token),
    ))
}

/// Renders the file for `config` and writes it beneath `run`'s root (see the
/// module doc); `unchanged` when it already holds exactly that.
pub fn write(run: &RunContext, config: &NodeConfig) -> Result<Outcome, Error> {
    let contents = render(config)?;
    let path = HostPath::parse(BOOTSTRAP_KUBECONFIG).map_err(|e| Error::Write(e.to_string()))?;
    run.files
        .write_secret_file(WRITER, &path, contents.as_bytes(), MODE)
        .map_err(|e| match e {
            crate::wit::Error::NotFound(m) => {
                Error::Write(format!("{m} (setup-host makes it: run it first)"))
            }
            e => Error::Write(describe_error(&e)),
        })
}

/// Writes the file for the run's phase input `input` (its config and layout) and returns
/// `input` with the file's absolute path (what a phase granted the part receives), and what
/// the write did.
pub fn write_for(run: &RunContext, input: &PhaseInput) -> Result<(PhaseInput, Outcome), Error> {
    let config = input.config.as_ref().ok_or(Error::NoToken)?;
    let outcome = write(run, config)?;
    let with_path = PhaseInput {
        bootstrap_kubeconfig: input.layout.abs(BOOTSTRAP_KUBECONFIG),
        ..input.clone()
    };
    Ok((with_path, outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        crate::config::load(None).expect("embedded config")
    }

    #[test]
    fn renders_server_ca_and_token_from_the_config_only() {
        let mut c = config();
        c.cluster.api_server = "https://api.example:6443".into();
        let text = render(&c).expect("rendered");
        assert!(text.starts_with("# managed by nodeward"), "{text}");
        let v: serde_json::Value = serde_yaml_ng::from_str(&text).expect("YAML");
        assert_eq!(v["kind"], "Config");
        assert_eq!(v["current-context"], "kubelet-bootstrap@kubernetes");
        let cluster = &v["clusters"][0]["cluster"];
        assert_eq!(cluster["server"], "https://api.example:6443");
        // The config's CA itself, never the CA file a phase writes.
        assert!(cluster.get("certificate-authority").is_none(), "{text}");
        let ca = cluster["certificate-authority-data"]
            .as_str()
            .expect("CA data");
        use base64::Engine as _;
        let pem = base64::engine::general_purpose::STANDARD
            .decode(ca)
            .expect("base64");
        assert_eq!(String::from_utf8(pem).ok(), c.ca_cert_pem().ok());
        assert_eq!(
            v["users"][0]["user"]["token"],
            c.kubelet.auth.bootstrap_token.expose()
        );
        assert_eq!(v["contexts"][0]["context"]["cluster"], "kubernetes");
        assert_eq!(v["contexts"][0]["context"]["user"], "kubelet-bootstrap");
    }

    #[test]
    fn a_phase_view_of_the_config_renders_nothing() {
        let c = config().with_secret_references();
        assert!(matches!(render(&c), Err(Error::NoToken)));
    }

    #[test]
    fn only_the_input_part_asks_for_it() {
        let mut g = Grants::default();
        assert!(!needed_by(&g));
        g.input = vec![InputPart::Config, InputPart::Layout];
        assert!(!needed_by(&g));
        g.input.push(InputPart::BootstrapKubeconfig);
        assert!(needed_by(&g));
    }
}
