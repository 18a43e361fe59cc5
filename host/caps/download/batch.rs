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
//! - Every request's result has an audit record of its own (`download.fetch-all[i]`, after
//!   the batch's own record, each bounded as any record is), so no request's result is lost
//!   to another's long error, and a request refused while it ran (a redirect outside the URL
//!   grant) is flagged `denied`, as is the batch's record. An apply takes a batch only while
//!   the phase's record budget has room for all of its records.
//!
//! # Caveats
//! In apply mode, changes are recorded in the order the downloads finish.

use super::Checked;
use crate::caps::{AuditSummary, Error, Outcome, PhaseCtx};
use crate::hostpath::HostPath;
use crate::plan::RunMode;
use crate::wit::download::FetchRequest;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The most requests one `fetch-all` takes: a node has a handful of artifacts, and each
/// request has an audit record of its own ([`REQUEST_CALLS`]).
pub const MAX_REQUESTS: usize = 16;

/// The most downloads of one call at a time: enough to overlap a node's artifacts, few enough
/// that a phase cannot open connections or unpack archives without bound.
pub const MAX_PARALLEL: usize = 4;

/// The `call` of each request's own audit record, by position (1-based, as errors name them):
/// the batch's record says what the guest asked and sums the results up; these say, each
/// within a record's own bounds, what became of every request, so that no request's result
/// is cut off by another's and a refused one is found by `audit show --denied`.
pub const REQUEST_CALLS: [&str; MAX_REQUESTS] = [
    "download.fetch-all[1]",
    "download.fetch-all[2]",
    "download.fetch-all[3]",
    "download.fetch-all[4]",
    "download.fetch-all[5]",
    "download.fetch-all[6]",
    "download.fetch-all[7]",
    "download.fetch-all[8]",
    "download.fetch-all[9]",
    "download.fetch-all[10]",
    "download.fetch-all[11]",
    "download.fetch-all[12]",
    "download.fetch-all[13]",
    "download.fetch-all[14]",
    "download.fetch-all[15]",
    "download.fetch-all[16]",
];

/// The results of a batch that ran, each with how long it took, in request order.
pub(super) struct Outcomes(pub(super) Vec<(Result<Outcome, Error>, Duration)>);

impl AuditSummary for Outcomes {
    /// A count per outcome and error kind, each error with the requests it ended (`3
    /// requests: created 2, failed 1 [3]`): short whatever the messages; each request's own
    /// record holds its message.
    fn summary(&self) -> String {
        let mut kinds: BTreeMap<&'static str, Vec<usize>> = BTreeMap::new();
        for (i, (r, _)) in self.0.iter().enumerate() {
            let kind = match r {
                Ok(Outcome::Created) => "created",
                Ok(Outcome::Changed) => "changed",
                Ok(Outcome::Unchanged) => "unchanged",
                Ok(Outcome::Removed) => "removed",
                Err(e) => error_kind(e),
            };
            kinds.entry(kind).or_default().push(i + 1);
        }
        let parts: Vec<String> = kinds
            .iter()
            .map(|(kind, at)| {
                if matches!(*kind, "created" | "changed" | "unchanged" | "removed") {
                    format!("{kind} {}", at.len())
                } else {
                    let at: Vec<String> = at.iter().map(usize::to_string).collect();
                    format!("{kind} {} [{}]", at.len(), at.join(", "))
                }
            })
            .collect();
        format!("{} requests: {}", self.0.len(), parts.join(", "))
    }

    /// A batch with a request the grant refused (a redirect outside the URL grant) is flagged
    /// too, not only that request's record.
    fn denied(&self) -> bool {
        self.0
            .iter()
            .any(|(r, _)| matches!(r, Err(Error::Denied(_))))
    }
}

/// The kind of `e`, as `describe_error` names it.
fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Denied(_) => "denied",
        Error::InvalidArgument(_) => "invalid-argument",
        Error::NotFound(_) => "not-found",
        Error::Escape(_) => "escape",
        Error::Io(_) => "io",
        Error::Failed(_) => "failed",
        Error::Timeout(_) => "timeout",
        Error::Unavailable(_) => "unavailable",
    }
}

/// One request's arguments, as its single call records them, under the function's name.
fn request_json(r: &FetchRequest) -> Value {
    match r {
        FetchRequest::File(f) => json!({
            "fetch": { "url": f.url, "sha256": f.sha256, "dest": f.dest,
                       "mode": format!("{:04o}", f.mode) }
        }),
        FetchRequest::Archive(a) => json!({
            "fetch-and-extract": { "url": a.url, "sha256": a.sha256, "dest-dir": a.dest_dir,
                                   "strip-components": a.strip_components }
        }),
    }
}

/// The batch record's arguments: how many requests, and the first [`MAX_REQUESTS`] as `fetch`
/// or `fetch-and-extract` records its own, with the function's name (the trail bounds them;
/// each request's own record has its arguments whole). Only so many: a guest may send far
/// more (refused as too many), and the record must not cost the host memory for each.
pub(super) fn audit_args(requests: &[FetchRequest]) -> Value {
    let listed: Vec<Value> = requests
        .iter()
        .take(MAX_REQUESTS)
        .map(request_json)
        .collect();
    json!({ "count": requests.len(), "requests": listed })
}

/// The arguments of request `i` (0-based) of `n`'s own record.
pub(super) fn request_args(i: usize, n: usize, r: &FetchRequest) -> Value {
    let mut args = request_json(r);
    if let Some(o) = args.as_object_mut() {
        o.insert("request".into(), json!(i + 1));
        o.insert("of".into(), json!(n));
    }
    args
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
    results: Vec<Option<(Result<Outcome, Error>, Duration)>>,
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
    pub(super) fn fetch_batch(
        &self,
        checked: &[Checked],
    ) -> Vec<(Result<Outcome, Error>, Duration)> {
        let timed = |c: &Checked| {
            let start = Instant::now();
            (self.run_checked(c), start.elapsed())
        };
        if self.run.files.mode == RunMode::Plan || checked.len() == 1 {
            return checked.iter().map(timed).collect();
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
                        let r = timed(&checked[i]);
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
                    let e = Error::Io(format!(
                        "{}: the download's thread ended without a result",
                        c.dest()
                    ));
                    (Err(e), Duration::ZERO)
                })
            })
            .collect()
    }
}
