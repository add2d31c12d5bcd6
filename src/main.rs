use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    purser::cli::run(purser::cli::Cli::parse())
}
