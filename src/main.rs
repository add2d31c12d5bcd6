use std::process::ExitCode;

use clap::Parser;

// Every request allocates and frees many small buffers across tasks; mimalloc spent
// about a third of the time glibc's allocator did on them in the gateway benchmark.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    purser::cli::run(purser::cli::Cli::parse())
}
