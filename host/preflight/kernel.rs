//! Kernel and cgroup checks: swap, the modules and sysctls `setup-host` needs, the cgroup
//! version and the cgroup driver the kubelet and containerd agree on.

use super::read::{Entry, Host};
use super::{Check, Context, Outcome};
use nodeward_node_config::{NodeConfig, defaults};

pub(super) fn checks() -> Vec<Check> {
    let mut all = vec![Check::new("Swap", swap)];
    for module in defaults::KERNEL_MODULES {
        all.push(Check::new(format!("KernelModule-{module}"), move |ctx| {
            kernel_module(&ctx.host(), module)
        }));
    }
    for (key, value) in defaults::SYSCTLS {
        all.push(Check::new(format!("Sysctl-{key}"), move |ctx| {
            sysctl(&ctx.host(), key, value)
        }));
    }
    all.push(Check::new("CgroupVersion", cgroup_version));
    all.push(Check::new("CgroupDriver", cgroup_driver));
    all
}

/// A `kubelet.config` field of the node config, when it is a boolean.
fn kubelet_bool(config: &NodeConfig, field: &str) -> Option<bool> {
    config.kubelet.config.get(field).and_then(|v| v.as_bool())
}

/// The `major.minor` of the configured Kubernetes version.
fn kube_minor(config: &NodeConfig) -> Option<(u32, u32)> {
    let mut parts = config.cluster.kubernetes_version.split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// `proc/swaps`: kubeadm fails a host with swap on unless the kubelet tolerates it; nodeward's
/// `setup-host` turns swap off itself (for this boot), so swap on is a warning.
fn swap(ctx: &Context<'_>) -> Outcome {
    let text = match ctx.host().read("proc/swaps") {
        Ok(Some(t)) => t,
        Ok(None) => return Outcome::skip("proc/swaps not found beneath the root"),
        Err(e) => return Outcome::fail(e),
    };
    let on: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if on.is_empty() {
        return Outcome::pass("no swap (proc/swaps)");
    }
    if kubelet_bool(ctx.config, "failSwapOn") == Some(false) {
        return Outcome::pass(format!(
            "swap on ({}), allowed by kubelet.config failSwapOn: false",
            on.join(", ")
        ));
    }
    Outcome::warn(format!(
        "swap is on ({}, proc/swaps) and the kubelet refuses it (failSwapOn); setup-host turns it off for this boot: also remove it from etc/fstab, or set kubelet.config failSwapOn: false",
        on.join(", ")
    ))
}

/// Whether `module` is loaded or built in, else whether the kernel can load it
/// (`lib/modules/<release>/modules.dep`).
fn kernel_module(host: &Host<'_>, module: &str) -> Outcome {
    let modules = match host.read("proc/modules") {
        Ok(m) => m,
        Err(e) => return Outcome::fail(e),
    };
    if modules.as_deref().is_some_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().next() == Some(module))
    }) {
        return Outcome::pass(format!("{module} is loaded (proc/modules)"));
    }
    let sys = format!("sys/module/{module}");
    match host.entry(&sys) {
        Ok(Entry::Dir) => return Outcome::pass(format!("{module} is loaded or built in ({sys})")),
        Ok(Entry::Missing) => {}
        Ok(_) => return Outcome::fail(format!("{sys} is not a directory")),
        Err(e) => return Outcome::fail(e),
    }
    // br_netfilter built in: its sysctls exist, though it may have no sys/module entry.
    if module == "br_netfilter" && host.entry("proc/sys/net/bridge") == Ok(Entry::Dir) {
        return Outcome::pass("br_netfilter is active (proc/sys/net/bridge exists)");
    }
    if modules.is_none() && host.entry("sys/module") == Ok(Entry::Missing) {
        return Outcome::skip("neither proc/modules nor sys/module beneath the root");
    }
    let release = match host.read("proc/sys/kernel/osrelease") {
        Ok(Some(r)) => r.trim().to_string(),
        Ok(None) => {
            return Outcome::warn(format!(
                "{module} is not loaded; setup-host will load it (proc/sys/kernel/osrelease missing: cannot tell whether the kernel has it)"
            ));
        }
        Err(e) => return Outcome::fail(e),
    };
    let dir = format!("lib/modules/{release}");
    let listed = |file: &str| -> Result<Option<bool>, String> {
        let text = host.read(&format!("{dir}/{file}"))?;
        Ok(text.map(|t| {
            // `kernel/net/bridge/br_netfilter.ko.xz: deps…`; a module's file may spell `_` as `-`.
            t.lines().any(|l| {
                l.split(':')
                    .next()
                    .and_then(|path| path.rsplit('/').next())
                    .and_then(|file| file.split('.').next())
                    .is_some_and(|stem| stem == module || stem == module.replace('_', "-"))
            })
        }))
    };
    match (listed("modules.builtin"), listed("modules.dep")) {
        (Ok(Some(true)), _) => {
            Outcome::pass(format!("{module} is built in ({dir}/modules.builtin)"))
        }
        (_, Ok(Some(true))) => Outcome::warn(format!(
            "{module} is not loaded; setup-host loads it (found in {dir}/modules.dep)"
        )),
        (_, Ok(Some(false))) => Outcome::fail(format!(
            "{module} is not loaded, not built in and not in {dir}/modules.dep: this kernel cannot load it, so setup-host would fail; install the kernel's modules package"
        )),
        (_, Err(e)) => Outcome::fail(e),
        (_, Ok(None)) => Outcome::warn(format!(
            "{module} is not loaded; setup-host will try to load it ({dir}/modules.dep missing: cannot tell whether the kernel has it)"
        )),
    }
}

/// A sysctl `setup-host` sets: already `value` passes; anything else is a warning naming what
/// it is now, since setup-host sets it.
fn sysctl(host: &Host<'_>, key: &str, value: &str) -> Outcome {
    let path = format!("proc/sys/{}", key.replace('.', "/"));
    match host.read(&path) {
        Ok(Some(now)) if now.trim() == value => Outcome::pass(format!("{key} = {value} ({path})")),
        Ok(Some(now)) => Outcome::warn(format!(
            "{key} is {} ({path}); setup-host sets it to {value}",
            now.trim()
        )),
        Ok(None) if host.entry("proc/sys") == Ok(Entry::Missing) => {
            Outcome::skip("proc/sys not found beneath the root")
        }
        Ok(None) if key.starts_with("net.bridge.") => Outcome::warn(format!(
            "{path} does not exist until br_netfilter is loaded; setup-host loads it and sets {key} to {value}"
        )),
        Ok(None) => Outcome::warn(format!(
            "{path} does not exist; setup-host sets {key} to {value}"
        )),
        Err(e) => Outcome::fail(e),
    }
}

/// The cgroup hierarchy: v2 passes; v1 (or hybrid) is refused by the kubelet from 1.35 unless
/// `failCgroupV1: false`, is in maintenance from 1.31 (a warning), and is fine before.
fn cgroup_version(ctx: &Context<'_>) -> Outcome {
    let host = ctx.host();
    match host.read("sys/fs/cgroup/cgroup.controllers") {
        Ok(Some(controllers)) => {
            let have: Vec<&str> = controllers.split_whitespace().collect();
            let missing: Vec<&str> = ["cpu", "memory", "pids"]
                .into_iter()
                .filter(|c| !have.contains(c))
                .collect();
            return if missing.is_empty() {
                Outcome::pass(format!("cgroup v2 (controllers: {})", have.join(" ")))
            } else {
                Outcome::fail(format!(
                    "cgroup v2 without the {} controller(s) the kubelet needs (sys/fs/cgroup/cgroup.controllers)",
                    missing.join(", ")
                ))
            };
        }
        Ok(None) => {}
        Err(e) => return Outcome::fail(e),
    }
    match host.list("sys/fs/cgroup") {
        Ok(Some(entries)) if !entries.is_empty() => {}
        Ok(_) => return Outcome::skip("no cgroup hierarchy beneath the root (sys/fs/cgroup)"),
        Err(e) => return Outcome::fail(e),
    }
    let hybrid = host.entry("sys/fs/cgroup/unified") == Ok(Entry::Dir);
    let what = if hybrid {
        "cgroup v1 (hybrid)"
    } else {
        "cgroup v1"
    };
    let version = &ctx.config.cluster.kubernetes_version;
    match kube_minor(ctx.config) {
        Some(v) if v >= (1, 35) && kubelet_bool(ctx.config, "failCgroupV1") != Some(false) => {
            Outcome::fail(format!(
                "{what}: the kubelet {version} refuses cgroup v1 (failCgroupV1); boot with cgroup v2 (systemd.unified_cgroup_hierarchy=1), or set kubelet.config failCgroupV1: false"
            ))
        }
        Some(v) if v >= (1, 31) => Outcome::warn(format!(
            "{what}: in maintenance mode since Kubernetes 1.31 and refused by default from 1.35; move the host to cgroup v2"
        )),
        _ => Outcome::pass(format!("{what}, supported by the kubelet {version}")),
    }
}

/// Where containerd's runc options are in its config tree, per containerd major version.
fn runc_options_path(containerd: &str) -> [&'static str; 6] {
    let plugin = if containerd.starts_with("1.") {
        "io.containerd.grpc.v1.cri"
    } else {
        "io.containerd.cri.v1.runtime"
    };
    [
        "plugins",
        plugin,
        "containerd",
        "runtimes",
        "runc",
        "options",
    ]
}

/// The kubelet's `cgroupDriver` and containerd's runc `SystemdCgroup` must agree (kubeadm
/// checks the runtime's driver at join); with `systemd`, systemd must be the init.
fn cgroup_driver(ctx: &Context<'_>) -> Outcome {
    let c = ctx.config;
    let driver = c
        .kubelet
        .config
        .get("cgroupDriver")
        .and_then(|v| v.as_str())
        .unwrap_or("systemd");
    let path = runc_options_path(&c.components.containerd);
    let value = path[1..]
        .iter()
        .fold(c.containerd.config.get(path[0]), |at, key| {
            at.and_then(|v| v.get(key))
        })
        .and_then(|v| v.get("SystemdCgroup"));
    let systemd_cgroup = match value {
        None => true,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(other) => {
            return Outcome::fail(format!(
                "containerd.config {}.SystemdCgroup is {other}, not true or false",
                path.join(".")
            ));
        }
    };
    let want = match driver {
        "systemd" => true,
        "cgroupfs" => false,
        other => {
            return Outcome::fail(format!(
                "kubelet.config cgroupDriver is {other:?}: systemd or cgroupfs"
            ));
        }
    };
    if want != systemd_cgroup {
        return Outcome::fail(format!(
            "the kubelet's cgroupDriver is {driver} (kubelet.config) but containerd's runc SystemdCgroup is {systemd_cgroup} (containerd.config {}): set both to the same driver",
            path.join(".")
        ));
    }
    let host = ctx.host();
    if want && host.is_system_root() && host.entry("run/systemd/system") != Ok(Entry::Dir) {
        return Outcome::fail(
            "cgroupDriver systemd, but systemd is not this host's init (no run/systemd/system)",
        );
    }
    Outcome::pass(format!(
        "the kubelet and containerd both use the {driver} cgroup driver"
    ))
}
