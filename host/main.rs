//! The `nodeward` binary: the command line ([`nodeward::cli::main`]) parses, sets up logging
//! and runs the command.

use std::process::ExitCode;

fn main() -> ExitCode {
    nodeward::cli::main()
}
