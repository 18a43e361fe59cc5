//! Grants: what a phase's bundle manifest allows it to do, beyond what its WIT world imports.
//!
//! # Background
//! A WIT world says which capabilities a phase may call at all; its grants say on what. Every
//! capability call is checked against them before it touches the host, and a refusal is a typed
//! `denied` error plus an audit record.
//!
//! # Guarantees
//! - Deny by default: [`Grants::default`] allows nothing, and every list starts empty.
//! - Grants are validated when the manifest is loaded ([`Grants::validate`]): a malformed path
//!   prefix, unit pattern or URL prefix refuses the bundle, so a typo cannot widen a grant.
//! - Path prefixes match whole components; URL prefixes must name at least scheme, host and
//!   the start of a path (`https://host/`), so `https://dl.k8s.io` cannot match
//!   `https://dl.k8s.io.evil.example/`. Scheme, host and port are compared as parsed, the
//!   path (with query) as a prefix; `*` as the whole host (`https://*/`) or the whole port
//!   (`http://127.0.0.1:*/`) matches any, and nothing else is a wildcard.
//! - `download.pinned-artifacts` admits exactly the (URL, sha256) pairs the host resolved from
//!   the node config for this run, so the phase chooses neither the server nor any byte of
//!   the URL; it is checked in `caps/download.rs`, where the run's artifacts are known.
//! - `secrets.<name>` lists exact files (each also under `fs.write`) into which the host
//!   substitutes the secret for its reference; nothing else ever receives a secret.
//! - `input` lists the parts of the phase input the phase receives; nothing else is filled in.
//! - `network.bridges` names bridges exactly or by a prefix, never `lo`, a host uplink or
//!   (as a name or a pattern that could match one) another tool's bridge (`network.rs`); `network.node-bridge` admits exactly the bridge the host took from the
//!   node's applied config for the run. `cgroups.remove` lists cgroup paths relative to each
//!   hierarchy, never in systemd's own top-level cgroups (`cgroups.rs`).
//! - No grant covers a path reserved to the agent ([`crate::reserved`]); `phases install`
//!   refuses a bundle with an entry inside one ([`Grants::reserved_entries`]).

use crate::hostpath::HostPath;
use nodeward_node_config::input::InputPart;
use serde::{Deserialize, Serialize};

mod cgroups;
mod network;
pub use cgroups::{CgroupPath, CgroupsGrant, invalid_cgroup_entry};
pub use network::{IFNAME_MAX, NetworkGrant, invalid_bridge_entry, is_link_name, is_uplink_name};

/// Everything one phase is allowed, per capability. Serialized as the manifest's
/// `[phases.grants]` table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Grants {
    /// Parts of the phase input the phase receives (`schemaVersion` always); see
    /// `docs/bundle-format.md`. Empty: every field at its default.
    pub input: Vec<InputPart>,
    /// `fs` interface.
    pub fs: FsGrant,
    /// `kernel` interface.
    pub kernel: KernelGrant,
    /// `systemd` interface.
    pub systemd: SystemdGrant,
    /// `mounts` interface.
    pub mounts: MountsGrant,
    /// `download` interface.
    pub download: DownloadGrant,
    /// `network` interface.
    pub network: NetworkGrant,
    /// `cgroups` interface.
    pub cgroups: CgroupsGrant,
    /// Files the host writes secrets into (on `fs.write-file` of the secret's reference).
    pub secrets: SecretsGrant,
}

/// Per secret, the exact files a phase may have the host write it into. A table with one
/// field per secret the agent knows, so a misspelt secret name refuses the bundle.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct SecretsGrant {
    /// Files that may receive the bootstrap token (`nodeward-secret:bootstrap-token`).
    pub bootstrap_token: Vec<String>,
}

impl SecretsGrant {
    /// The files granted for the secret named `name` (see `nodeward_node_config::secret`).
    pub fn files(&self, name: &str) -> &[String] {
        match name {
            nodeward_node_config::secret::BOOTSTRAP_TOKEN => &self.bootstrap_token,
            _ => &[],
        }
    }
}

/// Host path prefixes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FsGrant {
    /// Prefixes the phase may read, list and stat.
    pub read: Vec<String>,
    /// Prefixes the phase may create, replace and remove (and read).
    pub write: Vec<String>,
}

/// Kernel modules, sysctl keys, swap.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct KernelGrant {
    /// Module names the phase may load.
    pub modules: Vec<String>,
    /// Sysctl keys, exact or ending in `*` (prefix glob), the phase may read and set.
    pub sysctls: Vec<String>,
    /// Whether the phase may turn swap off.
    pub swap_off: bool,
}

/// Unit name patterns (exact or `*` globs) per verb.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct SystemdGrant {
    /// write-unit, write-drop-in, remove-unit.
    pub write: Vec<String>,
    /// enable, disable.
    pub enable: Vec<String>,
    /// start, stop, restart, reset-failed.
    pub start: Vec<String>,
    /// mask, unmask.
    pub mask: Vec<String>,
    /// status.
    pub status: Vec<String>,
    /// daemon-reload.
    pub reload: bool,
}

/// Mount target prefixes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MountsGrant {
    /// Host path prefixes where the phase may mount and unmount.
    pub targets: Vec<String>,
}

/// URL prefixes, or the run's pinned artifacts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct DownloadGrant {
    /// URL prefixes the phase may download from (every redirect is checked too). The phase
    /// chooses the rest of the URL, so it can put data into it: give this only to phases that
    /// hold nothing worth sending.
    pub urls: Vec<String>,
    /// Whether the phase may download exactly the artifacts the host resolved from the node
    /// config for this run: a (URL, sha256) pair equal to one of them, nothing else.
    pub pinned_artifacts: bool,
}

/// The systemd verbs grants are given per.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitVerb {
    /// write-unit, write-drop-in, remove-unit.
    Write,
    /// enable, disable.
    Enable,
    /// start, stop, restart, reset-failed.
    Start,
    /// mask, unmask.
    Mask,
    /// status.
    Status,
}

impl UnitVerb {
    /// The verb's name in the manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            UnitVerb::Write => "write",
            UnitVerb::Enable => "enable",
            UnitVerb::Start => "start",
            UnitVerb::Mask => "mask",
            UnitVerb::Status => "status",
        }
    }
}

/// A grant entry that does not parse; names the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid grant {field} entry {entry:?}: {reason}")]
pub struct InvalidGrant {
    /// Where in the grants table, e.g. `fs.write`.
    pub field: String,
    /// The entry.
    pub entry: String,
    /// Why it is refused.
    pub reason: String,
}

impl Grants {
    /// Checks every entry's shape. Called when a manifest is loaded.
    pub fn validate(&self) -> Result<(), InvalidGrant> {
        let err = |field: &str, entry: &str, reason: String| InvalidGrant {
            field: field.into(),
            entry: entry.into(),
            reason,
        };
        for (field, list) in [
            ("fs.read", &self.fs.read),
            ("fs.write", &self.fs.write),
            ("mounts.targets", &self.mounts.targets),
            ("secrets.bootstrap-token", &self.secrets.bootstrap_token),
        ] {
            for p in list {
                HostPath::parse(p).map_err(|e| err(field, p, e.reason.to_string()))?;
            }
        }
        for m in &self.kernel.modules {
            if !is_module_name(m) {
                return Err(err(
                    "kernel.modules",
                    m,
                    "letters, digits, '_' and '-' only".into(),
                ));
            }
        }
        for k in &self.kernel.sysctls {
            let key = k.strip_suffix('*').unwrap_or(k);
            if key.is_empty() || !is_sysctl_key(key.trim_end_matches('.')) {
                return Err(err(
                    "kernel.sysctls",
                    k,
                    "dotted sysctl key, optionally ending in *".into(),
                ));
            }
        }
        for (verb, list) in self.systemd.verbs() {
            for pattern in list {
                glob::Pattern::new(pattern).map_err(|e| {
                    err(
                        &format!("systemd.{}", verb.as_str()),
                        pattern,
                        e.to_string(),
                    )
                })?;
                if pattern.contains('/') || pattern.is_empty() {
                    return Err(err(
                        &format!("systemd.{}", verb.as_str()),
                        pattern,
                        "unit name pattern without '/'".into(),
                    ));
                }
            }
        }
        for b in &self.network.bridges {
            if let Some(reason) = invalid_bridge_entry(b) {
                return Err(err("network.bridges", b, reason));
            }
        }
        for c in &self.cgroups.remove {
            if let Some(reason) = invalid_cgroup_entry(c) {
                return Err(err("cgroups.remove", c, reason));
            }
        }
        for u in &self.download.urls {
            url_prefix(u).map_err(|reason| err("download.urls", u, reason))?;
        }
        for f in &self.secrets.bootstrap_token {
            let field = "secrets.bootstrap-token";
            let p = HostPath::parse(f).map_err(|e| err(field, f, e.reason.to_string()))?;
            if !self.may_write(&p) {
                return Err(err(
                    field,
                    f,
                    "must also be covered by the phase's fs.write grant".into(),
                ));
            }
        }
        Ok(())
    }

    /// The entries that lie inside a path, or name a unit, reserved to the agent
    /// ([`crate::reserved`]): no call can ever use them. `phases install` refuses a bundle that
    /// has any; a bundle installed before a path was reserved still loads (they are denied at
    /// each call), so an agent upgrade does not strand a node on its installed bundle.
    pub fn reserved_entries(&self) -> Vec<InvalidGrant> {
        let mut found = Vec::new();
        for (field, list) in [
            ("fs.read", &self.fs.read),
            ("fs.write", &self.fs.write),
            ("mounts.targets", &self.mounts.targets),
            ("secrets.bootstrap-token", &self.secrets.bootstrap_token),
        ] {
            for p in list {
                let reserved = HostPath::parse(p)
                    .ok()
                    .and_then(|path| crate::reserved::grant_entry_reserved(&path));
                if let Some(r) = reserved {
                    found.push(InvalidGrant {
                        field: field.into(),
                        entry: p.clone(),
                        reason: format!("lies in {r}, which is reserved to the agent"),
                    });
                }
            }
        }
        for (verb, list) in self.systemd.verbs() {
            for unit in list.iter().filter(|u| crate::reserved::is_reserved_unit(u)) {
                found.push(InvalidGrant {
                    field: format!("systemd.{}", verb.as_str()),
                    entry: unit.clone(),
                    reason: "names a unit reserved to the agent".into(),
                });
            }
        }
        found
    }

    /// Whether the host may write the secret `name` into `path` for this phase: `path` is one
    /// of the files the `secrets` grant lists for it (exactly, not as a prefix).
    pub fn may_receive_secret(&self, name: &str, path: &HostPath) -> bool {
        self.secrets
            .files(name)
            .iter()
            .filter_map(|f| HostPath::parse(f).ok())
            .any(|f| &f == path)
    }

    /// Whether `path` may be read (a write grant implies read).
    pub fn may_read(&self, path: &HostPath) -> bool {
        covered(&self.fs.read, path) || covered(&self.fs.write, path)
    }

    /// Whether `path` may be created, replaced or removed.
    pub fn may_write(&self, path: &HostPath) -> bool {
        covered(&self.fs.write, path)
    }

    /// Whether `target` may be mounted on or unmounted.
    pub fn may_mount(&self, target: &HostPath) -> bool {
        covered(&self.mounts.targets, target)
    }

    /// Whether module `name` may be loaded.
    pub fn may_load_module(&self, name: &str) -> bool {
        self.kernel.modules.iter().any(|m| m == name)
    }

    /// Whether sysctl `key` may be read and set.
    pub fn may_sysctl(&self, key: &str) -> bool {
        self.kernel
            .sysctls
            .iter()
            .any(|g| match g.strip_suffix('*') {
                Some(prefix) => key.starts_with(prefix),
                None => g == key,
            })
    }

    /// Whether `verb` is granted on `unit`.
    pub fn may_unit(&self, verb: UnitVerb, unit: &str) -> bool {
        let list = match verb {
            UnitVerb::Write => &self.systemd.write,
            UnitVerb::Enable => &self.systemd.enable,
            UnitVerb::Start => &self.systemd.start,
            UnitVerb::Mask => &self.systemd.mask,
            UnitVerb::Status => &self.systemd.status,
        };
        list.iter()
            .any(|p| glob::Pattern::new(p).is_ok_and(|p| p.matches(unit)))
    }

    /// Whether `url` (already parsed and normalized) may be downloaded. A URL carrying
    /// credentials never matches.
    pub fn may_download(&self, url: &url::Url) -> bool {
        url.username().is_empty()
            && url.password().is_none()
            && self
                .download
                .urls
                .iter()
                .any(|g| url_prefix(g).is_ok_and(|g| g.matches(url)))
    }
}

impl SystemdGrant {
    fn verbs(&self) -> [(UnitVerb, &Vec<String>); 5] {
        [
            (UnitVerb::Write, &self.write),
            (UnitVerb::Enable, &self.enable),
            (UnitVerb::Start, &self.start),
            (UnitVerb::Mask, &self.mask),
            (UnitVerb::Status, &self.status),
        ]
    }
}

fn covered(prefixes: &[String], path: &HostPath) -> bool {
    prefixes
        .iter()
        .filter_map(|p| HostPath::parse(p).ok())
        .any(|p| path.starts_with(&p))
}

/// A parsed `download.urls` entry: `scheme://host[:port]/path-prefix`, where the whole host
/// may be `*` (any host) and the port may be `*` (any port, the scheme's default included).
#[derive(Debug)]
struct UrlPrefix {
    scheme: String,
    /// `None`: any host.
    host: Option<String>,
    /// `None`: any port; else the port, the scheme's default filled in.
    port: Option<u16>,
    /// Path (and query) prefix, normalized by the URL parser; at least `/`.
    path: String,
}

impl UrlPrefix {
    fn matches(&self, url: &url::Url) -> bool {
        url.scheme() == self.scheme
            && self
                .host
                .as_deref()
                .is_none_or(|h| url.host_str() == Some(h))
            && self
                .port
                .is_none_or(|p| url.port_or_known_default() == Some(p))
            && url[url::Position::BeforePath..].starts_with(&self.path)
    }
}

/// Host standing in for `*` while the rest of a grant is parsed; `.invalid` never resolves.
const ANY_HOST: &str = "any-host.nodeward.invalid";

/// Parses a URL grant; it must be http(s), without credentials, with a path (at least `/`).
/// `*` is allowed only as the whole host or the whole port.
fn url_prefix(s: &str) -> Result<UrlPrefix, String> {
    let (scheme, rest) = s
        .split_once("://")
        .ok_or_else(|| "must look like scheme://host/path".to_string())?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (mut authority, tail) = rest.split_at(end);
    if authority.contains('@') {
        return Err("must not carry credentials".into());
    }
    let any_port = authority.ends_with(":*");
    if any_port {
        authority = &authority[..authority.len() - 2];
    }
    let any_host = authority == "*" || authority.starts_with("*:");
    let authority = if any_host {
        format!("{ANY_HOST}{}", &authority[1..])
    } else {
        authority.to_string()
    };
    if authority.contains('*') {
        return Err("'*' may only be the whole host or the whole port".into());
    }
    let u = url::Url::parse(&format!("{scheme}://{authority}{tail}")).map_err(|e| e.to_string())?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err("scheme must be http or https".into());
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("must not carry credentials".into());
    }
    let Some(host) = u.host_str().filter(|h| !h.is_empty()) else {
        return Err("has no host".into());
    };
    // Url normalizes `https://host` to `https://host/`, so the host is always closed off.
    Ok(UrlPrefix {
        scheme: u.scheme().to_string(),
        host: (!any_host).then(|| host.to_string()),
        port: if any_port {
            None
        } else {
            u.port_or_known_default()
        },
        path: u[url::Position::BeforePath..].to_string(),
    })
}

/// A kernel module name: letters, digits, `_`, `-`.
pub fn is_module_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A dotted sysctl key with non-empty parts of `[A-Za-z0-9_-]`.
pub fn is_sysctl_key(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

#[cfg(test)]
mod tests;
