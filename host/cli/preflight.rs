//! `nodeward preflight`: the host checks of [`crate::preflight`], printed as a table or as
//! JSON; exit 1 when a failure is not ignored (after printing every result), 2 for an unknown
//! check name in `--ignore-preflight-errors`.

use super::args::PreflightCommandArgs;
use super::json::PreflightOutput;
use super::output::print_json;
use super::{Failure, failed, usage};
use crate::audit::Redactor;
use crate::caps::RunContext;
use crate::hostpath::HostRoot;
use crate::plan::RunMode;
use crate::preflight::{Ignore, Status};

pub(super) fn run(a: &PreflightCommandArgs) -> Result<(), Failure> {
    let config = crate::config::load(a.config.path()).map_err(usage)?;
    let ignore = Ignore::parse(&a.preflight.ignore_preflight_errors, &config).map_err(usage)?;
    let root = HostRoot::open(&a.root).map_err(usage)?;
    // A read-only view of the root (plan mode: nothing can be written through it); the config's
    // secrets are redacted from every message.
    let session = RunContext::new(root, RunMode::Plan, Redactor::new(config.secrets()));
    let own_node = crate::node::preflight::own_node(&session);
    let report = crate::node::preflight::check(&session, &config, &ignore);
    let root = session.root().path().display().to_string();
    if a.output.text() {
        println!(
            "nodeward preflight against {root} ({}){}",
            a.config.source(),
            if own_node {
                "; a nodeward node is installed here"
            } else {
                ""
            }
        );
        let width = report
            .checks
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(0);
        for c in &report.checks {
            let result = match (c.status, c.ignored) {
                (Status::Pass, _) => "pass",
                (Status::Warning, _) => "WARNING",
                (Status::Skip, _) => "skip",
                (Status::Fail, true) => "ignored",
                (Status::Fail, false) => "FAIL",
            };
            println!("{:width$}  {result:7}  {}", c.name, c.message);
        }
        println!("{}", report.summary());
    } else {
        print_json(&PreflightOutput {
            root,
            own_node,
            passed: report.passed(),
            checks: report.checks.clone(),
        })?;
    }
    report.into_result().map(|_| ()).map_err(failed)
}
