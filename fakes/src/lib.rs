//! The lab's fakes. Each is a library with an in-process API (for the engine,
//! checks and snapshots) and a real listener on 127.0.0.1 or a Unix socket,
//! so unmodified clients talk to it over the wire protocol.

pub mod clock;
pub mod cosi_sidecar;
pub mod cpi;
pub mod csi;
pub mod director;
pub mod gate;
pub mod history;
pub mod json;
pub mod json_text;
pub mod kube;
pub mod misbehave;
pub mod ops;
pub mod record;
pub mod s3;
pub mod secret;
pub mod serve;
pub mod shared;
pub mod store;
pub mod tls;
