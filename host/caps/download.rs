//! `nodeward:host/download`: verified downloads.
//!
//! Grant check: the URL against `download.urls` prefixes, the destination against `fs.write`.
//! Every request names the sha256 the bytes must have. In plan mode a download is recorded with
//! URL, sha256 and destination, and is `unchanged` when the destination already holds bytes
//! with that digest.
//!
//! # Current limitations
//! The HTTP client (streaming, hashing, retries, cache, extraction) is tracked by the "real
//! host capabilities" issue; in apply mode a download that is not already in place returns
//! `unavailable` naming the URL.

use super::bindings::download;
use super::{Error, Outcome, PhaseCtx, denied, host_path};
use crate::hostpath::HostPath;
use crate::plan::{ChangeKind, RunMode};
use serde_json::json;
use sha2::{Digest, Sha256};

impl PhaseCtx {
    fn download_request(
        &self,
        url: &str,
        sha256: &str,
        dest: &str,
    ) -> Result<(url::Url, HostPath), Error> {
        let u = url::Url::parse(url)
            .map_err(|e| Error::InvalidArgument(format!("URL {url:?}: {e}")))?;
        if !matches!(u.scheme(), "http" | "https")
            || !u.username().is_empty()
            || u.password().is_some()
        {
            return Err(Error::InvalidArgument(format!(
                "URL {url:?}: http(s) without credentials only"
            )));
        }
        if !nodeward_node_config::is_sha256(sha256) {
            return Err(Error::InvalidArgument(format!(
                "sha256 {sha256:?}: must be 64 lowercase hex digits"
            )));
        }
        let dest = host_path(dest)?;
        if !self.grants.may_download(&u) {
            return Err(denied(format!("download {u}"), "download.urls"));
        }
        if !self.grants.may_write(&dest) {
            return Err(denied(format!("write {dest}"), "fs.write"));
        }
        Ok((u, dest))
    }

    fn already_fetched(&self, dest: &HostPath, sha256: &str) -> Result<bool, Error> {
        match self.session.read(dest) {
            Ok(bytes) => Ok(hex::encode(Sha256::digest(&bytes)) == sha256),
            Err(Error::NotFound(_)) => Ok(false),
            Err(Error::Io(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl download::Host for PhaseCtx {
    fn fetch(
        &mut self,
        url: String,
        sha256: String,
        dest: String,
        mode: u32,
    ) -> Result<Outcome, Error> {
        let args =
            json!({ "url": url, "sha256": sha256, "dest": dest, "mode": format!("{mode:04o}") });
        self.audited("download.fetch", args, |ctx| {
            let (u, dest) = ctx.download_request(&url, &sha256, &dest)?;
            if ctx.already_fetched(&dest, &sha256)? {
                return Ok(Outcome::Unchanged);
            }
            if ctx.session.mode == RunMode::Apply {
                return Err(Error::Unavailable(format!(
                    "download {u}: this agent build has no HTTP backend yet"
                )));
            }
            ctx.record(ChangeKind::Download {
                url: u.to_string(),
                sha256: sha256.clone(),
                dest: dest.to_string(),
            });
            Ok(Outcome::Created)
        })
    }

    fn fetch_and_extract(
        &mut self,
        url: String,
        sha256: String,
        dest_dir: String,
        strip_components: u32,
    ) -> Result<Outcome, Error> {
        let args = json!({ "url": url, "sha256": sha256, "dest-dir": dest_dir, "strip-components": strip_components });
        self.audited("download.fetch-and-extract", args, |ctx| {
            let (u, dest) = ctx.download_request(&url, &sha256, &dest_dir)?;
            if ctx.session.mode == RunMode::Apply {
                return Err(Error::Unavailable(format!(
                    "download {u}: this agent build has no HTTP backend yet"
                )));
            }
            ctx.record(ChangeKind::DownloadExtract {
                url: u.to_string(),
                sha256: sha256.clone(),
                dest_dir: dest.to_string(),
                strip_components,
            });
            Ok(Outcome::Created)
        })
    }
}
