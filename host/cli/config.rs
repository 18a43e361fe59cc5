//! `nodeward config print-defaults` and `nodeward config validate FILE`: the node config's
//! reference without reading the source, and a check before a config reaches a host.

use super::{Failure, usage};
use std::path::Path;

/// Prints the embedded example config: what every command uses without `--config`.
pub(super) fn print_defaults() -> Result<(), Failure> {
    print!("{}", crate::config::EMBEDDED);
    Ok(())
}

/// Parses FILE with the parser every command uses; prints one line on success.
pub(super) fn validate(file: &Path) -> Result<(), Failure> {
    let config = crate::config::load(Some(file)).map_err(usage)?;
    let mode = match config.mode {
        nodeward_node_config::Mode::None => "none",
        nodeward_node_config::Mode::Nspawn => "nspawn",
    };
    println!(
        "{}: valid: machine {}, mode {mode}, Kubernetes {}, API server {}, {} pinned download(s)",
        file.display(),
        config.machine_name,
        config.cluster.kubernetes_version,
        config.cluster.api_server,
        config.downloads.len()
    );
    Ok(())
}
