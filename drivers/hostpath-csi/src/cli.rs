//! Command-line parsing for the `hostpath-csi` binary, in the library so that
//! `drivelab driver hostpath-csi ARGS...` can hand its arguments over unchanged.
//! Parsed by hand like bosh-csi's: a handful of flags do not justify a parser crate.

use std::path::PathBuf;

use anyhow::{bail, Context as _};

use crate::config::{DriverConfig, Mode, Mutant};

/// Default socket, where a kubelet-style deployment mounts the plugin dir.
pub const DEFAULT_ENDPOINT: &str = "unix:///csi/csi.sock";

/// Usage text.
pub const USAGE: &str = "usage: hostpath-csi --state-dir DIR [--endpoint unix:///path.sock] [--mode controller|node|all] [flags]
  --endpoint URL            Unix socket to serve CSI on (env CSI_ENDPOINT; default unix:///csi/csi.sock)
  --mode MODE               controller, node or all (default all)
  --state-dir DIR           required: the backend. Volume directories, snapshots and the driver's
                            state live here; controller and node processes on one host share it
node:
  --node-id ID              this node's id (required for node and all)
  --mounter-url URL         the lab's node mount table, http://host:port (required for node and
                            all: this driver never touches the host's real mount table)
  --max-volumes-per-node N  reported by NodeGetInfo and enforced by ControllerPublish (default 0 = no limit)
  --mutant NAME             switch on a seeded bug; repeatable; --list-mutants shows them
  --list-mutants            print the seeded bugs and exit
  -h, --help                print this and exit";

/// What the command line asks for.
#[derive(Debug)]
pub struct Invocation {
    /// Socket path to serve on.
    pub socket: PathBuf,
    /// Driver configuration.
    pub config: DriverConfig,
}

/// The path of a `unix://` endpoint.
pub fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path = endpoint
        .strip_prefix("unix://")
        .with_context(|| format!("--endpoint {endpoint:?} must be unix:///absolute/path.sock"))?;
    if path.is_empty() {
        bail!("--endpoint {endpoint:?} has no path; use unix:///absolute/path.sock");
    }
    Ok(PathBuf::from(path))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

/// Parse arguments (without the program name). `Ok(None)`: help or the
/// mutant list was printed, nothing to serve.
pub fn parse(args: impl IntoIterator<Item = String>) -> anyhow::Result<Option<Invocation>> {
    let mut endpoint = None;
    let mut config = DriverConfig::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> anyhow::Result<String> {
            match inline.clone().or_else(|| it.next()) {
                Some(v) => Ok(v),
                None => bail!("{name} needs a value\n{USAGE}"),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "--list-mutants" => {
                for m in Mutant::all() {
                    println!("{:26} {}", m.name(), m.describe());
                }
                return Ok(None);
            }
            "--endpoint" => endpoint = Some(value("--endpoint")?),
            "--mode" => {
                let v = value("--mode")?;
                config.mode = Mode::parse(&v)
                    .with_context(|| format!("--mode {v:?}: use controller, node or all"))?;
            }
            "--state-dir" => config.state_dir = PathBuf::from(value("--state-dir")?),
            "--node-id" => config.node_id = value("--node-id")?,
            "--mounter-url" => config.mounter_url = value("--mounter-url")?,
            "--max-volumes-per-node" => {
                let v = value("--max-volumes-per-node")?;
                config.max_volumes_per_node = v
                    .parse()
                    .ok()
                    .filter(|n: &i64| *n >= 0)
                    .with_context(|| format!("--max-volumes-per-node {v:?} is not a count"))?;
            }
            "--mutant" => {
                let v = value("--mutant")?;
                let m = Mutant::parse(&v).with_context(|| {
                    let names: Vec<_> = Mutant::all().iter().map(|m| m.name()).collect();
                    format!("unknown mutant {v:?}; known: {}", names.join(", "))
                })?;
                if !config.mutants.contains(&m) {
                    config.mutants.push(m);
                }
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let endpoint = endpoint
        .or_else(|| env("CSI_ENDPOINT"))
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("{e}\n{USAGE}"))?;
    Ok(Some(Invocation {
        socket: socket_path(&endpoint)?,
        config,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn full_command_line() {
        let inv = parse(args(&[
            "--endpoint=unix:///tmp/hp.sock",
            "--mode",
            "node",
            "--state-dir",
            "/tmp/hp",
            "--node-id",
            "node-a",
            "--mounter-url",
            "http://127.0.0.1:9",
            "--max-volumes-per-node",
            "3",
            "--mutant",
            "attach-steals",
            "--mutant=attach-steals",
            "--mutant",
            "delete-leaves-data",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(inv.socket, PathBuf::from("/tmp/hp.sock"));
        assert_eq!(inv.config.mode, Mode::Node);
        assert_eq!(inv.config.state_dir, PathBuf::from("/tmp/hp"));
        assert_eq!(inv.config.max_volumes_per_node, 3);
        assert_eq!(
            inv.config.mutants,
            vec![Mutant::AttachSteals, Mutant::DeleteLeavesData]
        );
    }

    #[test]
    fn bad_flags_are_errors_not_panics() {
        for (bad, needle) in [
            (vec!["--bogus"], "unknown argument"),
            (vec!["--mode"], "needs a value"),
            (vec!["--mode", "both"], "--mode"),
            (vec!["--mode", "controller"], "--state-dir"),
            (
                vec!["--state-dir", "/x", "--mutant", "nope"],
                "unknown mutant",
            ),
            (
                vec!["--state-dir", "/x", "--max-volumes-per-node", "-1"],
                "not a count",
            ),
            (vec!["--state-dir", "/x", "--node-id", "n"], "--mounter-url"),
            (
                vec![
                    "--state-dir",
                    "/x",
                    "--mode",
                    "controller",
                    "--endpoint",
                    "tcp://x",
                ],
                "unix://",
            ),
        ] {
            let e = parse(args(&bad)).unwrap_err();
            assert!(format!("{e:#}").contains(needle), "{bad:?}: {e:#}");
        }
        assert!(parse(args(&["--help"])).unwrap().is_none());
        assert!(parse(args(&["--list-mutants"])).unwrap().is_none());
    }
}
