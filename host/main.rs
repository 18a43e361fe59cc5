//! The `nodeward` binary: parses the command line, sets up logging, runs the command.

use clap::Parser;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = nodeward::cli::Cli::parse();
    let filter = EnvFilter::try_new(cli.log_filter()).unwrap_or_else(|_| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if cli.json_logs() {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
    cli.run()
}
