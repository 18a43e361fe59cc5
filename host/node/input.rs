//! The phase input: what every phase of a none-mode run is given (the config, the layout, the
//! version directory, the architecture and the pinned artifacts), built in one place for the
//! command line's single-phase runs and for the pipeline's steps.
//!
//! # Guarantees
//! - The artifacts are always derived from the config (its `downloads` overrides applied), and
//!   the version directory from those artifacts, so a phase never sees one without the other.
//! - A run that applies `download-artifacts` has every artifact pinned, or is refused before
//!   anything runs.

use crate::node::version::{self, Unpinned};
use crate::plan::RunMode;
use nodeward_node_config::NodeConfig;
use nodeward_node_config::input::PhaseInput;
use nodeward_node_config::layout::Layout;
use std::path::Path;

/// The layout phases render paths with: the host root as an absolute path (canonical when it
/// can be resolved, as given otherwise) and the unit directory relative to it.
pub fn layout(root: &Path, unit_dir: &str) -> Layout {
    let abs = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    Layout {
        root: abs.display().to_string(),
        unit_dir: unit_dir.trim_matches('/').to_string(),
    }
}

/// The version directory `config` installs on this host's architecture.
pub fn version_of(config: &NodeConfig) -> String {
    let arch = version::arch();
    version::version_name(config, arch, &version::artifacts(config, arch))
}

/// The phase input for `config` on the version directory `version` (empty for a reset, which
/// removes every version).
pub fn phase_input(config: &NodeConfig, layout: &Layout, version: &str) -> PhaseInput {
    let arch = version::arch();
    PhaseInput {
        layout: layout.clone(),
        version: version.to_string(),
        arch: arch.to_string(),
        artifacts: version::artifacts(config, arch),
        ..PhaseInput::new(config.clone())
    }
}

/// The input of single phases run by name (`plan`/`apply --phase`): `config` on its own
/// version directory. Applying `download-artifacts` needs every artifact pinned, as a
/// bootstrap does; `config_source` names the config in that refusal.
pub fn for_phases(
    config: &NodeConfig,
    layout: &Layout,
    mode: RunMode,
    phases: &[String],
    config_source: &str,
) -> Result<PhaseInput, Unpinned> {
    let input = phase_input(config, layout, &version_of(config));
    if mode == RunMode::Apply && phases.iter().any(|p| p == "download-artifacts") {
        version::require_pinned(&input.artifacts, config_source)?;
    }
    Ok(input)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        crate::config::load(None).expect("embedded config")
    }

    fn pinned(mut c: NodeConfig) -> NodeConfig {
        for a in version::artifacts(&c.clone(), version::arch()) {
            c.downloads.insert(
                a.name.clone(),
                nodeward_node_config::DownloadOverride {
                    url: format!("http://127.0.0.1:1/{}", a.name),
                    sha256: "a".repeat(64),
                },
            );
        }
        c
    }

    #[test]
    fn layout_is_absolute_and_canonical_with_a_relative_unit_dir() {
        let tmp = tempfile::tempdir().expect("tmp");
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let l = layout(&link, "/etc/systemd/system/");
        let canonical = std::fs::canonicalize(&real).expect("canonical");
        assert_eq!(l.root, canonical.display().to_string());
        assert_eq!(l.unit_dir, "etc/systemd/system");
        // A root that does not resolve is kept as given.
        let missing = tmp.path().join("missing");
        assert_eq!(layout(&missing, "x").root, missing.display().to_string());
    }

    #[test]
    fn the_input_carries_the_config_its_artifacts_and_its_version() {
        let c = config();
        let l = layout(Path::new("/"), "etc/systemd/system");
        let input = phase_input(&c, &l, "v1");
        assert_eq!(input.version, "v1");
        assert_eq!(input.arch, version::arch());
        assert_eq!(input.layout, l);
        assert_eq!(input.artifacts, version::artifacts(&c, version::arch()));
        assert_eq!(
            input.config.as_ref().map(|i| i.machine_name.as_str()),
            Some(c.machine_name.as_str())
        );
        assert!(!input.prune && input.restart.is_empty() && input.mounts.is_empty());

        let single = for_phases(&c, &l, RunMode::Plan, &[], "node.yaml").expect("input");
        assert_eq!(single.version, version_of(&c));
        assert_eq!(single.artifacts, input.artifacts);
    }

    #[test]
    fn only_applying_download_artifacts_needs_pinned_artifacts() {
        let c = config();
        let l = layout(Path::new("/"), "u");
        let download = ["download-artifacts".to_string()];
        let other = ["install".to_string()];
        for (mode, phases, refused) in [
            (RunMode::Apply, &download[..], true),
            (RunMode::Apply, &other[..], false),
            (RunMode::Apply, &[][..], false),
            (RunMode::Plan, &download[..], false),
        ] {
            let r = for_phases(&c, &l, mode, phases, "node.yaml");
            assert_eq!(r.is_err(), refused, "{mode:?} {phases:?}");
            if let Err(e) = r {
                assert_eq!(e.config_source, "node.yaml");
            }
        }
        for_phases(&pinned(c), &l, RunMode::Apply, &download, "node.yaml").expect("pinned");
    }
}
