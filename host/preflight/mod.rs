//! Preflight checks: whether this host is fit to become a node, read without changing anything,
//! the way `kubeadm join` checks a worker before it joins (`nodeward preflight`, and the first
//! step of `bootstrap` and `upgrade`).
//!
//! # Background
//! The `preflight` phase (a WebAssembly guest with narrow grants) refuses a host that runs its
//! own `kubelet.service` or `containerd.service`, or has an `opt/cni/bin` of its own. That is
//! the bundle's policy and stays so. These host checks add what a phase cannot see through its
//! capabilities and what an operator needs to read before changing a host: the privileges, swap,
//! kernel modules and sysctls, cgroups, ports, other container runtimes, files another
//! installation left, disk space, the clock, and the API server with its CA. Each has a stable
//! name (kubeadm's where kubeadm has the check) that `--ignore-preflight-errors` takes.
//!
//! # Guarantees
//! - Read-only: no file, unit or kernel setting changes; the only I/O beyond reads beneath the
//!   root is one bounded TCP connect and one bounded HTTPS GET to the configured API server.
//! - Every host file is read beneath `--root` without following any symlink
//!   ([`read::Host`]); a link where a file or directory was expected fails the check naming it.
//!   The one link read through is procfs's own `proc/net -> self/net`, as `proc/<pid>/net`.
//! - Each check ends `pass`, `warning`, `fail` or `skip`, with a message naming the file,
//!   unit, port or URL at fault. Only a `fail` stops a command, and only when not ignored.
//!
//! # Assumptions
//! What `setup-host` fixes by itself (a module not loaded yet, a sysctl not set yet, swap on)
//! is a `warning`, not a `fail`: the checks run before `setup-host`, and a fresh host is
//! expected to need it. What nodeward cannot fix (a module the kernel cannot load, a port held
//! by another program, another containerd on nodeward's socket) is a `fail`.
//!
//! # Caveats
//! With a `--root` other than `/`, the kernel's files (`proc`, `sys`) are read beneath that
//! root, as the `kernel` capability does: a test root without them gets `skip`, not `pass`.

use crate::caps::RunContext;
use nodeward_node_config::NodeConfig;
use serde::Serialize;
use std::cell::OnceCell;
use std::collections::BTreeSet;

mod apiserver;
mod files;
mod kernel;
mod ports;
mod read;
mod runtime;

/// How one check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The host is as a node needs it.
    Pass,
    /// Worth knowing, never stops a command (often: `setup-host` will fix it).
    Warning,
    /// The host is not fit: stops `bootstrap`/`upgrade` unless ignored.
    Fail,
    /// Could not be checked here (e.g. a root without `proc`, systemd unreachable).
    Skip,
}

/// A check's verdict and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// Why, naming the file, unit, port or URL.
    pub message: String,
}

impl Outcome {
    fn pass(message: impl Into<String>) -> Outcome {
        Outcome {
            status: Status::Pass,
            message: message.into(),
        }
    }
    fn warn(message: impl Into<String>) -> Outcome {
        Outcome {
            status: Status::Warning,
            message: message.into(),
        }
    }
    fn fail(message: impl Into<String>) -> Outcome {
        Outcome {
            status: Status::Fail,
            message: message.into(),
        }
    }
    fn skip(message: impl Into<String>) -> Outcome {
        Outcome {
            status: Status::Skip,
            message: message.into(),
        }
    }
}

/// One check's result as `nodeward preflight` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    /// The check's stable name (what `--ignore-preflight-errors` takes).
    pub name: String,
    /// How it ended.
    pub status: Status,
    /// Why.
    pub message: String,
    /// A `fail` named by `--ignore-preflight-errors` (or `all`): shown, but does not stop.
    pub ignored: bool,
}

/// What the checks look at.
pub struct Context<'a> {
    /// The run: its root (read without following links) and its systemd connection.
    pub session: &'a RunContext,
    /// The node config: kubelet and containerd settings, the API server and its CA.
    pub config: &'a NodeConfig,
    /// Whether a node of nodeward's is installed here already (an install record or the
    /// `current` link): then its kubelet's ports, its containerd's socket and the files
    /// `configure` wrote are its own, not another installation's.
    pub own_node: bool,
    /// The API server's answer, asked once for the three checks that read it.
    api: OnceCell<apiserver::Probe>,
}

impl<'a> Context<'a> {
    /// The checks' view of a host.
    pub fn new(session: &'a RunContext, config: &'a NodeConfig, own_node: bool) -> Self {
        Context {
            session,
            config,
            own_node,
            api: OnceCell::new(),
        }
    }

    fn host(&self) -> read::Host<'_> {
        read::Host::new(self.session)
    }

    fn api(&self) -> &apiserver::Probe {
        self.api.get_or_init(|| apiserver::probe(self.config))
    }
}

/// One check: a stable name and what it does.
struct Check {
    name: String,
    run: Box<dyn Fn(&Context<'_>) -> Outcome>,
}

impl Check {
    fn new(name: impl Into<String>, run: impl Fn(&Context<'_>) -> Outcome + 'static) -> Check {
        Check {
            name: name.into(),
            run: Box::new(run),
        }
    }
}

/// Every check for `config`, in the order they run and print. Names with a value in them
/// (`Port-10250`, `KernelModule-overlay`) come from the config and the shipped phases, as
/// kubeadm's do.
fn checks(config: &NodeConfig) -> Vec<Check> {
    let mut all = vec![runtime::privileged()];
    all.extend(kernel::checks());
    all.extend(ports::checks(config));
    all.extend(runtime::checks());
    all.extend(files::checks());
    all.extend(apiserver::checks());
    all
}

/// The names of every check for `config`, in run order: what `--ignore-preflight-errors`
/// accepts (besides `all`).
pub fn names(config: &NodeConfig) -> Vec<String> {
    checks(config).into_iter().map(|c| c.name).collect()
}

/// The checks whose failures do not stop a command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ignore {
    all: bool,
    /// Lowercase names.
    names: BTreeSet<String>,
}

/// An `--ignore-preflight-errors` value that names no check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IgnoreError {
    /// A name that is not a check. kubeadm ignores these; here a typo is refused, since the
    /// operator meant some check and would otherwise learn only from the next failure (or
    /// never) that it was not the one let through.
    #[error("--ignore-preflight-errors: no check is named {name:?}; the checks: {valid}, or all")]
    Unknown {
        /// What was given.
        name: String,
        /// Every check's name, comma-separated.
        valid: String,
    },
    /// `all` together with names, as kubeadm refuses it.
    #[error("--ignore-preflight-errors: `all` ignores every check; give it alone")]
    AllWithNames,
}

impl Ignore {
    /// Ignores nothing.
    pub fn none() -> Ignore {
        Ignore::default()
    }

    /// Parses `--ignore-preflight-errors` values (already split at commas) against the checks
    /// of `config`: names match case-insensitively, as kubeadm's do; `all` ignores every
    /// check; an empty value is no name; anything else is [`IgnoreError::Unknown`].
    pub fn parse(values: &[String], config: &NodeConfig) -> Result<Ignore, IgnoreError> {
        let valid = names(config);
        let known: BTreeSet<String> = valid.iter().map(|n| n.to_lowercase()).collect();
        let mut ignore = Ignore::default();
        for v in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
            let lower = v.to_lowercase();
            if lower == "all" {
                ignore.all = true;
            } else if known.contains(&lower) {
                ignore.names.insert(lower);
            } else {
                return Err(IgnoreError::Unknown {
                    name: v.chars().take(100).collect(),
                    valid: valid.join(", "),
                });
            }
        }
        if ignore.all && !ignore.names.is_empty() {
            return Err(IgnoreError::AllWithNames);
        }
        Ok(ignore)
    }

    fn covers(&self, name: &str) -> bool {
        self.all || self.names.contains(&name.to_lowercase())
    }
}

/// Every check's result, in run order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The results.
    pub checks: Vec<CheckResult>,
}

/// A report with failures nobody ignored: the command stops before changing anything.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "preflight: {} check(s) failed: {}; fix the host, or pass --ignore-preflight-errors={} to go on anyway",
    .failed.len(),
    .failed.iter().map(|(n, m)| format!("{n}: {m}")).collect::<Vec<_>>().join("; "),
    .failed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(",")
)]
pub struct Refused {
    /// Each failed check's name and message.
    pub failed: Vec<(String, String)>,
}

impl Report {
    /// The failures that stop a command (not ignored).
    pub fn blocking(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks
            .iter()
            .filter(|c| c.status == Status::Fail && !c.ignored)
    }

    /// Whether no failure stops a command.
    pub fn passed(&self) -> bool {
        self.blocking().next().is_none()
    }

    /// How many checks ended `status` (ignored failures counted apart when `ignored`).
    pub fn count(&self, status: Status, ignored: bool) -> usize {
        self.checks
            .iter()
            .filter(|c| c.status == status && c.ignored == ignored)
            .count()
    }

    /// One line: `22 checks: 17 passed, 2 warnings, 3 skipped`, with failures and ignored
    /// failures when there are any.
    pub fn summary(&self) -> String {
        let mut parts = vec![format!("{} passed", self.count(Status::Pass, false))];
        for (n, what) in [
            (self.count(Status::Warning, false), "warning(s)"),
            (self.count(Status::Skip, false), "skipped"),
            (self.count(Status::Fail, false), "FAILED"),
            (self.count(Status::Fail, true), "failed but ignored"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        format!("{} checks: {}", self.checks.len(), parts.join(", "))
    }

    /// `Ok` unless a failure is not ignored; the refusal names each one.
    pub fn into_result(self) -> Result<Report, Refused> {
        let failed: Vec<(String, String)> = self
            .blocking()
            .map(|c| (c.name.clone(), c.message.clone()))
            .collect();
        if failed.is_empty() {
            Ok(self)
        } else {
            Err(Refused { failed })
        }
    }
}

/// Runs every check against `ctx`, marking the failures `ignore` covers.
pub fn run(ctx: &Context<'_>, ignore: &Ignore) -> Report {
    let checks = checks(ctx.config)
        .into_iter()
        .map(|c| {
            let Outcome { status, message } = (c.run)(ctx);
            let ignored = status == Status::Fail && ignore.covers(&c.name);
            CheckResult {
                name: c.name,
                status,
                message: ctx.session.redactor.redact(&message),
                ignored,
            }
        })
        .collect();
    Report { checks }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        crate::config::load(None).expect("the example config")
    }

    #[test]
    fn names_are_unique_and_kubeadm_shaped() {
        let names = names(&config());
        let unique: BTreeSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for want in [
            "IsPrivilegedUser",
            "Swap",
            "KernelModule-br_netfilter",
            "Sysctl-net.ipv4.ip_forward",
            "CgroupDriver",
            "Port-10250",
            "Port-10248",
            "CRISocket",
            "Service-Kubelet",
            "FileAvailable--etc-kubernetes-pki-ca.crt",
            "DiskSpace",
            "APIServerReachable",
            "CACertMatch",
            "ClockSanity",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
    }

    #[test]
    fn ignore_list_matches_names_case_insensitively_and_refuses_unknown_ones() {
        let c = config();
        let i = Ignore::parse(&["swap".into(), "Port-10250".into(), "".into()], &c)
            .expect("known names");
        assert!(i.covers("Swap") && i.covers("port-10250") && !i.covers("CRISocket"));
        assert!(Ignore::parse(&["ALL".into()], &c).expect("all").covers("x"));
        let e = Ignore::parse(&["Swapp".into()], &c).expect_err("a typo");
        let text = e.to_string();
        assert!(
            text.contains("\"Swapp\"") && text.contains("Swap,"),
            "{text}"
        );
        assert_eq!(
            Ignore::parse(&["all".into(), "Swap".into()], &c),
            Err(IgnoreError::AllWithNames)
        );
    }

    #[test]
    fn a_report_refuses_on_unignored_failures_only() {
        let r = |status, ignored| Report {
            checks: vec![CheckResult {
                name: "Swap".into(),
                status,
                message: "m".into(),
                ignored,
            }],
        };
        assert!(r(Status::Warning, false).into_result().is_ok());
        assert!(r(Status::Fail, true).into_result().is_ok());
        let e = r(Status::Fail, false).into_result().expect_err("fails");
        let text = e.to_string();
        assert!(
            text.contains("Swap: m") && text.contains("--ignore-preflight-errors=Swap"),
            "{text}"
        );
        assert_eq!(
            r(Status::Fail, true).summary(),
            "1 checks: 0 passed, 1 failed but ignored"
        );
    }
}
