//! The `download-artifacts` phase: fills the version directory `opt/nodeward/node/<version>`
//! with the version's artifacts, each verified by its pinned sha256, and marks it complete.
//!
//! # Expected flow
//! 1. `<vdir>/.complete` exists: the version is in place, nothing to do.
//! 2. Create `<vdir>`, `<vdir>/bin`, `<vdir>/libexec/cni`.
//! 3. Each artifact: a `binary` is fetched to `<vdir>/<dest>` (0755), a `tarball` is fetched
//!    and extracted into `<vdir>/<dest>`, all in one `download.fetch-all`, so they download,
//!    verify and unpack at once (tarballs first: a binary inside a tarball's directory waits
//!    for it). An artifact without a sha256 (only possible in a plan whose config does not
//!    pin it) is skipped with a warning.
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
use nodeward::host::download::{self, ArchiveFetch, FetchRequest, FileFetch};
use nodeward::host::fs;
use nodeward_node_config::input::{Artifact, ArtifactKind};
use nodeward_node_config::layout::{self, Layout};

nodeward_guest_common::phase_helpers!();

const DIR_MODE: u32 = 0o755;
const BIN_MODE: u32 = 0o755;

/// The request that places one artifact in `vdir`.
fn request(vdir: &str, a: &Artifact, sha256: &str) -> FetchRequest {
    match &a.kind {
        ArtifactKind::Binary { dest } => FetchRequest::File(FileFetch {
            url: a.url.clone(),
            sha256: sha256.to_string(),
            dest: format!("{vdir}/{dest}"),
            mode: BIN_MODE,
        }),
        ArtifactKind::Tarball { dest, strip } => FetchRequest::Archive(ArchiveFetch {
            url: a.url.clone(),
            sha256: sha256.to_string(),
            dest_dir: format!("{vdir}/{dest}"),
            strip_components: *strip,
        }),
    }
}

/// Places the pinned artifacts at once (`download.fetch-all`), tarballs first: a binary that
/// goes into a tarball's directory (`bin/kubelet` into `bin`) waits for that tarball only,
/// and the rest overlap. Returns which were fetched, in the order given; the first failure
/// (in that order) names its artifact and URL.
fn place_all(vdir: &str, pinned: &[(&Artifact, &str)]) -> Result<Vec<String>, String> {
    if pinned.is_empty() {
        return Ok(Vec::new());
    }
    let mut order: Vec<usize> = (0..pinned.len()).collect();
    order.sort_by_key(|&i| !matches!(pinned[i].0.kind, ArtifactKind::Tarball { .. }));
    let requests: Vec<FetchRequest> = order
        .iter()
        .map(|&i| request(vdir, pinned[i].0, pinned[i].1))
        .collect();
    let results = download::fetch_all(&requests).map_err(|e| {
        let text = describe(e);
        // The host names a refused request by its position: name its artifact and URL.
        let refused = (1..=order.len()).find_map(|n| {
            let tag = format!("request {n}: ");
            text.contains(&tag)
                .then(|| (pinned[order[n - 1]].0, text.replacen(&tag, "", 1)))
        });
        match refused {
            Some((a, rest)) => format!("downloading {} from {}: {rest}", a.name, a.url),
            None => {
                let names: Vec<&str> = order.iter().map(|&i| pinned[i].0.name.as_str()).collect();
                format!("downloading {}: {text}", names.join(", "))
            }
        }
    })?;
    let mut touched_at = vec![false; pinned.len()];
    for (&i, result) in order.iter().zip(results) {
        let a = pinned[i].0;
        let outcome = result
            .map_err(|e| format!("downloading {} from {}: {}", a.name, a.url, describe(e)))?;
        if touched(outcome) {
            info(&format!(
                "artifact {} {} from {}",
                a.name,
                verb(outcome),
                a.url
            ));
            touched_at[i] = true;
        }
    }
    Ok(pinned
        .iter()
        .zip(touched_at)
        .filter(|(_, t)| *t)
        .map(|((a, _), _)| a.name.clone())
        .collect())
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
        let mut pinned = Vec::new();
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
            pinned.push((a, sha256));
        }
        let fetched = place_all(&vdir, &pinned)?;
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
