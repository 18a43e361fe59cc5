//! The `install` phase: makes a downloaded version the active one.
//!
//! # Expected flow
//! 1. `<vdir>/.complete` must exist (`download-artifacts` writes it last).
//! 2. `opt/nodeward/node/current` is pointed at the version (a relative link, target = the
//!    version name). `fs.symlink` replaces an existing link by rename(2) of a new one, so a
//!    reader sees the old or the new version, never neither. When it changed, the report
//!    says `binaries`: the units must restart on the new binaries.
//! 3. `opt/cni/bin` is a link to `../nodeward/node/current/libexec/cni`, so CNI plugins follow
//!    `current` without being touched. An empty directory there (from an older setup-host)
//!    is replaced; a directory with entries is refused (preflight refuses it first).
//! 4. With `prune`: every other version directory is removed (after an upgrade, once the new
//!    version is healthy). `current` was just pointed at `version`, so the active version is
//!    never pruned.

wit_bindgen::generate!({ world: "install", path: "../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::fs;
use nodeward_node_config::layout::{self, Layout};

nodeward_guest_common::phase_helpers!();

fn cni_link() -> Result<bool, String> {
    let path = layout::CNI_BIN_DIR;
    let st = fs::stat(path).map_err(|e| format!("stat {path}: {}", describe(e)))?;
    if let Some(st) = st
        && st.kind == fs::FileKind::Directory
    {
        fs::remove(path).map_err(|e| {
            format!(
                "{path} is a directory nodeward did not create and cannot replace with its link ({}); move it away",
                describe(e)
            )
        })?;
    }
    let o = fs::symlink(layout::CNI_BIN_LINK_TARGET, path)
        .map_err(|e| format!("linking {path}: {}", describe(e)))?;
    if touched(o) {
        info(&format!(
            "{path} -> {} {}",
            layout::CNI_BIN_LINK_TARGET,
            verb(o)
        ));
    }
    Ok(touched(o))
}

/// Removes every version directory but `keep`; returns the names removed.
fn prune(keep: &str) -> Result<Vec<String>, String> {
    let dir = layout::NODE_DIR;
    let entries = fs::list_dir(dir).map_err(|e| format!("list {dir}: {}", describe(e)))?;
    let current = layout::CURRENT_LINK.rsplit('/').next().unwrap_or("current");
    let mut removed = Vec::new();
    for e in entries {
        if e.name == keep || e.name == current || e.kind != fs::FileKind::Directory {
            continue;
        }
        let path = format!("{dir}/{}", e.name);
        let o = fs::remove_all(&path).map_err(|e| format!("pruning {path}: {}", describe(e)))?;
        if touched(o) {
            info(&format!("old version {} removed", e.name));
            removed.push(e.name);
        }
    }
    Ok(removed)
}

struct Install;

impl Guest for Install {
    fn run(input: String) -> Result<Report, String> {
        let input = nodeward_guest_common::parse_input(&input)?;
        let version = input.version.as_str();
        nodeward_guest_common::check_version_name(version)?;
        let marker = format!(
            "{}/{}",
            Layout::version_dir(version),
            layout::VERSION_COMPLETE_MARKER
        );
        if fs::stat(&marker)
            .map_err(|e| format!("stat {marker}: {}", describe(e)))?
            .is_none()
        {
            return Err(format!(
                "version {version} is not fully downloaded ({marker} is missing); run download-artifacts first"
            ));
        }

        let mut changed = Vec::new();
        let mut phrases = Vec::new();
        let o = fs::symlink(version, layout::CURRENT_LINK)
            .map_err(|e| format!("linking {}: {}", layout::CURRENT_LINK, describe(e)))?;
        if touched(o) {
            info(&format!(
                "{} -> {version} {}",
                layout::CURRENT_LINK,
                verb(o)
            ));
            changed.push("binaries".to_string());
            phrases.push(format!("current -> {version}"));
        }
        if cni_link()? {
            changed.push("cni-link".to_string());
            phrases.push(format!("{} linked", layout::CNI_BIN_DIR));
        }
        if input.prune {
            let removed = prune(version)?;
            if !removed.is_empty() {
                changed.push("pruned".to_string());
                phrases.push(format!("removed {}", removed.join(", ")));
            }
        }
        let summary = if phrases.is_empty() {
            format!("version {version} already active")
        } else {
            phrases.join("; ")
        };
        Ok(Report { summary, changed })
    }
}

export!(Install);
