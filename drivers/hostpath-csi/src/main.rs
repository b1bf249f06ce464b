//! `hostpath-csi` as its own process (a controller beside the provisioner and
//! attacher, one node plugin per node, or both on one socket); see
//! `hostpath-csi --help` and [`hostpath_csi::cli`] for the flags.

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
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
    let Some(inv) = hostpath_csi::cli::parse(std::env::args().skip(1))? else {
        return Ok(());
    };
    hostpath_csi::serve_unix(inv.config, &inv.socket, shutdown_signal()).await
}
