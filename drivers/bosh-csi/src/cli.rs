//! Command-line parsing for the `bosh-csi` binary, in the library so that
//! `drivelab driver bosh-csi ARGS...` can hand its arguments over unchanged.
//! Parsed by hand like cosi-s3's: a dozen flags do not justify a parser crate.

use std::path::PathBuf;

use anyhow::{bail, Context as _};

use crate::config::{parse_duration, DriverConfig, Mode, Mutant};
use crate::secret::Secret;

/// Default socket, where a kubelet-style deployment mounts the plugin dir.
pub const DEFAULT_ENDPOINT: &str = "unix:///csi/csi.sock";

/// Usage text.
pub const USAGE: &str = "usage: bosh-csi [--endpoint unix:///path.sock] [--mode controller|node|all] [flags]
  --endpoint URL            Unix socket to serve CSI on (env CSI_ENDPOINT; default unix:///csi/csi.sock)
  --mode MODE               controller, node or all (default all)
controller:
  --director-url URL        BOSH Director, http://host:port (env BOSH_DIRECTOR_URL)
  --uaa-url URL             UAA base URL (default: what the Director's /info advertises)
  --client-id ID            UAA client (env BOSH_CLIENT)
  --client-secret SECRET    UAA client secret (env BOSH_CLIENT_SECRET; prefer the env var)
  --poll-interval DUR       Director task polling interval (default 1s; e.g. 5ms)
  --task-timeout DUR        give up waiting for a task after this (default 5m) with DEADLINE_EXCEEDED
  --http-timeout DUR        bound on each HTTP call (default 10s)
  --block-api-url URL       the IaaS block API for changed-block metadata (default: not served)
  --block-api-credential C  its credential (env BLOCK_API_CREDENTIAL; prefer the env var)
  --session-ttl DUR         lifetime of a snapshot-metadata session token (default 10m)
node:
  --node-id ID              this node = the BOSH instance id
  --mounter-url URL         the lab's mount table, http://host:port (default: real mount(8))
  --max-volumes-per-node N  reported by NodeGetInfo (default 0 = no limit)
  --mutant NAME             switch on a seeded bug; repeatable; --list-mutants shows them";

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
    let mut director_url = None;
    let mut client_id = None;
    let mut client_secret = None;
    let mut block_credential = None;
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
        let dur = |name: &str, v: String| {
            parse_duration(&v)
                .with_context(|| format!("{name} {v:?} is not a duration like 5ms, 2s or 1m"))
        };
        match flag.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "--list-mutants" => {
                for m in Mutant::all() {
                    println!("{:28} {}", m.name(), m.describe());
                }
                return Ok(None);
            }
            "--endpoint" => endpoint = Some(value("--endpoint")?),
            "--mode" => {
                let v = value("--mode")?;
                config.mode = Mode::parse(&v)
                    .with_context(|| format!("--mode {v:?}: use controller, node or all"))?;
            }
            "--director-url" => director_url = Some(value("--director-url")?),
            "--uaa-url" => config.uaa_url = value("--uaa-url")?,
            "--client-id" => client_id = Some(value("--client-id")?),
            "--client-secret" => client_secret = Some(Secret::new(value("--client-secret")?)),
            "--poll-interval" => {
                config.poll_interval = dur("--poll-interval", value("--poll-interval")?)?
            }
            "--task-timeout" => {
                config.task_timeout = dur("--task-timeout", value("--task-timeout")?)?
            }
            "--http-timeout" => {
                config.http_timeout = dur("--http-timeout", value("--http-timeout")?)?
            }
            "--block-api-url" => config.block_api_url = value("--block-api-url")?,
            "--block-api-credential" => {
                block_credential = Some(Secret::new(value("--block-api-credential")?))
            }
            "--session-ttl" => config.session_ttl = dur("--session-ttl", value("--session-ttl")?)?,
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
    config.director_url = director_url
        .or_else(|| env("BOSH_DIRECTOR_URL"))
        .unwrap_or_default();
    config.client_id = client_id.or_else(|| env("BOSH_CLIENT")).unwrap_or_default();
    config.client_secret = client_secret
        .or_else(|| env("BOSH_CLIENT_SECRET").map(Secret::new))
        .unwrap_or_default();
    config.block_api_credential = block_credential
        .or_else(|| env("BLOCK_API_CREDENTIAL").map(Secret::new))
        .unwrap_or_default();
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
    use std::time::Duration;

    fn p(a: &[&str]) -> anyhow::Result<Option<Invocation>> {
        parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_a_controller() {
        let i = p(&[
            "--endpoint=unix:///tmp/c.sock",
            "--mode",
            "controller",
            "--director-url",
            "http://127.0.0.1:25555",
            "--client-id",
            "csi",
            "--client-secret=s3cr3t",
            "--poll-interval",
            "5ms",
            "--mutant",
            "admin-token",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(i.socket, PathBuf::from("/tmp/c.sock"));
        assert_eq!(i.config.mode, Mode::Controller);
        assert_eq!(i.config.poll_interval, Duration::from_millis(5));
        assert_eq!(i.config.client_secret.expose(), "s3cr3t");
        assert_eq!(i.config.mutants, vec![Mutant::AdminToken]);
        assert!(!format!("{i:?}").contains("s3cr3t"));
    }

    #[test]
    fn parses_a_node() {
        let i = p(&[
            "--endpoint",
            "unix:///tmp/n.sock",
            "--mode=node",
            "--node-id",
            "abc-1",
            "--mounter-url",
            "http://127.0.0.1:9",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(i.config.node_id, "abc-1");
        assert_eq!(i.config.mounter_url, "http://127.0.0.1:9");
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            &["--bogus"][..],
            &["--mode", "both"],
            &["--mode", "node"],
            &[
                "--mode",
                "node",
                "--node-id",
                "n",
                "--endpoint",
                "/tmp/x.sock",
            ],
            &["--mode", "node", "--node-id", "n", "--mutant", "nope"],
            &[
                "--mode",
                "node",
                "--node-id",
                "n",
                "--poll-interval",
                "fast",
            ],
            &["--mode", "controller", "--director-url", "http://x:1"],
            &["--endpoint"],
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
