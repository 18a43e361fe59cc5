//! The `download-artifacts` phase: fills the version directory `opt/nodeward/node/<version>`
//! with the version's artifacts, each verified by its pinned sha256, and marks it complete.
//!
//! # Expected flow
//! 1. `<vdir>/.complete` exists: the version is in place, nothing to do.
//! 2. Create `<vdir>`, `<vdir>/bin`, `<vdir>/libexec/cni`.
//! 3. Each artifact: a `binary` is fetched to `<vdir>/<dest>` (0755), a `tarball` is fetched
//!    and extracted into `<vdir>/<dest>`. An artifact without a sha256 (only possible in a
//!    plan whose config does not pin it) is skipped with a warning.
//! 4. Write `<vdir>/.complete` (the version name and a newline). A skipped artifact happens
//!    only in a plan (the host refuses to apply an unpinned config before any phase runs), so
//!    the marker goes into the plan's overlay and the later phases plan against it.
//!
//! # Guarantees
//! The running node is not touched: nothing outside `<vdir>` is written (the `current` link
//! is `install`'s), so an upgrade downloads while the old version keeps running. A run cut
//! short leaves no marker, and the next run fetches only what is missing (each fetch is
//! `unchanged` when its file is in place).

wit_bindgen::generate!({ world: "download-artifacts", path: "../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::{download, fs};
use nodeward_node_config::input::{Artifact, ArtifactKind};
use nodeward_node_config::layout::{self, Layout};

nodeward_guest_common::phase_helpers!();

const DIR_MODE: u32 = 0o755;
const BIN_MODE: u32 = 0o755;

/// Places one artifact; the error names it and its URL.
fn place(vdir: &str, a: &Artifact, sha256: &str) -> Result<bool, String> {
    let fail = |e| format!("downloading {} from {}: {}", a.name, a.url, describe(e));
    let outcome = match &a.kind {
        ArtifactKind::Binary { dest } => {
            download::fetch(&a.url, sha256, &format!("{vdir}/{dest}"), BIN_MODE).map_err(fail)?
        }
        ArtifactKind::Tarball { dest, strip } => {
            download::fetch_and_extract(&a.url, sha256, &format!("{vdir}/{dest}"), *strip)
                .map_err(fail)?
        }
    };
    if touched(outcome) {
        info(&format!(
            "artifact {} {} from {}",
            a.name,
            verb(outcome),
            a.url
        ));
    }
    Ok(touched(outcome))
}

struct DownloadArtifacts;

impl Guest for DownloadArtifacts {
    fn run(input: String) -> Result<Report, String> {
        let input = nodeward_guest_common::parse_input(&input)?;
        let version = input.version.as_str();
        nodeward_guest_common::check_version_name(version)?;
        let vdir = Layout::version_dir(version);
        let marker = format!("{vdir}/{}", layout::VERSION_COMPLETE_MARKER);
        if fs::stat(&marker)
            .map_err(|e| format!("stat {marker}: {}", describe(e)))?
            .is_some()
        {
            return Ok(Report {
                summary: format!("version {version} already installed"),
                changed: Vec::new(),
            });
        }
        let mut changed = false;
        for dir in [
            vdir.clone(),
            format!("{vdir}/bin"),
            format!("{vdir}/libexec/cni"),
        ] {
            let o = fs::create_dir(&dir, DIR_MODE)
                .map_err(|e| format!("create-dir {dir}: {}", describe(e)))?;
            changed |= touched(o);
        }
        let mut fetched = Vec::new();
        let mut skipped = Vec::new();
        for a in &input.artifacts {
            let Some(sha256) = a.sha256.as_deref() else {
                warn(&format!(
                    "artifact {name} has no pinned sha256 (downloads.{name}.sha256); apply refuses it",
                    name = a.name
                ));
                skipped.push(a.name.clone());
                continue;
            };
            if place(&vdir, a, sha256)? {
                fetched.push(a.name.clone());
            }
        }
        let mut summary = format!("version {version}: ");
        if fetched.is_empty() && !skipped.is_empty() {
            summary.push_str("nothing fetched");
        } else if fetched.is_empty() {
            summary.push_str("every artifact already in place");
        } else {
            summary.push_str(&format!("fetched {}", fetched.join(", ")));
        }
        let o = fs::write_file(&marker, format!("{version}\n").as_bytes(), 0o644)
            .map_err(|e| format!("writing {marker}: {}", describe(e)))?;
        changed |= touched(o);
        summary.push_str("; marked complete");
        if !skipped.is_empty() {
            summary.push_str(&format!(
                " (plan only: skipped {}, no sha256 pinned)",
                skipped.join(", ")
            ));
        }
        changed |= !fetched.is_empty();
        Ok(Report {
            summary,
            // Nothing restarts on new artifacts: `install` switching the link does that.
            changed: if changed {
                vec!["artifacts".to_string()]
            } else {
                Vec::new()
            },
        })
    }
}

export!(DownloadArtifacts);
