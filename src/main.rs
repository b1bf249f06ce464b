//! The `drivelab` command line: run scenarios, validate them, or serve a
//! reference driver as its own process.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::scenario::Mutant;
use clap::{Parser, Subcommand};
use drivelab::runs::{RunMeta, RunStore};
use drivelab::scenario::BuiltinDriver;
use drivelab::{engine, report, scenario, systems};
use drivelab_fakes::history::EventLog;
use futures_util::StreamExt;

#[derive(Parser)]
#[command(
    name = "drivelab",
    version,
    about = "A simulated lab for conformance testing of storage drivers"
)]
struct Cli {
    /// Echo logs to stderr (they are always captured for the checks).
    #[arg(short, long, global = true)]
    verbose: bool,
    /// Log format for captured (and, with -v, echoed) logs: text | json.
    #[arg(long, global = true, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
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
        /// Sweep: run every scenario under this many consecutive seeds (from --seed, default 1).
        #[arg(long)]
        seeds: Option<u64>,
        /// Switch on a seeded bug in the reference driver (repeatable); see `drivelab mutants`.
        #[arg(long = "mutant", value_parser = parse_mutant)]
        mutants: Vec<Mutant>,
        /// Write the report here: summary.md, index.html, run.json, junit.xml, and one directory per scenario.
        #[arg(long)]
        report_dir: Option<PathBuf>,
        /// Only scenarios whose file path contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Only shard k of n (k/n, 1-based) of the sorted scenario files, for CI matrices.
        #[arg(long, value_parser = report::cli::parse_partition)]
        partition: Option<report::cli::Partition>,
        /// The driver under test, overriding every scenario's `driver:` (same YAML), e.g.
        /// 'command: [target/debug/cosi-s3, --endpoint, "{endpoint}"]' or 'image: cosi-s3:dev'.
        #[arg(long)]
        driver: Option<String>,
        /// Record each run here as it happens (default: $DRIVELAB_RUNS, else .drivelab/runs);
        /// see `drivelab runs` and `drivelab report RUN`.
        #[arg(long)]
        runs_dir: Option<PathBuf>,
        /// Do not record runs.
        #[arg(long)]
        no_record: bool,
        /// Print every check of every scenario (default: details for failures only).
        #[arg(long)]
        detail: bool,
        /// Scenarios run side by side (default: four per core). Each run has its
        /// own runtime and log and output stays in file order, so the results
        /// are the same for any value; only `-v`'s echoed logs interleave.
        #[arg(long)]
        jobs: Option<usize>,
    },
    /// List recorded runs: id, scenario, seed, pass/fail/error, running, or INCOMPLETE
    /// with the events stored and the last step reached (a lab killed mid-run).
    Runs {
        /// The runs dir (default: $DRIVELAB_RUNS, else .drivelab/runs).
        #[arg(long)]
        runs_dir: Option<PathBuf>,
    },
    /// Render a recorded run as Markdown on stdout (an interrupted run is marked
    /// incomplete); with --report-dir also summary.md, index.html, run.json there.
    Report {
        /// Run id, as `drivelab runs` lists it.
        run: String,
        /// The runs dir (default: $DRIVELAB_RUNS, else .drivelab/runs).
        #[arg(long)]
        runs_dir: Option<PathBuf>,
        /// Also write the scenario's report files under this directory.
        #[arg(long)]
        report_dir: Option<PathBuf>,
        /// Show the verdicts the run gave, without judging its record again
        /// with this drivelab's checks.
        #[arg(long)]
        as_recorded: bool,
    },
    /// Serve the fakes on 127.0.0.1 until Ctrl-C, for a driver or client pointed at them by hand.
    Serve {
        /// Which system's fakes: cosi (S3, admin API, Kubernetes) or csi (the
        /// BOSH Director with UAA, CPI and block API, and one mount table per node).
        #[arg(long, value_enum, default_value = "cosi")]
        system: ServeSystem,
        /// cosi: users, buckets and classes to create; csi: a `bosh:` section
        /// as in scenarios (YAML; see README, "drivelab serve").
        #[arg(long)]
        config: Option<PathBuf>,
        /// Fixed ports S3,KUBE (default: any free ports).
        #[arg(long)]
        ports: Option<systems::cosi::serve::Ports>,
        /// Faults to arm (YAML `faults:` list in the scenario fault language).
        #[arg(long)]
        faults: Option<PathBuf>,
    },
    /// Merge shard report dirs (from `run --partition k/n --report-dir ...`) into one report.
    MergeReports {
        /// Report directories to merge.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Where to write the merged report.
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Merge the found files of campaign shards (explore --partition, sweeps):
    /// one per failure signature (mutants, failed invariants, faults) is
    /// copied to --out, with SUMMARY.md. Exit 1 if any was found.
    MergeFound {
        /// Shard output directories (searched for *.yaml).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Where to copy the kept files and write SUMMARY.md.
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Parse and validate scenario files without running them.
    Validate {
        /// Scenario files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print each scenario as it will run (a `scale:` block's generated
        /// fleet and steps written out), as a file `drivelab run` accepts.
        #[arg(long)]
        expand: bool,
    },
    /// List the reference drivers' seeded bugs.
    Mutants,
    /// List things the lab knows: mutants, invariants (= checks), faults, scenarios.
    List {
        /// mutants | invariants | checks | faults | scenarios | placeholders
        what: ListWhat,
        /// For `scenarios`: where to look (default: scenarios/).
        paths: Vec<PathBuf>,
    },
    /// Explore a scenario: generated fault schedules, concurrency and seeds; a
    /// failure is shrunk and written as a scenario file that replays it. Exit 1 if found.
    Explore {
        /// The scenario to explore from.
        scenario: PathBuf,
        /// Cases to generate (default: as many as --time-budget allows).
        #[arg(long)]
        cases: Option<u32>,
        /// Explorer seed (which schedules are generated).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Stop generating after this much wall time (e.g. 60s, 5m).
        #[arg(long, default_value = "60s")]
        time_budget: String,
        /// Switch on a seeded bug in every case.
        #[arg(long = "mutant", value_parser = parse_mutant)]
        mutants: Vec<Mutant>,
        /// Where a found scenario is written.
        #[arg(long, default_value = "scenarios/found")]
        out_dir: PathBuf,
        /// Stop at the first failure without shrinking or writing (time-to-detection measurements).
        #[arg(long)]
        detect_only: bool,
        /// Go on to the budget after a failure: count the failing schedules and
        /// write each, unshrunk, to --out-dir (with --detect-only: count only).
        #[arg(long)]
        keep_going: bool,
        /// The driver under test, replacing the scenario's `driver:` (same YAML
        /// as `run --driver`); a found file names this driver.
        #[arg(long)]
        driver: Option<String>,
        /// Campaign shard k of n (1-based): only stream numbers s with
        /// s mod n = k-1; the coverage guide is off, so the n shards together
        /// explore exactly what one `--no-guide` run with the same seed and
        /// --cases does (--cases counts stream numbers).
        #[arg(long, value_parser = report::cli::parse_partition, conflicts_with = "completion_index")]
        partition: Option<report::cli::Partition>,
        /// As --partition, 0-based as a Kubernetes Indexed Job numbers its
        /// pods: `i/n` is shard i+1 of n (`$(JOB_COMPLETION_INDEX)/n`).
        #[arg(long, value_parser = parse_completion_index)]
        completion_index: Option<report::cli::Partition>,
        /// Coverage guide off: draw only the fresh schedule stream (what
        /// --partition does), --cases counting stream numbers.
        #[arg(long)]
        no_guide: bool,
        /// Write one line per case run here: stream number, schedule hash, verdict.
        #[arg(long)]
        manifest: Option<PathBuf>,
        /// Schedules run side by side. Guided, what is drawn next depends on
        /// the batch before, so a seed replays with the same --jobs (the
        /// replay line carries it when it is not the default).
        #[arg(long, default_value_t = drivelab::explore::DEFAULT_JOBS)]
        jobs: usize,
    },
    /// Systematic fault sweep: from a baseline run of a scenario, one run per
    /// (interception point reached, occurrence, fault kind) — every single
    /// fault at depth 1, a seeded sample of pairs at depth 2. Failures are
    /// shrunk and written as scenario files. Exit 1 if any run fails.
    SweepFaults {
        /// The scenario to sweep (its steps; its faults and expectations are dropped).
        scenario: PathBuf,
        /// The driver under test, replacing the scenario's `driver:` (same YAML
        /// as `run --driver`); found files name this driver.
        #[arg(long)]
        driver: Option<String>,
        /// 1: every single fault; 2: also a seeded sample of pairs of faults.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        depth: u8,
        /// Most fault runs in all (depth 1 first; the rest are reported not run).
        #[arg(long)]
        budget: Option<usize>,
        /// No new run starts after this much wall time (e.g. 60s, 5m).
        #[arg(long, default_value = "30m")]
        time_budget: String,
        /// Seed of the depth-2 sample.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Switch on a seeded bug in every run (a failure the correct driver
        /// shares is reported apart).
        #[arg(long = "mutant", value_parser = parse_mutant)]
        mutants: Vec<Mutant>,
        /// Where found scenarios are written.
        #[arg(long, default_value = "scenarios/found")]
        out_dir: PathBuf,
        /// Stop at the first failing run (it is still shrunk and written).
        #[arg(long)]
        stop_at_first: bool,
        /// Most found files (one per distinct set of failed invariants).
        #[arg(long, default_value_t = 5)]
        max_found: usize,
        /// Write sweep.md (every run's faults and verdict) here.
        #[arg(long)]
        report_dir: Option<PathBuf>,
        /// Exit 0 only if a run fails (for `make mutants`: the sweep must find the mutant).
        #[arg(long)]
        expect_found: bool,
    },
    /// Mutation test: run the scenarios against the correct driver and then
    /// against every mutant; print mutant → killing scenario → invariant; exit 1
    /// if the correct driver fails anything or any mutant survives.
    Mutate {
        /// Scenario files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Only these mutants (default: all).
        #[arg(long = "mutant", value_parser = parse_mutant)]
        mutants: Vec<Mutant>,
        /// Seed for every run.
        #[arg(long)]
        seed: Option<u64>,
    },
    /// The fake IaaS as an external BOSH CPI: one JSON request on stdin, one reply on stdout.
    Cpi {
        /// Directory for the IaaS state (sled), fault markers and the call log.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// CPI config file: {"state_dir": "...", "cpi": {"max_disks_per_vm": 8, ...}}.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Serve a reference driver on a Unix socket (for crash tests and manual use).
    Driver {
        #[command(subcommand)]
        which: DriverCommand,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ListWhat {
    Mutants,
    Invariants,
    Checks,
    Faults,
    Scenarios,
    Placeholders,
}

/// What `drivelab serve` stands up.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ServeSystem {
    Cosi,
    Csi,
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
        /// File holding the bearer token for that API (a pod's service-account token).
        #[arg(long, env = "KUBE_TOKEN_FILE", default_value = "")]
        kube_token_file: String,
        /// PEM file of the CA that API's certificate is signed by (a pod's ca.crt).
        #[arg(long, env = "KUBE_CA_FILE", default_value = "")]
        kube_ca_file: String,
        /// Namespace for checkpoints.
        #[arg(long, default_value = systems::cosi::DRIVER_STATE_NAMESPACE)]
        state_namespace: String,
        /// Seeded bugs to switch on.
        #[arg(long = "mutant", value_parser = parse_mutant)]
        mutants: Vec<Mutant>,
        /// per-grant (default) or per-grant-with-owner-marker: a second
        /// correct policy design, not a bug (README, "Built in").
        #[arg(long, value_parser = parse_policy_layout, default_value = "per-grant")]
        policy_layout: cosi_s3::PolicyLayout,
    },
    /// TEST DRIVER (hidden): a COSI driver that hangs, speaks garbage, answers
    /// nonsense, exits mid-call or floods its logs, for tests/misbehaving.rs.
    #[command(hide = true)]
    Misbehave {
        /// hang | garbage | nonsense | exit | flood
        #[arg(long)]
        mode: String,
        /// unix:///path/to/cosi.sock
        #[arg(long)]
        endpoint: String,
    },
    /// The reference BOSH CSI driver (flags as the `bosh-csi` binary's; `--help` lists them).
    #[command(disable_help_flag = true)]
    BoshCsi {
        /// Flags passed through to the driver.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The reference CSI driver with its own backend (flags as the `hostpath-csi` binary's).
    HostpathCsi {
        /// Flags passed through to the driver.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn parse_policy_layout(s: &str) -> Result<cosi_s3::PolicyLayout, String> {
    cosi_s3::PolicyLayout::parse(s).ok_or_else(|| {
        let names: Vec<_> = cosi_s3::PolicyLayout::all()
            .iter()
            .map(|l| l.name())
            .collect();
        format!("unknown policy layout {s:?}; known: {}", names.join(", "))
    })
}

/// `i/n` with 0 ≤ i < n (a Kubernetes Indexed Job's completion index) as
/// the partition `i+1/n`.
fn parse_completion_index(s: &str) -> Result<report::cli::Partition, String> {
    let bad = || format!("--completion-index wants i/n with 0 ≤ i < n (e.g. 0/4), got `{s}`");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let i: usize = i.trim().parse().map_err(|_| bad())?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    if i >= n {
        return Err(bad());
    }
    Ok(report::cli::Partition { k: i + 1, n })
}

fn parse_mutant(s: &str) -> Result<Mutant, String> {
    Mutant::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Mutant::all().iter().map(|m| m.name()).collect();
        format!("unknown mutant `{s}`; known: {}", names.join(", "))
    })
}

#[global_allocator]
static ALLOC: drivelab::alloc::Allocator = drivelab::alloc::Allocator {};

fn main() -> ExitCode {
    let cli = Cli::parse();
    drivelab::logcap::init_with(cli.verbose, cli.log_format == LogFormat::Json);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drivelab: cannot start the runtime: {e}");
            return ExitCode::from(3);
        }
    };
    rt.block_on(async move {
        match cli.command {
            Command::Run {
                paths,
                seed,
                seeds: None,
                mutants,
                report_dir,
                filter,
                partition,
                driver,
                runs_dir,
                no_record,
                detail,
                jobs,
            } => {
                let runs = (!no_record).then(|| RunStore::new(RunStore::resolve(runs_dir)));
                let jobs = jobs.unwrap_or_else(engine::default_jobs);
                run(
                    paths, seed, mutants, report_dir, filter, partition, driver, runs, detail,
                    jobs,
                )
                .await
            }
            Command::Runs { runs_dir } => {
                let store = RunStore::new(RunStore::resolve(runs_dir));
                match store.list_text() {
                    Ok(t) => {
                        drivelab::out!("{t}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("drivelab: runs: {e}");
                        ExitCode::from(2)
                    }
                }
            }
            Command::Report {
                run,
                runs_dir,
                report_dir,
                as_recorded,
            } => stored_report(
                RunStore::new(RunStore::resolve(runs_dir)),
                &run,
                report_dir,
                as_recorded,
            ),
            Command::Serve {
                system: ServeSystem::Csi,
                config,
                ports,
                faults,
            } => serve_csi(config, ports.is_some(), faults.is_some()).await,
            Command::Serve {
                system: ServeSystem::Cosi,
                config,
                ports,
                faults,
            } => serve(config, ports.unwrap_or_default(), faults).await,
            Command::Run {
                paths,
                seed,
                seeds: Some(n),
                mutants,
                report_dir,
                filter,
                partition,
                driver,
                runs_dir,
                no_record,
                detail: _,
                jobs,
            } => {
                // A sweep records only where asked: 200 seeds x the suite would
                // bury the runs dir.
                let runs = (!no_record && runs_dir.is_some())
                    .then(|| RunStore::new(RunStore::resolve(runs_dir)));
                let select = Selection {
                    paths,
                    filter,
                    partition,
                    driver,
                };
                sweep(
                    select,
                    seed.unwrap_or(engine::DEFAULT_SEED),
                    n,
                    mutants,
                    report_dir,
                    runs,
                    jobs.unwrap_or_else(engine::default_jobs),
                )
                .await
            }
            Command::MergeReports { dirs, out } => match report::merge(&dirs, &out) {
                Ok(reports) => {
                    drivelab::out!("{}", report::cli::final_table(&reports));
                    drivelab::outln!(
                        "merged {} scenario reports into {}",
                        reports.len(),
                        out.display()
                    );
                    ExitCode::from(report::cli::exit_code(&reports))
                }
                Err(e) => {
                    eprintln!("drivelab: merge-reports: {e}");
                    ExitCode::from(2)
                }
            },
            Command::MergeFound { dirs, out } => {
                match drivelab::explore::merge::merge_found(&dirs, &out) {
                    Ok(m) => {
                        for (i, f) in m.findings.iter().enumerate() {
                            drivelab::outln!(
                                "{}. {} — {} of {} shards; kept {}",
                                i + 1,
                                f.signature,
                                f.shards.len(),
                                m.dirs.len(),
                                f.kept_as
                            );
                        }
                        drivelab::outln!(
                            "merged {} found files into {} signatures in {} (SUMMARY.md)",
                            m.files,
                            m.findings.len(),
                            out.display()
                        );
                        ExitCode::from(u8::from(!m.findings.is_empty()))
                    }
                    Err(e) => {
                        eprintln!("drivelab: merge-found: {e:#}");
                        ExitCode::from(2)
                    }
                }
            }
            Command::Validate { paths, expand } => validate(paths, expand),
            Command::Mutants
            | Command::List {
                what: ListWhat::Mutants,
                ..
            } => {
                for m in Mutant::all() {
                    drivelab::outln!("{:28} {:9} {}", m.name(), m.driver().name(), m.describe());
                }
                ExitCode::SUCCESS
            }
            Command::List {
                what: ListWhat::Faults,
                ..
            } => {
                drivelab::out!("{}", report::cli::list_faults());
                ExitCode::SUCCESS
            }
            Command::List {
                what: ListWhat::Placeholders,
                ..
            } => {
                use drivelab::scenario::{driver::placeholders, DriverProtocol};
                for protocol in [DriverProtocol::Cosi, DriverProtocol::Csi] {
                    drivelab::outln!("{} drivers (`protocol: {}`):", protocol.name(), protocol.name());
                    for (name, what) in placeholders(protocol) {
                        drivelab::outln!("  {:26} {what}", format!("{{{name}}}"));
                    }
                }
                ExitCode::SUCCESS
            }
            Command::List {
                what: ListWhat::Scenarios,
                paths,
            } => {
                let paths = if paths.is_empty() {
                    vec![PathBuf::from("scenarios")]
                } else {
                    paths
                };
                match load_all(&paths, None, None) {
                    Ok(s) => {
                        drivelab::out!("{}", report::cli::list_scenarios(&s));
                        ExitCode::SUCCESS
                    }
                    Err(c) => c,
                }
            }
            Command::List {
                what: ListWhat::Invariants | ListWhat::Checks,
                ..
            } => {
                use drivelab::scenario::{Invariant, System};
                for i in Invariant::all() {
                    let system = match (i.applies_to(System::Cosi), i.applies_to(System::Csi)) {
                        (true, true) => "cosi+csi",
                        (true, false) => "cosi",
                        _ if i.needs_bosh() => "csi+bosh",
                        _ => "csi",
                    };
                    drivelab::outln!("{:26} {:10} {}", i.id(), system, i.claim());
                }
                ExitCode::SUCCESS
            }
            Command::Mutate {
                paths,
                mutants,
                seed,
            } => mutate(paths, mutants, seed).await,
            Command::Explore {
                scenario,
                cases,
                seed,
                time_budget,
                mutants,
                out_dir,
                detect_only,
                keep_going,
                driver,
                partition,
                completion_index,
                no_guide,
                manifest,
                jobs,
            } => {
                let Some(time_budget) = scenario::parse_duration(&time_budget) else {
                    eprintln!("drivelab: --time-budget `{time_budget}` is not a duration (e.g. 60s, 5m)");
                    return ExitCode::from(2);
                };
                let opts = drivelab::explore::ExploreOptions {
                    cases: cases.unwrap_or(u32::MAX),
                    seed,
                    time_budget,
                    mutants,
                    out_dir,
                    detect_only,
                    keep_going,
                    stream: drivelab::explore::StreamMode {
                        unguided: no_guide,
                        partition: partition.or(completion_index),
                        manifest,
                    },
                    jobs,
                };
                explore(scenario, driver, opts).await
            }
            Command::SweepFaults {
                scenario,
                driver,
                depth,
                budget,
                time_budget,
                seed,
                mutants,
                out_dir,
                stop_at_first,
                max_found,
                report_dir,
                expect_found,
            } => {
                let Some(time_budget) = scenario::parse_duration(&time_budget) else {
                    eprintln!("drivelab: --time-budget `{time_budget}` is not a duration (e.g. 60s, 5m)");
                    return ExitCode::from(2);
                };
                let opts = drivelab::explore::sweep::SweepOptions {
                    depth,
                    budget,
                    time_budget,
                    seed,
                    mutants,
                    out_dir,
                    stop_at_first,
                    max_found,
                    jobs: engine::cores(),
                };
                sweep_faults(scenario, driver, opts, report_dir, expect_found).await
            }
            Command::Cpi { state_dir, config } => {
                drivelab_fakes::cpi::external::main(state_dir, config)
            }
            Command::Driver {
                which:
                    DriverCommand::CosiS3 {
                        endpoint,
                        kube_url,
                        kube_token_file,
                        kube_ca_file,
                        state_namespace,
                        mutants,
                        policy_layout,
                    },
            } => {
                let endpoint = endpoint
                    .or_else(|| std::env::var("COSI_ENDPOINT").ok())
                    .unwrap_or_else(|| "unix:///var/lib/cosi/cosi.sock".into());
                let Some(path) = endpoint.strip_prefix("unix://") else {
                    eprintln!("drivelab: --endpoint must be unix:///path, got {endpoint}");
                    return ExitCode::from(2);
                };
                if let Some(m) = mutants.iter().find(|m| m.driver() != BuiltinDriver::CosiS3) {
                    eprintln!(
                        "drivelab: mutant {m} is a bug of {}, not cosi-s3",
                        m.driver().name()
                    );
                    return ExitCode::from(2);
                }
                let config = cosi_s3::DriverConfig {
                    kube_url,
                    kube_token_file,
                    kube_ca_file,
                    state_namespace,
                    mutants: Mutant::cosi(&mutants),
                    policy_layout,
                    secret_length: 0,
                };
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
            Command::Driver {
                which: DriverCommand::Misbehave { mode, endpoint },
            } => {
                let Some(mode) = drivelab_fakes::misbehave::Mode::parse(&mode) else {
                    eprintln!("drivelab: misbehave: unknown --mode `{mode}` (hang|garbage|nonsense|exit|flood)");
                    return ExitCode::from(2);
                };
                let path = endpoint.strip_prefix("unix://").unwrap_or(&endpoint);
                match drivelab_fakes::misbehave::serve(mode, std::path::Path::new(path)).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("drivelab: misbehave driver: {e:#}");
                        ExitCode::from(1)
                    }
                }
            }
            Command::Driver {
                which: DriverCommand::BoshCsi { args },
            } => {
                serve_reference_csi("bosh-csi", bosh_csi::cli::parse(args), |inv, stop| {
                    Box::pin(async move { bosh_csi::serve_unix(inv.config, &inv.socket, stop).await })
                })
                .await
            }
            Command::Driver {
                which: DriverCommand::HostpathCsi { args },
            } => {
                serve_reference_csi("hostpath-csi", hostpath_csi::cli::parse(args), |inv, stop| {
                    Box::pin(async move {
                        hostpath_csi::serve_unix(inv.config, &inv.socket, stop).await
                    })
                })
                .await
            }
        }
    })
}

/// `drivelab driver <reference CSI driver> ARGS`: its own command line
/// (`parsed`; `None` when it printed help), served until Ctrl-C.
async fn serve_reference_csi<I>(
    name: &str,
    parsed: anyhow::Result<Option<I>>,
    serve: impl FnOnce(
        I,
        futures_util::future::BoxFuture<'static, ()>,
    ) -> futures_util::future::BoxFuture<'static, anyhow::Result<()>>,
) -> ExitCode {
    let inv = match parsed {
        Ok(Some(inv)) => inv,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drivelab: {name} driver: {e:#}");
            return ExitCode::from(2);
        }
    };
    let stop = Box::pin(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    match serve(inv, stop).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drivelab: {name} driver: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn load_all(
    paths: &[PathBuf],
    filter: Option<&str>,
    partition: Option<report::cli::Partition>,
) -> Result<Vec<scenario::Scenario>, ExitCode> {
    let files = match scenario::discover(paths) {
        Ok(f) => report::cli::select(f, filter, partition),
        Err(e) => {
            eprintln!("drivelab: {e}");
            return Err(ExitCode::from(2));
        }
    };
    if files.is_empty() {
        if filter.is_some() || partition.is_some() {
            eprintln!("drivelab: note: --filter/--partition selected no scenario file");
        }
        eprintln!(
            "drivelab: no scenario files (*.yaml) under {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
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

fn validate(paths: Vec<PathBuf>, expand: bool) -> ExitCode {
    match load_all(&paths, None, None) {
        Ok(s) => {
            if expand {
                for scn in &s {
                    drivelab::outln!(
                        "{}",
                        scenario::write::to_yaml(
                            scn,
                            &[format!("expanded from {}", scn.path.display())]
                        )
                    );
                }
            }
            // Expanded, the count is a comment so the output stays a scenario file.
            let mark = if expand { "# " } else { "" };
            drivelab::outln!("{mark}{} scenario(s) valid", s.len());
            ExitCode::SUCCESS
        }
        Err(c) => c,
    }
}

#[allow(clippy::too_many_arguments)] // one per `drivelab run` flag
async fn run(
    paths: Vec<PathBuf>,
    seed: Option<u64>,
    mutants: Vec<Mutant>,
    report_dir: Option<PathBuf>,
    filter: Option<String>,
    partition: Option<report::cli::Partition>,
    driver: Option<String>,
    runs: Option<RunStore>,
    detail: bool,
    jobs: usize,
) -> ExitCode {
    let mut scenarios = match load_all(&paths, filter.as_deref(), partition) {
        Ok(s) => s,
        Err(c) => return c,
    };
    if let Err(c) = drive_with(&mut scenarios, driver.as_deref()) {
        return c;
    }
    let opts = engine::RunOptions {
        seed,
        mutants,
        ..Default::default()
    };
    let progress = report::cli::Progress::new(scenarios.len());
    let mut reports: Vec<report::ScenarioReport> = Vec::new();
    let mut results = engine::in_order(
        scenarios.iter().map(|scn| {
            let mut opts = opts.clone();
            opts.recorder = runs
                .as_ref()
                .and_then(|store| begin_record(store, scn, &opts));
            (std::sync::Arc::new(scn.clone()), opts)
        }),
        jobs,
    );
    for (i, scn) in scenarios.iter().enumerate() {
        progress.start(i, &scn.name, reports.iter().filter(|r| !r.passed).count());
        let Some((recorder, result)) = results.next().await else {
            break;
        };
        progress.clear();
        let r = match &result {
            Ok(o) => {
                let text = if detail {
                    report::console(&o)
                } else {
                    report::console_brief(&o)
                };
                drivelab::out!("{text}");
                report::ScenarioReport::from_outcome(&o)
            }
            Err(e) => {
                let seed = opts.seed.or(scn.seed).unwrap_or(engine::DEFAULT_SEED);
                let replay = engine::replay_command(scn, seed, &opts.mutants);
                drivelab::outln!("ERROR {} ({}): {e:#}", scn.name, scn.path.display());
                drivelab::outln!("  replay: {replay}");
                let names = opts.mutants.iter().map(|m| m.name().to_string()).collect();
                report::ScenarioReport::from_error(
                    &scn.name,
                    &scn.path.display().to_string(),
                    seed,
                    names,
                    replay,
                    format!("{e:#}"),
                )
            }
        };
        complete_record(recorder, &r, result.as_ref().ok());
        if let Some(dir) = &report_dir {
            if let Err(e) = report::write_scenario(dir, &r) {
                eprintln!("drivelab: writing the report for {}: {e}", r.scenario);
            }
        }
        reports.push(r);
    }
    if let Some(dir) = &report_dir {
        let names: Vec<String> = opts.mutants.iter().map(|m| m.name().to_string()).collect();
        let replay = report::cli::replay_all(&paths, seed, &names, filter.as_deref(), partition)
            + &driver_flag(&scenarios);
        let title = paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ");
        if let Err(e) = report::write_index(dir, &report::RunMeta { title, replay }, &reports) {
            eprintln!(
                "drivelab: writing the report index in {}: {e}",
                dir.display()
            );
        }
    }
    drivelab::out!("{}", report::cli::final_table(&reports));
    let passed = reports.iter().filter(|r| r.passed).count();
    drivelab::outln!("\n{passed} passed, {} failed", reports.len() - passed);
    ExitCode::from(report::cli::exit_code(&reports))
}

/// Replace every scenario's driver with `--driver`'s (when given). The
/// scenarios then carry it, so every run, report and replay line names it.
fn drive_with(scenarios: &mut [scenario::Scenario], driver: Option<&str>) -> Result<(), ExitCode> {
    let Some(text) = driver else { return Ok(()) };
    let spec = scenario::driver::parse_cli(text).map_err(|e| {
        eprintln!("drivelab: {e}");
        ExitCode::from(2)
    })?;
    for s in scenarios {
        s.driver.launch = spec.launch.clone();
        s.driver.policy_layout = spec.policy_layout;
        // The whole declaration is replaced, its seeded bugs too: dropping
        // them ran the correct driver under `--driver '{builtin: …, mutants: [X]}'`.
        s.driver.mutants = spec.mutants.clone();
        s.driver.start_timeout = spec.start_timeout;
        s.driver.call_timeout = spec.call_timeout;
        s.driver.from_flag = true;
    }
    Ok(())
}

/// The `--driver` part of a run-level replay line (the same for every scenario).
fn driver_flag(scenarios: &[scenario::Scenario]) -> String {
    scenarios
        .first()
        .map(|s| s.driver.replay_flag())
        .unwrap_or_default()
}

/// Start the durable record of one scenario run; a runs dir that cannot be
/// written costs the record, not the run.
/// Close a run's record: its report, and for a run that produced an outcome
/// the rest of its history and the record its checks were judged from.
fn complete_record(
    rec: Option<drivelab::runs::Recorder>,
    r: &report::ScenarioReport,
    outcome: Option<&engine::RunOutcome>,
) {
    let Some(rec) = rec else { return };
    let record = outcome.map(|o| o.record.text());
    let end = outcome
        .zip(record.as_deref())
        .map(|(o, record)| drivelab::runs::RunEnd {
            events: &o.history,
            record,
            secrets: &o.secrets,
        });
    if let Err(e) = rec.complete_run(r, end) {
        eprintln!("drivelab: run record {}: {e}", rec.id());
    }
}

fn begin_record(
    store: &RunStore,
    scn: &scenario::Scenario,
    opts: &engine::RunOptions,
) -> Option<drivelab::runs::Recorder> {
    let seed = opts.seed.or(scn.seed).unwrap_or(engine::DEFAULT_SEED);
    let mut mutants = scn.driver.mutants.clone();
    mutants.extend(opts.mutants.iter().copied());
    mutants.sort();
    mutants.dedup();
    let meta = RunMeta {
        id: String::new(),
        scenario: scn.name.clone(),
        path: scn.path.display().to_string(),
        seed,
        mutants: mutants.iter().map(|m| m.name().to_string()).collect(),
        replay: engine::replay_command(scn, seed, &mutants),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default(),
    };
    match store.begin(meta) {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("drivelab: not recording {}: {e}", scn.name);
            None
        }
    }
}

/// `drivelab report RUN`: Markdown on stdout, the report files under `report_dir`.
/// `drivelab report RUN`: a stored run's report, its checks judged again from
/// the run's record by this drivelab's checks (`--as-recorded`: the verdicts
/// the run gave). Exit 0 when it passes, 1 when it fails, 2 when it cannot be read.
fn stored_report(
    store: RunStore,
    id: &str,
    report_dir: Option<PathBuf>,
    as_recorded: bool,
) -> ExitCode {
    let (run, recorded) = match store.report(id) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("drivelab: report: {e}");
            return ExitCode::from(2);
        }
    };
    let (r, note) = if as_recorded || run.report.is_none() {
        (recorded, None)
    } else {
        match rejudge(&store, id, &recorded) {
            Ok((r, note)) => (r, Some(note)),
            Err(why) => (
                recorded,
                Some(format!(
                    "not re-judged: {why}; the verdicts below are the ones the run gave"
                )),
            ),
        }
    };
    let mut md = RunStore::markdown(&run, &r);
    if let Some(note) = note {
        md = format!("{note}\n\n{md}");
    }
    drivelab::out!("{md}");
    if let Some(dir) = report_dir {
        let written = report::write_scenario(&dir, &r)
            .and_then(|()| std::fs::write(dir.join(&r.dir).join("summary.md"), &md));
        if let Err(e) = written {
            eprintln!("drivelab: report: writing {}: {e}", dir.display());
            return ExitCode::from(2);
        }
        eprintln!("drivelab: report written to {}", dir.join(&r.dir).display());
    }
    if r.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// A stored run judged again: the report with today's verdicts, and a note
/// saying which verdicts changed from the ones the run gave.
fn rejudge(
    store: &RunStore,
    id: &str,
    recorded: &report::ScenarioReport,
) -> Result<(report::ScenarioReport, String), String> {
    let record = store
        .record(id)
        .map_err(|e| e.to_string())?
        .ok_or("the run kept no record of what its checks read (a lab error, or a drivelab older than records)")?;
    let events: EventLog = store.events(id).map_err(|e| e.to_string())?.into();
    let verdicts = systems::judge_text(&record, &events).map_err(|e| e.to_string())?;
    let now = recorded.rejudged(&verdicts, &events);
    let changed = report::rejudge_changes(recorded, &now);
    let note = if changed.is_empty() {
        format!(
            "Re-judged from the run's record by this drivelab's checks: every verdict as recorded ({}).",
            if now.passed { "PASS" } else { "FAIL" }
        )
    } else {
        let mut s = String::from(
            "Re-judged from the run's record by this drivelab's checks; changed since the run:\n",
        );
        for c in changed {
            s.push_str(&format!("\n- {c}"));
        }
        s
    };
    Ok((now, note))
}

/// Which scenarios a run or sweep takes, and the driver it drives them with.
struct Selection {
    paths: Vec<PathBuf>,
    filter: Option<String>,
    partition: Option<report::cli::Partition>,
    driver: Option<String>,
}

/// Every scenario under seeds `from..from+n`; prints failures and a per-scenario
/// line. With a report dir, each failing run's report goes to
/// `<scenario>-seed-<N>/` and the index lists those.
async fn sweep(
    select: Selection,
    from: u64,
    n: u64,
    mutants: Vec<Mutant>,
    report_dir: Option<PathBuf>,
    runs: Option<RunStore>,
    jobs: usize,
) -> ExitCode {
    let mut scenarios = match load_all(&select.paths, select.filter.as_deref(), select.partition) {
        Ok(s) => s,
        Err(c) => return c,
    };
    if let Err(c) = drive_with(&mut scenarios, select.driver.as_deref()) {
        return c;
    }
    let started = std::time::Instant::now();
    let (mut passed, mut failed) = (0u64, 0u64);
    let mut failing: Vec<report::ScenarioReport> = Vec::new();
    let seeds = from..from.saturating_add(n);
    let mut results = engine::in_order(
        scenarios.iter().flat_map(|scn| {
            let scn = std::sync::Arc::new(scn.clone());
            let (mutants, runs) = (&mutants, &runs);
            seeds.clone().map(move |seed| {
                let mut opts = engine::RunOptions {
                    seed: Some(seed),
                    mutants: mutants.clone(),
                    ..Default::default()
                };
                opts.recorder = runs
                    .as_ref()
                    .and_then(|store| begin_record(store, &scn, &opts));
                (scn.clone(), opts)
            })
        }),
        jobs,
    );
    for scn in &scenarios {
        let mut bad = Vec::new();
        for seed in seeds.clone() {
            let Some((recorder, result)) = results.next().await else {
                break;
            };
            let r = match &result {
                Ok(o) if o.passed() => {
                    passed += 1;
                    report::ScenarioReport::from_outcome(&o)
                }
                Ok(o) => {
                    failed += 1;
                    drivelab::out!("{}", report::console(&o));
                    bad.push(seed);
                    report::ScenarioReport::from_outcome(&o)
                }
                Err(e) => {
                    failed += 1;
                    let replay = engine::replay_command(scn, seed, &mutants);
                    drivelab::outln!("ERROR {} seed {seed}: {e:#}\n  replay: {replay}", scn.name);
                    bad.push(seed);
                    let names = mutants.iter().map(|m| m.name().to_string()).collect();
                    report::ScenarioReport::from_error(
                        &scn.name,
                        &scn.path.display().to_string(),
                        seed,
                        names,
                        replay,
                        format!("{e:#}"),
                    )
                }
            };
            complete_record(recorder, &r, result.as_ref().ok());
            if !r.passed {
                if let Some(dir) = &report_dir {
                    let mut r = r;
                    r.dir = format!("{}-seed-{seed}", r.dir);
                    if let Err(e) = report::write_scenario(dir, &r) {
                        eprintln!("drivelab: writing the report for {}: {e}", r.scenario);
                    }
                    failing.push(r);
                }
            }
        }
        if bad.is_empty() {
            drivelab::outln!("PASS {} under seeds {from}..{}", scn.name, from + n - 1);
        } else {
            drivelab::outln!("FAIL {} under seeds {:?}", scn.name, bad);
        }
    }
    if let Some(dir) = &report_dir {
        let names: Vec<String> = mutants.iter().map(|m| m.name().to_string()).collect();
        let mut replay = report::cli::replay_all(
            &select.paths,
            None,
            &names,
            select.filter.as_deref(),
            select.partition,
        );
        replay.push_str(&format!(" --seed {from} --seeds {n}"));
        replay.push_str(&driver_flag(&scenarios));
        let title = format!(
            "sweep of {} scenarios x {n} seeds: {failed} failing runs of {} (only those are listed)",
            scenarios.len(),
            passed + failed
        );
        if let Err(e) = report::write_index(dir, &report::RunMeta { title, replay }, &failing) {
            eprintln!(
                "drivelab: writing the report index in {}: {e}",
                dir.display()
            );
        }
    }
    drivelab::outln!(
        "\nsweep of {} scenarios x {n} seeds in {:.1}s",
        scenarios.len(),
        started.elapsed().as_secs_f64()
    );
    drivelab::outln!("{passed} passed, {failed} failed");
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The mutation test and its kill table.
/// A scenario's size: its steps, counting each step of a `concurrent:` block.
fn scenario_steps(scn: &scenario::Scenario) -> usize {
    fn size(step: &scenario::Step) -> usize {
        match step {
            scenario::Step::Concurrent(inner) => inner.iter().map(size).sum(),
            _ => 1,
        }
    }
    scn.steps.iter().map(|s| size(&s.value)).sum()
}

/// Scenarios this big run against a mutant only if no smaller one killed it:
/// a scale scenario against a driver that fails every call retries for minutes
/// of real time (the 100-volume churn: 3 minutes of `make test`) and adds
/// nothing to a kill already made.
const LARGE_SCENARIO_STEPS: usize = 100;

/// Runs `jobs` (scenario, mutants) at a time, answers in input order. The kill
/// table is every mutant against every scenario of its driver: one at a time it
/// was most of `make test`'s run time, and the runs share nothing but the process.
/// The biggest scenarios start first, so the one long run (a 100-volume churn
/// against a driver that fails every call) is not the tail everyone waits for.
async fn run_batch(
    runs: Vec<(scenario::Scenario, Vec<Mutant>)>,
    seed: Option<u64>,
    jobs: usize,
) -> Vec<anyhow::Result<engine::RunOutcome>> {
    use futures_util::stream::{self, StreamExt};
    let mut runs: Vec<_> = runs.into_iter().enumerate().collect();
    runs.sort_by_key(|(i, (scn, _))| (std::cmp::Reverse(scenario_steps(scn)), *i));
    let mut done: Vec<(usize, anyhow::Result<engine::RunOutcome>)> = stream::iter(runs)
        .map(|(i, (scn, mutants))| async move {
            let opts = engine::RunOptions {
                seed,
                mutants,
                ..Default::default()
            };
            (
                i,
                engine::run_isolated(std::sync::Arc::new(scn), opts).await,
            )
        })
        .buffer_unordered(jobs.max(1))
        .collect()
        .await;
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Runs each (mutant, scenario) pair and adds what each run broke to `kills`.
async fn tally(
    pairs: Vec<(Mutant, &scenario::Scenario)>,
    seed: Option<u64>,
    jobs: usize,
    kills: &mut std::collections::BTreeMap<Mutant, Vec<String>>,
) {
    let batch = pairs
        .iter()
        .map(|(m, s)| ((*s).clone(), vec![*m]))
        .collect();
    for ((m, scn), res) in pairs.iter().zip(run_batch(batch, seed, jobs).await) {
        let entry = kills.entry(*m).or_default();
        match res {
            Ok(o) => {
                let mut what: Vec<&str> = o
                    .verdicts
                    .iter()
                    .filter(|v| !v.passed)
                    .map(|v| v.invariant)
                    .collect();
                if !o.expect_failures.is_empty() {
                    what.push("expect");
                }
                if !what.is_empty() {
                    entry.push(format!("{} → {}", o.scenario, what.join(", ")));
                }
            }
            Err(e) => entry.push(format!("{} → lab error ({e})", scn.name)),
        }
    }
}

async fn mutate(paths: Vec<PathBuf>, only: Vec<Mutant>, seed: Option<u64>) -> ExitCode {
    let scenarios = match load_all(&paths, None, None) {
        Ok(s) => s,
        Err(c) => return c,
    };
    let jobs = engine::default_jobs();
    // Kills only mean something if the correct driver passes everything.
    let mut baseline_ok = true;
    let baseline = scenarios.iter().map(|s| (s.clone(), vec![])).collect();
    for (scn, res) in scenarios.iter().zip(run_batch(baseline, seed, jobs).await) {
        match res {
            Ok(o) if o.passed() => {}
            Ok(o) => {
                baseline_ok = false;
                drivelab::out!("{}", report::console(&o));
            }
            Err(e) => {
                baseline_ok = false;
                drivelab::outln!("ERROR {}: {e:#}", scn.name);
            }
        }
    }
    if !baseline_ok {
        drivelab::outln!(
            "\nthe correct driver fails the suite: fix that before reading any kill table"
        );
        return ExitCode::from(1);
    }
    let mutants: Vec<Mutant> = if only.is_empty() {
        Mutant::all().to_vec()
    } else {
        only
    };
    // A mutant lives in one driver: only that driver's scenarios can kill it.
    let pairs: Vec<(Mutant, &scenario::Scenario)> = mutants
        .iter()
        .flat_map(|m| {
            scenarios
                .iter()
                .filter(|s| s.driver.builtin() == Some(m.driver()))
                .map(move |s| (*m, s))
        })
        .collect();
    let (small, large): (Vec<_>, Vec<_>) = pairs
        .into_iter()
        .partition(|(_, s)| scenario_steps(s) < LARGE_SCENARIO_STEPS);
    let mut kills: std::collections::BTreeMap<Mutant, Vec<String>> = Default::default();
    tally(small, seed, jobs, &mut kills).await;
    let (large, skipped): (Vec<_>, Vec<_>) = large
        .into_iter()
        .partition(|(m, _)| kills.get(m).is_none_or(Vec::is_empty));
    tally(large, seed, jobs, &mut kills).await;
    let mut not_run: std::collections::BTreeMap<Mutant, usize> = Default::default();
    for (m, _) in skipped {
        *not_run.entry(m).or_default() += 1;
    }
    let mut survivors = Vec::new();
    drivelab::outln!("| mutant | killed by (scenario → invariant) |");
    drivelab::outln!("|---|---|");
    for m in &mutants {
        let kills = kills.remove(m).unwrap_or_default();
        if kills.is_empty() {
            survivors.push(m.name());
            drivelab::outln!("| {} | **SURVIVED** |", m.name());
        } else {
            let shown: Vec<&str> = kills.iter().take(4).map(String::as_str).collect();
            let mut more = if kills.len() > 4 {
                format!("<br>(+{} more scenarios)", kills.len() - 4)
            } else {
                String::new()
            };
            if let Some(n) = not_run.get(m) {
                more.push_str(&format!(
                    "<br>({n} scenario(s) of {LARGE_SCENARIO_STEPS}+ steps not run: already killed)"
                ));
            }
            drivelab::outln!("| {} | {}{more} |", m.name(), shown.join("<br>"));
        }
    }
    let killed = mutants.len() - survivors.len();
    drivelab::outln!("\n{killed} of {} mutants killed", mutants.len());
    if survivors.is_empty() {
        drivelab::outln!("{killed} passed, 0 failed");
        ExitCode::SUCCESS
    } else {
        drivelab::outln!("survivors: {}", survivors.join(", "));
        drivelab::outln!("{killed} passed, {} failed", survivors.len());
        ExitCode::from(1)
    }
}

/// `drivelab explore`.
async fn explore(
    path: PathBuf,
    driver: Option<String>,
    opts: drivelab::explore::ExploreOptions,
) -> ExitCode {
    let mut scn = match scenario::load(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Err(c) = drive_with(std::slice::from_mut(&mut scn), driver.as_deref()) {
        return c;
    }
    match drivelab::explore::explore(&scn, &opts).await {
        Ok(r) => {
            drivelab::explore::print(&r, &opts.stream);
            if r.found.is_some() || r.first_failure_after.is_some() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("drivelab: explore: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `drivelab sweep-faults`.
async fn sweep_faults(
    path: PathBuf,
    driver: Option<String>,
    opts: drivelab::explore::sweep::SweepOptions,
    report_dir: Option<PathBuf>,
    expect_found: bool,
) -> ExitCode {
    let mut scn = match scenario::load(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Err(c) = drive_with(std::slice::from_mut(&mut scn), driver.as_deref()) {
        return c;
    }
    let r = match drivelab::explore::sweep::sweep(&scn, &opts).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("drivelab: sweep-faults: {e:#}");
            return ExitCode::from(2);
        }
    };
    drivelab::explore::sweep::print(&r);
    if let Some(dir) = report_dir {
        let file = dir.join("sweep.md");
        if let Err(e) = std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&file, drivelab::explore::sweep::markdown(&r)))
        {
            eprintln!("drivelab: writing {}: {e}", file.display());
            return ExitCode::from(2);
        }
        drivelab::outln!("report: {}", file.display());
    }
    let lab_errors = r
        .runs
        .iter()
        .any(|x| matches!(x.verdict, drivelab::explore::sweep::RunVerdict::LabError(_)));
    match (r.failures() > 0, expect_found) {
        _ if lab_errors => ExitCode::from(2),
        (true, false) | (false, true) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    }
}

/// `drivelab serve --system csi`: the BOSH backend and the nodes' mount
/// tables, every endpoint and credential printed, until SIGINT/SIGTERM.
async fn serve_csi(config: Option<PathBuf>, ports: bool, faults: bool) -> ExitCode {
    if ports || faults {
        eprintln!("drivelab: serve --system csi: --ports and --faults are not implemented for the CSI system yet (its fakes listen on free ports, with no faults)");
        return ExitCode::from(2);
    }
    let spec = match config {
        None => scenario::bosh::parse_section(std::path::Path::new("<defaults>"), "{}")
            .map_err(|e| e.to_string()),
        Some(p) => std::fs::read_to_string(&p)
            .map_err(|e| format!("{}: cannot read the file: {e}", p.display()))
            .and_then(|t| scenario::bosh::parse_section(&p, &t).map_err(|e| e.to_string())),
    };
    let spec = match spec {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let served = match systems::csi::ServedCsi::start(&spec).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("drivelab: serve: {e:#}");
            return ExitCode::from(2);
        }
    };
    drivelab::outln!("drivelab serve: the CSI system's BOSH backend is up (Ctrl-C to stop)");
    for (k, v) in served.banner() {
        drivelab::outln!("{k}: {v}");
    }
    drivelab::outln!("ready");
    let why = until_stopped().await;
    let calls = drivelab_fakes::history::calls(&served.history.events()).len();
    served.stop().await;
    drivelab::outln!("drivelab serve: {why}, stopped cleanly after {calls} call(s)");
    ExitCode::SUCCESS
}

/// Wait for SIGINT or SIGTERM; which one came.
async fn until_stopped() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

/// `drivelab serve`: print where everything is, then run until SIGINT/SIGTERM.
async fn serve(
    config: Option<PathBuf>,
    ports: systems::cosi::serve::Ports,
    faults: Option<PathBuf>,
) -> ExitCode {
    let config = match config.as_deref().map(systems::cosi::serve::load_config) {
        None => systems::cosi::serve::ServeConfig {
            driver_name: cosi_s3::DRIVER_NAME.into(),
            ..Default::default()
        },
        Some(Ok(c)) => c,
        Some(Err(e)) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let faults = match faults.as_deref().map(systems::cosi::serve::load_faults) {
        None => Vec::new(),
        Some(Ok(f)) => f,
        Some(Err(e)) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let armed = faults.len();
    let served = match systems::cosi::serve::start(&config, ports, faults).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("drivelab: serve: {e:#}");
            return ExitCode::from(2);
        }
    };
    drivelab::outln!("drivelab serve: the fakes are up (Ctrl-C to stop)");
    drivelab::outln!("s3_endpoint: {}", served.s3_url);
    let prefix = match config.backend {
        drivelab_fakes::s3::Backend::Rustfs => "rustfs",
        drivelab_fakes::s3::Backend::Minio => "minio",
    };
    drivelab::outln!("s3_backend: {}", config.backend);
    drivelab::outln!("admin_url: {}/{prefix}/admin/v3/", served.s3_url);
    drivelab::outln!("kube_url: {}", served.kube_url);
    drivelab::outln!("kubeconfig: {}", served.kubeconfig.display());
    drivelab::outln!("kube_token: {}", served.kube_token.expose());
    drivelab::outln!("admin_kubeconfig: {}", served.admin_kubeconfig.display());
    drivelab::outln!("kube_ca_file: {}", served.kube_ca_file.display());
    drivelab::outln!(
        "kube_ca_data: {}",
        base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            served.kube_ca_pem()
        )
    );
    drivelab::outln!("admin_access_key: {}", served.admin_access_key);
    drivelab::outln!("admin_secret_key: {}", served.admin_secret.expose());
    drivelab::outln!(
        "admin_secret: {}/{} (Kubernetes Secret with accessKey, secretKey)",
        systems::cosi::ADMIN_SECRET_NAMESPACE,
        systems::cosi::ADMIN_SECRET_NAME
    );
    drivelab::outln!("faults_armed: {armed}");
    drivelab::outln!("ready");
    let why = until_stopped().await;
    let calls = drivelab_fakes::history::calls(&served.history.events()).len();
    served.stop().await;
    drivelab::outln!("drivelab serve: {why}, stopped cleanly after {calls} call(s)");
    ExitCode::SUCCESS
}
