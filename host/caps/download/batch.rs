//! `download.fetch-all`: one phase's downloads at once.
//!
//! # Background
//! A node's artifacts (containerd, runc, the CNI plugins, the kubelet) do not depend on each
//! other: each is transferred, hashed and, for a tarball, validated and unpacked on its own.
//! One after the other, a bootstrap waits for their sum; at once, for about the longest of them
//! when the host has cores and bandwidth to spare. A guest cannot start threads, so the
//! batch is a host function.
//!
//! # Guarantees
//! - Each request gets exactly the checks of `fetch` or `fetch-and-extract` (the same code:
//!   `check_file`, `check_archive`), all of them before any download starts: the first
//!   refusal refuses the whole call, naming the request's position, and nothing is sent or
//!   written.
//! - The host ends as if the requests had been made one after the other, in order: a request
//!   whose destination is, lies within or holds an earlier request's starts only once that
//!   one has finished (an archive unpacked into `bin` and a file fetched to `bin/kubelet`
//!   could otherwise race for a name both write). So a phase orders a batch as it would
//!   order the single calls, and puts the archives first so the files within them wait
//!   for only those.
//! - At most [`MAX_PARALLEL`] downloads run at a time, each on a thread of its own with its own
//!   [`super::Fetcher`]; they share the phase deadline and the artifact cache, whose entries
//!   are content-addressed and each written through a temp file of its own, so two requests
//!   of one digest write the same bytes and the last rename wins.
//! - Every request ends with its own result, in request order; one failing stops none of the
//!   others.
//! - In plan mode the requests are planned one after the other, in order, so a plan lists
//!   its changes in the same order every time.
//!
//! # Caveats
//! In apply mode, changes are recorded in the order the downloads finish.

use super::Checked;
use crate::caps::{AuditSummary, Error, Outcome, PhaseCtx, describe_error};
use crate::hostpath::HostPath;
use crate::plan::RunMode;
use crate::wit::download::FetchRequest;
use serde_json::{Value, json};
use std::sync::{Condvar, Mutex};

/// The most requests one `fetch-all` takes: a node has a handful of artifacts, and the audit
/// record lists every request.
pub const MAX_REQUESTS: usize = 16;

/// The most downloads of one call at a time: enough to overlap a node's artifacts, few enough
/// that a phase cannot open connections or unpack archives without bound.
pub const MAX_PARALLEL: usize = 4;

/// The results of a batch, for its one audit record.
pub(super) struct Outcomes(pub(super) Vec<Result<Outcome, Error>>);

impl AuditSummary for Outcomes {
    fn summary(&self) -> String {
        self.0
            .iter()
            .map(|r| match r {
                Ok(o) => o.summary(),
                Err(e) => describe_error(e),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The audit record's arguments: each request as `fetch` or `fetch-and-extract` records its
/// own, with the function's name.
pub(super) fn audit_args(requests: &[FetchRequest]) -> Value {
    let requests: Vec<Value> = requests
        .iter()
        .map(|r| match r {
            FetchRequest::File(f) => json!({
                "fetch": { "url": f.url, "sha256": f.sha256, "dest": f.dest,
                           "mode": format!("{:04o}", f.mode) }
            }),
            FetchRequest::Archive(a) => json!({
                "fetch-and-extract": { "url": a.url, "sha256": a.sha256, "dest-dir": a.dest_dir,
                                       "strip-components": a.strip_components }
            }),
        })
        .collect();
    json!({ "requests": requests })
}

/// `e` with `prefix` before its message, of the same kind.
fn prefixed(prefix: &str, e: Error) -> Error {
    let p = |m: String| format!("{prefix}: {m}");
    match e {
        Error::Denied(m) => Error::Denied(p(m)),
        Error::InvalidArgument(m) => Error::InvalidArgument(p(m)),
        Error::NotFound(m) => Error::NotFound(p(m)),
        Error::Escape(m) => Error::Escape(p(m)),
        Error::Io(m) => Error::Io(p(m)),
        Error::Failed(m) => Error::Failed(p(m)),
        Error::Timeout(m) => Error::Timeout(p(m)),
        Error::Unavailable(m) => Error::Unavailable(p(m)),
    }
}

/// Whether `a` and `b` are one path or one lies beneath the other.
fn overlaps(a: &HostPath, b: &HostPath) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Which requests are running or done, and their results: the batch's shared state.
struct Board {
    started: Vec<bool>,
    results: Vec<Option<Result<Outcome, Error>>>,
}

impl Board {
    /// The first request not started whose earlier overlapping requests are all done.
    fn next_ready(&self, after: &[Vec<usize>]) -> Option<usize> {
        (0..self.started.len())
            .find(|&i| !self.started[i] && after[i].iter().all(|&j| self.results[j].is_some()))
    }
}

impl PhaseCtx {
    /// Checks every request as its single call would; the first refusal is the call's error.
    pub(super) fn check_batch(&self, requests: &[FetchRequest]) -> Result<Vec<Checked>, Error> {
        if requests.is_empty() || requests.len() > MAX_REQUESTS {
            return Err(Error::InvalidArgument(format!(
                "{} requests: fetch-all takes 1 to {MAX_REQUESTS}",
                requests.len()
            )));
        }
        requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                match r {
                    FetchRequest::File(f) => self.check_file(&f.url, &f.sha256, &f.dest, f.mode),
                    FetchRequest::Archive(a) => {
                        self.check_archive(&a.url, &a.sha256, &a.dest_dir, a.strip_components)
                    }
                }
                .map_err(|e| prefixed(&format!("request {}", i + 1), e))
            })
            .collect()
    }

    /// Does the checked downloads, up to [`MAX_PARALLEL`] at a time in apply mode (a request
    /// waits for the earlier ones whose destination overlaps its own), one after the other in
    /// plan mode; each result in request order.
    pub(super) fn fetch_batch(&self, checked: &[Checked]) -> Vec<Result<Outcome, Error>> {
        if self.run.files.mode == RunMode::Plan || checked.len() == 1 {
            return checked.iter().map(|c| self.run_checked(c)).collect();
        }
        // For each request, the earlier ones it must wait for.
        let after: Vec<Vec<usize>> = checked
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (0..i)
                    .filter(|&j| overlaps(checked[j].dest(), c.dest()))
                    .collect()
            })
            .collect();
        let board = Mutex::new(Board {
            started: vec![false; checked.len()],
            results: checked.iter().map(|_| None).collect(),
        });
        let changed = Condvar::new();
        let lock = || board.lock().unwrap_or_else(|p| p.into_inner());
        std::thread::scope(|s| {
            for _ in 0..MAX_PARALLEL.min(checked.len()) {
                s.spawn(|| {
                    loop {
                        let i = {
                            let mut b = lock();
                            loop {
                                if let Some(i) = b.next_ready(&after) {
                                    b.started[i] = true;
                                    break i;
                                }
                                if b.started.iter().all(|s| *s) {
                                    return;
                                }
                                // A request is waiting for a running one it overlaps.
                                b = changed.wait(b).unwrap_or_else(|p| p.into_inner());
                            }
                        };
                        let r = self.run_checked(&checked[i]);
                        lock().results[i] = Some(r);
                        changed.notify_all();
                    }
                });
            }
        });
        let results = board
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .results;
        results
            .into_iter()
            .zip(checked)
            .map(|(r, c)| {
                // Every request is started by exactly one thread, and the scope joins them
                // all; an empty slot would be a bug here, reported rather than hidden.
                r.unwrap_or_else(|| {
                    Err(Error::Io(format!(
                        "{}: the download's thread ended without a result",
                        c.dest()
                    )))
                })
            })
            .collect()
    }
}
