//! `drivelab cpi`: the fake CPI as an external executable, the way the
//! Director's external CPI caller runs one — one JSON request on stdin, one
//! `{result, error, log}` reply on stdout, state in sled between invocations.
//!
//! Fault markers, like the Director's test CPI: a file `fail_<method>` in
//! `<state-dir>/markers/` makes that method fail (its content, if any, is the
//! `{type, message, ok_to_retry}` to answer); `pause_<method>` holds the call
//! until the file is removed (so a test can keep the Director inside a task).
//! Every request is appended to `<state-dir>/calls.jsonl` with its context.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use super::{CpiConfig, CpiCore, CpiFault, ErrorType};
use crate::store::SledStore;

/// Where the external CPI keeps its state and how the IaaS is shaped.
#[derive(Clone, Debug, Default)]
pub struct ExternalOptions {
    /// The sled directory (and markers/, calls.jsonl).
    pub state_dir: PathBuf,
    /// The IaaS's shape.
    pub config: CpiConfig,
}

/// A CPI config file (`drivelab cpi --config FILE`): `{"state_dir": ..., "cpi": {...}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    state_dir: PathBuf,
    #[serde(default)]
    cpi: CpiConfig,
}

/// Read options from a CPI config file.
pub fn options_from_file(path: &Path) -> Result<ExternalOptions, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read CPI config {}: {e}", path.display()))?;
    let f: ConfigFile = serde_json::from_str(&text)
        .map_err(|e| format!("CPI config {} is not valid: {e}", path.display()))?;
    Ok(ExternalOptions {
        state_dir: f.state_dir,
        config: f.cpi,
    })
}

#[derive(Debug, Deserialize)]
struct Request {
    method: String,
    #[serde(default)]
    arguments: Vec<Value>,
    #[serde(default)]
    context: Value,
    #[serde(default)]
    api_version: Option<u64>,
}

/// The reply, with all three keys always present.
fn reply(result: Result<Value, CpiFault>, log: String) -> Value {
    match result {
        Ok(v) => json!({"result": v, "error": null, "log": log}),
        Err(f) => json!({
            "result": null,
            "error": {"type": f.error_type, "message": f.message, "ok_to_retry": f.ok_to_retry},
            "log": log,
        }),
    }
}

/// Handle one request from `input` and write the reply to `output`. Never
/// panics on bad input: a malformed request gets a `CpiError` reply.
pub fn run_stdio(
    opts: &ExternalOptions,
    mut input: impl Read,
    mut output: impl Write,
) -> std::io::Result<()> {
    let mut raw = Vec::new();
    input.read_to_end(&mut raw)?;
    let (result, log) = handle(opts, &raw);
    let mut body = serde_json::to_vec(&reply(result, log))?;
    body.push(b'\n');
    output.write_all(&body)?;
    output.flush()
}

fn parse_request(raw: &[u8]) -> Result<Request, CpiFault> {
    serde_json::from_slice(raw).map_err(|e| {
        CpiFault::new(
            ErrorType::CpiError,
            format!("Must provide a JSON request with 'method', 'arguments' and 'context': {e}"),
            false,
        )
    })
}

/// The reply to one stdin request against `core`, without the state dir
/// (no markers, no call log, no sled): the parser and dispatcher alone, for
/// the `cpi_json` fuzz target.
pub fn answer(core: &CpiCore, raw: &[u8]) -> Value {
    let r = parse_request(raw).and_then(|req| core.dispatch(&req.method, &req.arguments));
    reply(r, String::new())
}

fn handle(opts: &ExternalOptions, raw: &[u8]) -> (Result<Value, CpiFault>, String) {
    let mut log = String::new();
    let req: Request = match parse_request(raw) {
        Ok(r) => r,
        Err(f) => return (Err(f), log),
    };
    let request_id = req
        .context
        .get("request_id")
        .and_then(Value::as_str)
        .unwrap_or("-")
        .to_string();
    log.push_str(&format!(
        "fake cpi: {} request_id={request_id} api_version={}\n",
        req.method,
        req.api_version.unwrap_or(1)
    ));
    if let Err(e) = std::fs::create_dir_all(&opts.state_dir) {
        return (
            Err(CpiFault::new(
                ErrorType::CloudError,
                format!("cannot create state dir {}: {e}", opts.state_dir.display()),
                true,
            )),
            log,
        );
    }
    record_call(&opts.state_dir, &req);
    if let Some(f) = marker_fault(&opts.state_dir, &req.method) {
        log.push_str("fake cpi: failing by marker\n");
        return (Err(f), log);
    }
    wait_while_paused(&opts.state_dir, &req.method, &mut log);
    let db = match open_db(&opts.state_dir.join("db")) {
        Ok(db) => db,
        Err(e) => {
            return (
                Err(CpiFault::new(
                    ErrorType::CloudError,
                    format!("cannot open IaaS state: {e}"),
                    true,
                )),
                log,
            )
        }
    };
    let store = match SledStore::open(&db, "cpi") {
        Ok(s) => Arc::new(s),
        Err(e) => {
            return (
                Err(CpiFault::new(ErrorType::CloudError, e.to_string(), true)),
                log,
            )
        }
    };
    let core = CpiCore::new(store, opts.config.clone());
    let r = core.dispatch(&req.method, &req.arguments);
    if let Err(e) = db.flush() {
        return (
            Err(CpiFault::new(
                ErrorType::CloudError,
                format!("flushing IaaS state failed: {e}"),
                true,
            )),
            log,
        );
    }
    (r, log)
}

/// Concurrent Director calls run concurrent processes; sled admits one per
/// directory, so wait our turn (the IaaS's API serialises them too).
fn open_db(dir: &Path) -> Result<sled::Db, sled::Error> {
    crate::store::open_sled(&sled::Config::new().path(dir), Duration::from_secs(60))
}

fn record_call(dir: &Path, req: &Request) {
    let line = json!({
        "method": req.method,
        "arguments": req.arguments,
        "context": req.context,
        "api_version": req.api_version,
    });
    let res = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("calls.jsonl"))
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = res {
        tracing::debug!(error = %e, "cannot record the CPI call");
    }
}

fn marker_fault(dir: &Path, method: &str) -> Option<CpiFault> {
    let path = dir.join("markers").join(format!("fail_{method}"));
    let text = std::fs::read_to_string(path).ok()?;
    let default = CpiFault::new(
        ErrorType::CloudError,
        format!("'{method}' failed by marker"),
        false,
    );
    if text.trim().is_empty() {
        return Some(default);
    }
    Some(serde_json::from_str(&text).unwrap_or(default))
}

fn wait_while_paused(dir: &Path, method: &str, log: &mut String) {
    let path = dir.join("markers").join(format!("pause_{method}"));
    if !path.exists() {
        return;
    }
    log.push_str("fake cpi: paused by marker\n");
    let start = Instant::now();
    while path.exists() && start.elapsed() < Duration::from_secs(600) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The `drivelab cpi` entry point: stdin → stdout; exit code 0 unless stdout
/// itself fails (the Director ignores the exit code and reads the reply).
pub fn main(state_dir: Option<PathBuf>, config: Option<PathBuf>) -> std::process::ExitCode {
    let opts = match (state_dir, config) {
        (_, Some(path)) => match options_from_file(&path) {
            Ok(o) => o,
            Err(msg) => {
                let r = reply(
                    Err(CpiFault::new(ErrorType::CpiError, msg, false)),
                    String::new(),
                );
                println!("{r}");
                return std::process::ExitCode::from(1);
            }
        },
        (Some(dir), None) => ExternalOptions {
            state_dir: dir,
            config: CpiConfig::default(),
        },
        (None, None) => {
            let r = reply(
                Err(CpiFault::new(
                    ErrorType::CpiError,
                    "drivelab cpi needs --state-dir DIR or --config FILE",
                    false,
                )),
                String::new(),
            );
            println!("{r}");
            return std::process::ExitCode::from(2);
        }
    };
    match run_stdio(&opts, std::io::stdin().lock(), std::io::stdout().lock()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drivelab cpi: {e}");
            std::process::ExitCode::from(3)
        }
    }
}
