//! Test guest: a stand-in for the `configure` phase whose kubelet config the kubelet refuses
//! (`tests/daemon/gate.rs`: a bundle roll-out whose phases all succeed but whose node then
//! fails the health gate, and is rolled back).
//!
//! Built for the production world `configure` (fs, log) and run under the real `configure`
//! phase's grants: it writes one file that phase owns, the kubelet's config
//! ([`KUBELET_CONFIG`]), as a `KubeletConfiguration` whose `maxPods` is a quoted string, the
//! kind of mistake a template makes. The kubelet cannot decode it: it exits at start, systemd
//! starts it again and again, and its health endpoint never answers. Every other file stays as
//! the real phase wrote it, and the phase itself succeeds, reporting the kubelet config
//! changed, as a `configure` with that mistake would.

wit_bindgen::generate!({ world: "configure", path: "../../../wit" });

use exports::nodeward::host::phase::{Guest, Report};
use nodeward::host::fs;
use nodeward::host::log;
use nodeward::host::types::Outcome;

/// The kubelet's config file, as the real phase writes it (`layout::KUBELET_CONFIG`).
const KUBELET_CONFIG: &str = "var/lib/kubelet/config.yaml";

/// What it writes there: a config the kubelet refuses to decode (`maxPods` is an int32).
const REFUSED: &str = "# written by the test stand-in for configure (tests/guests/bad-kubelet-config): \
the kubelet refuses it\n\
apiVersion: kubelet.config.k8s.io/v1beta1\n\
kind: KubeletConfiguration\n\
maxPods: \"one hundred and ten\"\n";

struct BadKubeletConfig;

impl Guest for BadKubeletConfig {
    fn run(_input: String) -> Result<Report, String> {
        let outcome = fs::write_file(KUBELET_CONFIG, REFUSED.as_bytes(), 0o644)
            .map_err(|e| format!("writing {KUBELET_CONFIG}: {e:?}"))?;
        let changed = !matches!(outcome, Outcome::Unchanged);
        log::log(
            log::Level::Info,
            &format!("{KUBELET_CONFIG} written with a maxPods the kubelet refuses"),
        );
        Ok(Report {
            summary: "kubelet config written (refused by the kubelet: a test stand-in)".into(),
            changed: if changed {
                vec!["kubelet-config".into()]
            } else {
                Vec::new()
            },
        })
    }
}

export!(BadKubeletConfig);
