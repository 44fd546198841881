//! The `uncaged-workflow` binary: parse, execute, print the error once, exit with its code.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use uncaged_workflow::cli::Cli;
use uncaged_workflow::error::{chain_line, exit};
use uncaged_workflow::telemetry::Telemetry;
use uncaged_workflow::terminal;

#[tokio::main]
async fn main() -> ExitCode {
    // A shell asking for completions (the script `completions` prints sets this variable):
    // answer and exit before anything else runs.
    clap_complete::CompleteEnv::with_factory(<Cli as clap::CommandFactory>::command)
        .var(uncaged_workflow::cli::completions::COMPLETE_ENV)
        .complete();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE as u8 } else { 0 });
        }
    };
    terminal::set_color(cli.global.color);
    let telemetry = cli.telemetry();
    init_tracing(cli.global.verbose, telemetry.as_ref());
    let code = match cli.execute().await {
        Ok(code) => code,
        Err(e) => {
            let ours = e.downcast_ref::<uncaged_workflow::Error>();
            // The reader of our output has gone (`| head`): nothing is wrong, and nobody is
            // listening for a message.
            if ours.is_some_and(|e| e.is_broken_pipe()) {
                return ExitCode::SUCCESS;
            }
            // Errors quote names and text that bundles and agents chose: never raw on a terminal.
            let prefix = terminal::paint(
                "uncaged-workflow:",
                terminal::Color::Red,
                terminal::Stream::Stderr,
            );
            eprintln!("{prefix} {}", terminal::line(&chain_line(&*e)));
            ours.map_or(1, |e| e.exit_code())
        }
    };
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn init_tracing(verbose: u8, telemetry: Option<&Telemetry>) {
    let default = match verbose {
        0 => "warn",
        1 => "uncaged_workflow=info,warn",
        _ => "uncaged_workflow=debug,info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = terminal::colors(terminal::Stream::Stderr);
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .without_time()
        // A log that cannot be written (a worker's log on a full disk) is not worth a panic:
        // tracing would report it with `eprintln!`, which panics when stderr fails too.
        .log_internal_errors(false)
        // Each layer its own filter: the log's level must not decide which spans are exported.
        .with_filter(filter);
    tracing_subscriber::registry().with(log).with(telemetry.map(Telemetry::layer)).init();
}
