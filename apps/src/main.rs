//! `efapoll`: the engine's command-line front end.
//!
//! Exit status: 0 on success; 1 when a command ran but its input or run
//! failed (a packet that does not decode); 2 for bad arguments.
#![deny(unsafe_code)]

mod decode;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "efapoll", version, about = "Poll-mode EFA RDM v4 messaging engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Dissect EFA RDM v4 packets given as hex, one per argument or per
    /// line of standard input; prints one JSON object per packet.
    Decode {
        /// Packets as hex; read from standard input when none is given.
        packets: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode { packets } => decode::run(&packets),
    }
}
