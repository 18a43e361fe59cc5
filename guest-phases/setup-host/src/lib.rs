//! The `setup-host` phase: the directories a node needs, and the kernel settings a Kubernetes
//! node needs (modules, sysctls, no swap), applied now and persisted for the next boot.
//!
//! Every call is idempotent on the host side, so a second run reports `unchanged` throughout
//! and this phase returns an empty `changed` list. It reads nothing from its input (its bundle
//! grants it no input part) but still parses it, so an input of another schema version fails
//! here rather than in a later phase.

wit_bindgen::generate!({ world: "setup-host", path: "../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::{fs, kernel};
use nodeward_node_config::{defaults, layout};

/// Directories later phases write into. `configure` does not create parents, so every
/// directory it writes a file in is here; `opt/cni` holds the `bin` link `install` makes (the
/// link itself is `install`'s, so `opt/cni/bin` is not created here); `var/lib/cni` is the CNI
/// plugins' state, `etc/kubernetes/manifests` the kubelet's static pod path. The agent's state
/// directory is reserved to the host, which makes it itself. `etc/sysctl.d` and `etc/modules-load.d` are here
/// because the drop-ins below need them and a minimal root may lack them.
const DIRS: &[&str] = &[
    "etc/containerd",
    layout::CNI_CONF_DIR,
    "opt/cni",
    "etc/kubernetes/pki",
    layout::MANIFESTS_DIR,
    layout::KUBELET_DIR,
    layout::NODE_DIR,
    layout::CNI_STATE_DIR,
    "etc/sysctl.d",
    "etc/modules-load.d",
];

const DIR_MODE: u32 = 0o755;
const CONF_MODE: u32 = 0o644;

const SYSCTL_CONF: &str = layout::SYSCTL_CONF;
const MODULES_CONF: &str = layout::MODULES_LOAD;

/// Sysctls the node needs (shared with the host's preflight checks).
const SYSCTLS: &[(&str, &str)] = defaults::SYSCTLS;

nodeward_guest_common::phase_helpers!();

/// `/etc/sysctl.d` drop-in so the sysctls survive a reboot; `set-sysctl` only sets them now.
fn sysctl_conf() -> String {
    let mut s =
        String::from("# managed by nodeward (setup-host): kernel settings for Kubernetes\n");
    for (key, value) in SYSCTLS {
        s.push_str(&format!("{key} = {value}\n"));
    }
    s
}

/// `/etc/modules-load.d` drop-in so the modules load at boot, before sysctl.d is applied:
/// the `net.bridge.*` keys only exist once `br_netfilter` is loaded.
fn modules_conf() -> String {
    let mut s = String::from("# managed by nodeward (setup-host): kernel modules for Kubernetes\n");
    for module in defaults::KERNEL_MODULES {
        s.push_str(module);
        s.push('\n');
    }
    s
}

/// What one run changed: report tags, and a phrase per tag for the summary.
#[derive(Default)]
struct Changes {
    tags: Vec<&'static str>,
    phrases: Vec<String>,
}

impl Changes {
    fn add(&mut self, tag: &'static str, phrase: String) {
        self.tags.push(tag);
        self.phrases.push(phrase);
    }
}

fn create_dirs(changes: &mut Changes) -> Result<(), String> {
    let mut created = 0;
    for dir in DIRS {
        let o = fs::create_dir(dir, DIR_MODE)
            .map_err(|e| format!("create-dir {dir}: {}", describe(e)))?;
        if touched(o) {
            info(&format!("directory {dir} {}", verb(o)));
            created += 1;
        }
    }
    if created > 0 {
        changes.add("directories", format!("{created} directories created"));
    }
    Ok(())
}

fn write_conf(
    path: &str,
    contents: &str,
    tag: &'static str,
    changes: &mut Changes,
) -> Result<(), String> {
    let o = fs::write_file(path, contents.as_bytes(), CONF_MODE)
        .map_err(|e| format!("write {path}: {}", describe(e)))?;
    if touched(o) {
        info(&format!("{path} {}", verb(o)));
        changes.add(tag, format!("{path} {}", verb(o)));
    }
    Ok(())
}

/// Modules first: the bridge sysctls do not exist until `br_netfilter` is loaded.
fn apply_kernel(changes: &mut Changes) -> Result<(), String> {
    let mut done = Vec::new();
    for module in defaults::KERNEL_MODULES {
        let o = kernel::load_module(module)
            .map_err(|e| format!("load module {module}: {}", describe(e)))?;
        if touched(o) {
            info(&format!("kernel module {module} loaded"));
            done.push(format!("module {module} loaded"));
        }
    }
    for (key, value) in SYSCTLS {
        let o = kernel::set_sysctl(key, value)
            .map_err(|e| format!("set sysctl {key}: {}", describe(e)))?;
        if touched(o) {
            info(&format!("sysctl {key} set to {value}"));
            done.push(format!("{key}={value}"));
        }
    }
    // The kubelet refuses to start with swap on (failSwapOn).
    let o = kernel::swap_off().map_err(|e| format!("swap-off: {}", describe(e)))?;
    if touched(o) {
        info("swap turned off");
        done.push("swap off".to_string());
    }
    if !done.is_empty() {
        changes.add("kernel", format!("kernel: {}", done.join(", ")));
    }
    Ok(())
}

struct SetupHost;

impl Guest for SetupHost {
    fn run(input: String) -> Result<Report, String> {
        nodeward_guest_common::parse_input(&input)?;

        let mut changes = Changes::default();
        create_dirs(&mut changes)?;
        write_conf(SYSCTL_CONF, &sysctl_conf(), "sysctl-config", &mut changes)?;
        write_conf(
            MODULES_CONF,
            &modules_conf(),
            "modules-config",
            &mut changes,
        )?;
        apply_kernel(&mut changes)?;

        let summary = if changes.phrases.is_empty() {
            "host already set up, nothing changed".to_string()
        } else {
            changes.phrases.join("; ")
        };
        Ok(Report {
            summary,
            changed: changes.tags.into_iter().map(String::from).collect(),
        })
    }
}

export!(SetupHost);
