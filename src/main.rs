//! The `drivelab` command line: run scenarios, validate them, or serve a
//! reference driver as its own process.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cosi_s3::Mutant;
use drivelab::{engine, report, scenario};

#[derive(Parser)]
#[command(name = "drivelab", version, about = "A simulated lab for conformance testing of storage drivers")]
struct Cli {
    /// Echo logs to stderr (they are always captured for the checks).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenario files (directories are searched for *.yaml). Exit 0 all pass, 1 a check failed, 2 bad input.
    Run {
        /// Scenario files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Seed for every free choice (overrides the file's `seed:`).
        #[arg(long)]
        seed: Option<u64>,
        /// Switch on a seeded bug in the reference driver (repeatable); see `drivelab mutants`.
        #[arg(long = "mutant", value_parser = parse_mutant)]
        mutants: Vec<Mutant>,
        /// Write per-scenario snapshot, history and summary here.
        #[arg(long)]
        report_dir: Option<PathBuf>,
    },
    /// Parse and validate scenario files without running them.
    Validate {
        /// Scenario files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// List the reference drivers' seeded bugs.
    Mutants,
    /// Serve a reference driver on a Unix socket (for crash tests and manual use).
    Driver {
        #[command(subcommand)]
        which: DriverCommand,
    },
}

#[derive(Subcommand)]
enum DriverCommand {
    /// The reference COSI driver for S3 admin APIs.
    CosiS3 {
        /// unix:///path/to/cosi.sock (default: $COSI_ENDPOINT, else unix:///var/lib/cosi/cosi.sock).
        #[arg(long)]
        endpoint: Option<String>,
        /// Kubernetes API URL for checkpoints.
        #[arg(long, env = "KUBE_URL")]
        kube_url: String,
        /// Namespace for checkpoints.
        #[arg(long, default_value = engine::DRIVER_STATE_NAMESPACE)]
        state_namespace: String,
        /// Seeded bugs to switch on.
        #[arg(long = "mutant", value_parser = parse_mutant)]
        mutants: Vec<Mutant>,
    },
}

fn parse_mutant(s: &str) -> Result<Mutant, String> {
    Mutant::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Mutant::all().iter().map(|m| m.name()).collect();
        format!("unknown mutant `{s}`; known: {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    drivelab::logcap::init(cli.verbose);
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drivelab: cannot start the runtime: {e}");
            return ExitCode::from(3);
        }
    };
    rt.block_on(async move {
        match cli.command {
            Command::Run { paths, seed, mutants, report_dir } => run(paths, seed, mutants, report_dir).await,
            Command::Validate { paths } => validate(paths),
            Command::Mutants => {
                for m in Mutant::all() {
                    println!("{:28} {}", m.name(), m.describe());
                }
                ExitCode::SUCCESS
            }
            Command::Driver { which: DriverCommand::CosiS3 { endpoint, kube_url, state_namespace, mutants } } => {
                let endpoint = endpoint
                    .or_else(|| std::env::var("COSI_ENDPOINT").ok())
                    .unwrap_or_else(|| "unix:///var/lib/cosi/cosi.sock".into());
                let Some(path) = endpoint.strip_prefix("unix://") else {
                    eprintln!("drivelab: --endpoint must be unix:///path, got {endpoint}");
                    return ExitCode::from(2);
                };
                let config = cosi_s3::DriverConfig { kube_url, state_namespace, mutants };
                let shutdown = async {
                    let _ = tokio::signal::ctrl_c().await;
                };
                match cosi_s3::serve_unix(config, std::path::Path::new(path), shutdown).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("drivelab: cosi-s3 driver: {e:#}");
                        ExitCode::from(1)
                    }
                }
            }
        }
    })
}

fn load_all(paths: &[PathBuf]) -> Result<Vec<scenario::Scenario>, ExitCode> {
    let files = match scenario::discover(paths) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("drivelab: {e}");
            return Err(ExitCode::from(2));
        }
    };
    if files.is_empty() {
        eprintln!("drivelab: no scenario files (*.yaml) under {}", paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "));
        return Err(ExitCode::from(2));
    }
    let mut out = Vec::new();
    let mut bad = false;
    for f in files {
        match scenario::load(&f) {
            Ok(s) => out.push(s),
            Err(e) => {
                eprintln!("{e}");
                bad = true;
            }
        }
    }
    if bad {
        Err(ExitCode::from(2))
    } else {
        Ok(out)
    }
}

fn validate(paths: Vec<PathBuf>) -> ExitCode {
    match load_all(&paths) {
        Ok(s) => {
            println!("{} scenario(s) valid", s.len());
            ExitCode::SUCCESS
        }
        Err(c) => c,
    }
}

async fn run(paths: Vec<PathBuf>, seed: Option<u64>, mutants: Vec<Mutant>, report_dir: Option<PathBuf>) -> ExitCode {
    let scenarios = match load_all(&paths) {
        Ok(s) => s,
        Err(c) => return c,
    };
    let opts = engine::RunOptions { seed, mutants };
    let (mut passed, mut failed, mut errors) = (0, 0, 0);
    for scn in &scenarios {
        match engine::run(scn, &opts).await {
            Ok(o) => {
                print!("{}", report::console(&o));
                if let Some(dir) = &report_dir {
                    if let Err(e) = report::write_files(dir, &o) {
                        eprintln!("drivelab: writing the report for {}: {e}", o.scenario);
                    }
                }
                if o.passed() {
                    passed += 1
                } else {
                    failed += 1
                }
            }
            Err(e) => {
                errors += 1;
                println!("ERROR {} ({}): {e:#}", scn.name, scn.path.display());
                println!("  replay: {}", engine::replay_command(&scn.path, opts.seed.or(scn.seed).unwrap_or(engine::DEFAULT_SEED), &opts.mutants));
            }
        }
    }
    println!("\n{passed} passed, {} failed", failed + errors);
    if failed + errors > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
