//! What the command line says about itself: `help [COMMAND…]`, `completions SHELL` and `man`,
//! all generated from the one clap definition so they cannot drift from it.

use super::args::Cli;
use super::{Failure, failed, usage};
use clap::CommandFactory as _;
use std::io::Write as _;

/// `nodeward help [COMMAND…]`: the long help of nodeward or of the named (sub)command.
///
/// Our own subcommand rather than clap's built-in one, which refuses `help --help`.
pub(super) fn help(path: &[String]) -> Result<(), Failure> {
    let mut command = Cli::command();
    command.build();
    find(&mut command, path)?.print_long_help().map_err(failed)
}

/// `nodeward completions SHELL`.
pub(super) fn completions(shell: clap_complete::Shell) -> Result<(), Failure> {
    let mut command = Cli::command();
    // Into memory first: clap_complete panics on a write error (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "nodeward", &mut script);
    std::io::stdout().write_all(&script).map_err(failed)
}

/// `nodeward man [COMMAND…]`: the man page (roff) of nodeward or of one of its commands
/// (`nodeward-phases-install(1)`), from the same definition as `--help`.
pub(super) fn man(path: &[String]) -> Result<(), Failure> {
    let mut command = Cli::command();
    command.build();
    let command = find(&mut command, path)?;
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone())
        .source(format!("nodeward {}", env!("CARGO_PKG_VERSION")))
        .render(&mut page)
        .map_err(failed)?;
    std::io::stdout().write_all(&page).map_err(failed)
}

/// The (sub)command at `path` beneath `command`.
fn find<'c>(
    command: &'c mut clap::Command,
    path: &[String],
) -> Result<&'c mut clap::Command, Failure> {
    let mut current = command;
    for name in path {
        current = current.find_subcommand_mut(name).ok_or_else(|| {
            usage(format!(
                "no command `{}`; `nodeward --help` lists them",
                path.join(" ")
            ))
        })?;
    }
    Ok(current)
}
