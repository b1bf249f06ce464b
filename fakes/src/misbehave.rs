//! A COSI driver that misbehaves on purpose — a TEST DRIVER, run as the hidden
//! `drivelab driver misbehave --mode MODE --endpoint unix://…`, so the lab's
//! handling of broken drivers (deadlines, garbage, a dying process, a log
//! flood) is tested through the real external-driver path.
//!
//! Every mode but `garbage` answers DriverGetInfo properly, so the sidecar
//! gets past start-up and meets the misbehaviour on the first provisioner call.

use std::io::Write;
use std::path::Path;

use drivelab_proto::cosi::identity_server::{Identity, IdentityServer};
use drivelab_proto::cosi::provisioner_server::{Provisioner, ProvisionerServer};
use drivelab_proto::cosi::{
    CredentialDetails, DriverCreateBucketRequest, DriverCreateBucketResponse,
    DriverDeleteBucketRequest, DriverDeleteBucketResponse, DriverGetInfoRequest,
    DriverGetInfoResponse, DriverGrantBucketAccessRequest, DriverGrantBucketAccessResponse,
    DriverRevokeBucketAccessRequest, DriverRevokeBucketAccessResponse,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::{Request, Response, Status};

/// The name every mode reports.
pub const DRIVER_NAME: &str = "misbehave.drivelab.test";

/// Lines the `flood` mode writes to each of stdout and stderr.
pub const FLOOD_LINES: usize = 100_000;

/// How the driver misbehaves.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Provisioner calls never answer.
    Hang,
    /// The socket speaks no gRPC at all: junk bytes to every connection.
    Garbage,
    /// Valid gRPC, nonsense content: empty ids, no credentials.
    Nonsense,
    /// The process exits in the middle of the first provisioner call.
    Exit,
    /// Writes [`FLOOD_LINES`] lines (and one 1 MiB line) to stdout and stderr
    /// before opening its socket, then answers provisioner calls with UNAVAILABLE.
    Flood,
}

impl Mode {
    /// Parse `hang|garbage|nonsense|exit|flood`.
    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "hang" => Mode::Hang,
            "garbage" => Mode::Garbage,
            "nonsense" => Mode::Nonsense,
            "exit" => Mode::Exit,
            "flood" => Mode::Flood,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy)]
struct Misbehaving(Mode);

#[tonic::async_trait]
impl Identity for Misbehaving {
    async fn driver_get_info(
        &self,
        _req: Request<DriverGetInfoRequest>,
    ) -> Result<Response<DriverGetInfoResponse>, Status> {
        Ok(Response::new(DriverGetInfoResponse {
            name: DRIVER_NAME.into(),
        }))
    }
}

impl Misbehaving {
    /// What every provisioner call does before (or instead of) answering.
    async fn misbehave(&self, rpc: &str) -> Result<(), Status> {
        match self.0 {
            Mode::Hang => {
                println!("misbehave: {rpc} received; never answering");
                std::future::pending::<()>().await;
                Ok(())
            }
            Mode::Exit => {
                eprintln!("misbehave: {rpc} received; exiting mid-call");
                let _ = std::io::stderr().flush();
                std::process::exit(17);
            }
            Mode::Flood => Err(Status::unavailable(format!(
                "misbehave: {rpc}: the flood driver provisions nothing"
            ))),
            Mode::Nonsense | Mode::Garbage => {
                println!("misbehave: {rpc} received; answering nonsense");
                Ok(())
            }
        }
    }
}

#[tonic::async_trait]
impl Provisioner for Misbehaving {
    async fn driver_create_bucket(
        &self,
        _req: Request<DriverCreateBucketRequest>,
    ) -> Result<Response<DriverCreateBucketResponse>, Status> {
        self.misbehave("DriverCreateBucket").await?;
        Ok(Response::new(DriverCreateBucketResponse {
            bucket_id: String::new(),
            ..Default::default()
        }))
    }

    async fn driver_delete_bucket(
        &self,
        _req: Request<DriverDeleteBucketRequest>,
    ) -> Result<Response<DriverDeleteBucketResponse>, Status> {
        self.misbehave("DriverDeleteBucket").await?;
        Ok(Response::new(DriverDeleteBucketResponse::default()))
    }

    async fn driver_grant_bucket_access(
        &self,
        _req: Request<DriverGrantBucketAccessRequest>,
    ) -> Result<Response<DriverGrantBucketAccessResponse>, Status> {
        self.misbehave("DriverGrantBucketAccess").await?;
        let mut credentials = std::collections::HashMap::new();
        credentials.insert(
            "\u{0}nonsense".to_string(),
            CredentialDetails {
                secrets: [("accessKeyID".to_string(), String::new())]
                    .into_iter()
                    .collect(),
            },
        );
        Ok(Response::new(DriverGrantBucketAccessResponse {
            account_id: String::new(),
            credentials,
        }))
    }

    async fn driver_revoke_bucket_access(
        &self,
        _req: Request<DriverRevokeBucketAccessRequest>,
    ) -> Result<Response<DriverRevokeBucketAccessResponse>, Status> {
        self.misbehave("DriverRevokeBucketAccess").await?;
        Ok(Response::new(DriverRevokeBucketAccessResponse::default()))
    }
}

/// Write the flood from two threads and wait for both: the socket opens only
/// after the last line is out, so a lab that stopped reading (a full pipe
/// blocks the writer) shows as a driver that never starts.
fn flood() {
    let big = "x".repeat(1 << 20);
    let out = std::thread::spawn(move || {
        let mut o = std::io::stdout().lock();
        for i in 0..FLOOD_LINES {
            let _ = writeln!(o, "flood stdout line {i}");
        }
        let _ = writeln!(o, "{big}");
        let _ = writeln!(o, "flood: stdout done");
        let _ = o.flush();
    });
    let err = std::thread::spawn(move || {
        let mut e = std::io::stderr().lock();
        for i in 0..FLOOD_LINES {
            let _ = writeln!(e, "flood stderr line {i}");
        }
        let _ = writeln!(e, "flood: stderr done");
    });
    let _ = out.join();
    let _ = err.join();
}

async fn garbage(socket: &Path) -> std::io::Result<()> {
    let listener = tokio::net::UnixListener::bind(socket)?;
    println!("misbehave: garbage on {}", socket.display());
    loop {
        let (mut c, _) = listener.accept().await?;
        tokio::spawn(async move {
            // Not an HTTP/2 preface nor frames: a SETTINGS-looking header with
            // a nonsense length, then noise, then a close.
            let _ = c
                .write_all(b"\x00\xff\xff\x04\x00\x00\x00\x00\x00garbage\r\n\x07\x13\x37 not grpc")
                .await;
            let mut buf = [0u8; 1024];
            let _ =
                tokio::time::timeout(std::time::Duration::from_millis(200), c.read(&mut buf)).await;
            let _ = c.write_all(&[0xde, 0xad, 0xbe, 0xef]).await;
        });
    }
}

/// Serve `mode` on `socket` until the process is killed.
pub async fn serve(mode: Mode, socket: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(socket);
    if mode == Mode::Garbage {
        return Ok(garbage(socket).await?);
    }
    if mode == Mode::Flood {
        tokio::task::spawn_blocking(flood).await?;
    }
    let listener = tokio::net::UnixListener::bind(socket)?;
    println!("misbehave: {mode:?} driver on {}", socket.display());
    let d = Misbehaving(mode);
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(d))
        .add_service(ProvisionerServer::new(d))
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
        .await?;
    Ok(())
}
