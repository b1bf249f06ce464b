//! `cosi-s3` as a separate process, so crash tests can SIGKILL a real driver:
//! `cosi-s3 --endpoint unix:///path.sock [--kube-url URL] [--state-namespace NS]
//! [--policy-layout LAYOUT] [--secret-length N] [--mutant NAME]...`.
//! Arguments are parsed by hand: six flags do not justify a parser crate.

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use cosi_s3::{DriverConfig, Mutant, PolicyLayout, SECRET_LENGTHS};

const USAGE: &str = "usage: cosi-s3 [--endpoint unix:///path.sock] [--kube-url https://host:port [--kube-token-file PATH] [--kube-ca-file PATH]] [--state-namespace NS] [--policy-layout LAYOUT] [--secret-length N] [--mutant NAME]...
  --endpoint         Unix socket to serve COSI on (env COSI_ENDPOINT; default unix:///var/lib/cosi/cosi.sock)
  --kube-url         Kubernetes API base URL (env KUBE_URL; else the cluster of $KUBECONFIG)
  --kube-token-file  with --kube-url: file holding the bearer token (env KUBE_TOKEN_FILE)
  --kube-ca-file     with an https --kube-url: PEM file of the CA to trust (env KUBE_CA_FILE)
  --state-namespace  namespace for checkpoints (default cosi-s3-system)
  --policy-layout    per-grant (default: one access policy per grant) or
                     per-grant-with-owner-marker (plus an owner-marker policy per grant);
                     both are correct designs, not seeded bugs
  --secret-length N  characters of each secret key it generates (16-128; default 40)
  --mutant NAME      switch on a seeded bug; repeatable; --list-mutants shows them";

struct Args {
    socket: PathBuf,
    config: DriverConfig,
}

fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path = endpoint
        .strip_prefix("unix://")
        .with_context(|| format!("--endpoint {endpoint:?} must be unix:///absolute/path.sock"))?;
    if path.is_empty() {
        bail!("--endpoint {endpoint:?} has no path; use unix:///absolute/path.sock");
    }
    Ok(PathBuf::from(path))
}

fn parse_args(args: impl IntoIterator<Item = String>) -> anyhow::Result<Option<Args>> {
    let mut endpoint = None;
    let mut config = DriverConfig::default();
    let mut kube_url = None;
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
                    println!("{:28} {}", m.name(), m.describe());
                }
                return Ok(None);
            }
            "--endpoint" => endpoint = Some(value("--endpoint")?),
            "--kube-url" => kube_url = Some(value("--kube-url")?),
            "--kube-token-file" => config.kube_token_file = value("--kube-token-file")?,
            "--kube-ca-file" => config.kube_ca_file = value("--kube-ca-file")?,
            "--state-namespace" => config.state_namespace = value("--state-namespace")?,
            "--policy-layout" => {
                let v = value("--policy-layout")?;
                config.policy_layout = PolicyLayout::parse(&v).with_context(|| {
                    let names: Vec<_> = PolicyLayout::all().iter().map(|l| l.name()).collect();
                    format!("unknown policy layout {v:?}; known: {}", names.join(", "))
                })?;
            }
            "--secret-length" => {
                let v = value("--secret-length")?;
                config.secret_length = v
                    .parse()
                    .ok()
                    .filter(|n| SECRET_LENGTHS.contains(n))
                    .with_context(|| {
                        format!(
                            "--secret-length {v:?}: a number of characters from {} to {}",
                            SECRET_LENGTHS.start(),
                            SECRET_LENGTHS.end()
                        )
                    })?;
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
        .or_else(|| {
            std::env::var("COSI_ENDPOINT")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "unix:///var/lib/cosi/cosi.sock".to_string());
    if config.kube_token_file.is_empty() {
        config.kube_token_file = std::env::var("KUBE_TOKEN_FILE").unwrap_or_default();
    }
    if config.kube_ca_file.is_empty() {
        config.kube_ca_file = std::env::var("KUBE_CA_FILE").unwrap_or_default();
    }
    let kubeconfig = std::env::var_os("KUBECONFIG").filter(|s| !s.is_empty());
    config.kube_url = match kube_url.or_else(|| std::env::var("KUBE_URL").ok().filter(|s| !s.is_empty())) {
        Some(u) => u,
        // Empty: the driver reads KUBECONFIG the way kube-rs does.
        None if kubeconfig.is_some() => String::new(),
        None => bail!("--kube-url (or KUBE_URL, or a KUBECONFIG) is required: the Kubernetes API where checkpoints live\n{USAGE}"),
    };
    Ok(Some(Args {
        socket: socket_path(&endpoint)?,
        config,
    }))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    match term {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let Some(args) = parse_args(std::env::args().skip(1))? else {
        return Ok(());
    };
    if !args.config.mutants.is_empty() {
        let names: Vec<_> = args.config.mutants.iter().map(|m| m.name()).collect();
        tracing::warn!(mutants = %names.join(","), "seeded bugs switched on: this is NOT the correct driver");
    }
    cosi_s3::serve_unix(args.config, &args.socket, shutdown_signal()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> anyhow::Result<Option<Args>> {
        parse_args(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_flags() {
        let a = parse(&[
            "--endpoint",
            "unix:///tmp/x.sock",
            "--kube-url=http://127.0.0.1:1",
            "--mutant",
            "shared-policy",
            "--mutant=rotate-on-retry",
            "--state-namespace",
            "ns",
            "--policy-layout=per-grant-with-owner-marker",
            "--secret-length",
            "64",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(a.config.kube_url, "http://127.0.0.1:1");
        assert_eq!(a.config.state_namespace, "ns");
        assert_eq!(a.config.secret_length(), 64);
        assert_eq!(
            a.config.policy_layout,
            PolicyLayout::PerGrantWithOwnerMarker
        );
        assert_eq!(
            a.config.mutants,
            vec![Mutant::SharedPolicy, Mutant::RotateOnRetry]
        );
    }

    #[test]
    fn rejects_bad_input() {
        assert!(parse(&["--mutant", "nope", "--kube-url", "http://x:1"]).is_err());
        assert!(parse(&["--endpoint", "/tmp/x.sock", "--kube-url", "http://x:1"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["--policy-layout", "two", "--kube-url", "http://x:1"]).is_err());
        assert!(parse(&["--endpoint"]).is_err());
        for n in ["8", "129", "x"] {
            assert!(parse(&["--secret-length", n, "--kube-url", "http://x:1"]).is_err());
        }
    }
}
