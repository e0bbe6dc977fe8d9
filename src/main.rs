//! The `backends` command: a report of every backend module and its flags, and self-checks.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Reports what this machine can run and how the math is set to run.
#[derive(Parser)]
#[command(name = "backends", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Prints every module's capabilities and flags (and where each value came from).
    Info {
        /// Prints one JSON object keyed by module name instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Prints warnings from this library (and errors from any crate) to stderr.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, meta: &log::Metadata) -> bool {
        meta.level() <= log::Level::Error
            || meta.level() <= log::Level::Warn && meta.target().starts_with("backends")
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            eprintln!("[{}] {}", record.level(), record.args());
        }
    }

    fn flush(&self) {}
}

fn main() -> ExitCode {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        // Mesa's device-select layer prints an error per Vulkan instance when
        // XDG_RUNTIME_DIR is unset (containers, CI); it only reorders devices.
        // SAFETY: no other thread exists yet, so nothing reads the environment concurrently.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
    let _ = log::set_logger(&StderrLogger).map(|()| log::set_max_level(log::LevelFilter::Warn));
    let cli = Cli::parse();
    let text = match cli.command {
        Some(Command::Info { json: true }) => format!("{:#}\n", backends::info::report()),
        Some(Command::Info { json: false }) => {
            backends::info::render_text(&backends::info::report())
        }
        None => {
            let mut text = backends::info::render_text(&backends::info::report());
            text.push_str(&format!(
                "\nself-checks (best device: {})\n",
                backends::Device::best()
            ));
            let checks = backends::selfcheck::run();
            for c in &checks {
                let verdict = if c.passed() { "ok" } else { "FAILED" };
                let detail = match &c.outcome {
                    Ok(err) => format!(
                        "rel. error {err:.2e} (bound {:.0e}), {:.2} ms",
                        c.bound, c.millis
                    ),
                    Err(why) => why.clone(),
                };
                text.push_str(&format!(
                    "  {verdict:6} {} on {}: {detail}\n",
                    c.name, c.device
                ));
            }
            let code = print_or_exit(&text);
            return if checks.iter().all(|c| c.passed()) {
                code
            } else {
                ExitCode::FAILURE
            };
        }
    };
    print_or_exit(&text)
}

/// Writes to stdout; a closed pipe (`backends info | head`) ends quietly.
fn print_or_exit(text: &str) -> ExitCode {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("backends: cannot write the report: {err}");
            ExitCode::FAILURE
        }
    }
}
