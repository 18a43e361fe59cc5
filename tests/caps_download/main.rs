//! The `download` capability in apply and plan mode against a real HTTP server on 127.0.0.1
//! that this test starts: scripted answers per path, and a count of requests per path.
//!
//! Success, wrong hash and the refusals go through the real component boundary with the probe
//! guest; the rest call the host code directly. One module per WIT function (`fetch`,
//! `fetch_and_extract`, `fetch_all`), the cache's eviction in `evict`, HTTPS trust (system store, `caFile`)
//! in `tls`, the scripted server in `server`, the temporary host and the probe in `fixture`. One test binary (`cargo test --test caps_download`): each binary costs a long
//! link.

#[path = "../common/mod.rs"]
mod common;

mod evict;
mod fetch;
mod fetch_all;
mod fetch_and_extract;
mod fixture;
mod server;
mod tls;

use flate2::Compression;
use flate2::write::GzEncoder;
use nodeward::audit::Redactor;
use nodeward::caps::RunContext;
use nodeward::caps::download::RetryPolicy;
use nodeward::caps::{Error, Outcome, PhaseCtx};
use nodeward::grants::{DownloadGrant, FsGrant, Grants};
use nodeward::hostpath::{HostPath, HostRoot};
use nodeward::plan::{ChangeKind, RunMode};
use nodeward::runtime::Limits;
use nodeward::wit::download::Host as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fixture::*;
use server::*;
