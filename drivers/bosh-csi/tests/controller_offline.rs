//! The controller with no Director behind it: request validation answers
//! before any Director call, and an unreachable Director is UNAVAILABLE (so
//! the sidecars retry) rather than a verdict.

use std::path::PathBuf;
use std::time::Duration;

use bosh_csi::{DriverConfig, Mode, Secret};
use drivelab_proto::csi::{
    controller_client::ControllerClient, identity_client::IdentityClient, volume_capability,
    CapacityRange, ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest,
    CreateVolumeRequest, DeleteVolumeRequest, GetPluginCapabilitiesRequest, GetPluginInfoRequest,
    ProbeRequest, VolumeCapability,
};
use tonic::transport::Channel;
use tonic::Code;

use volume_capability::access_mode::Mode as M;

struct Offline {
    ctl: ControllerClient<Channel>,
    id: IdentityClient<Channel>,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start() -> Offline {
    let dir = tempfile::tempdir().unwrap();
    let socket: PathBuf = dir.path().join("csi.sock");
    let config = DriverConfig {
        mode: Mode::Controller,
        // Nothing listens on port 1.
        director_url: "http://127.0.0.1:1".into(),
        client_id: "bosh-csi".into(),
        client_secret: Secret::new("not-logged"),
        http_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let s = socket.clone();
    tokio::spawn(async move {
        bosh_csi::serve_unix(config, &s, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let mut channel = None;
    for _ in 0..500 {
        if let Ok(c) = drivelab_fakes::csi::connect_unix(&socket).await {
            channel = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let channel = channel.expect("driver socket");
    Offline {
        ctl: ControllerClient::new(channel.clone()),
        id: IdentityClient::new(channel),
        _dir: dir,
        _stop: stop,
    }
}

fn cap(mode: M) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(Default::default())),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn create(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(M::SingleNodeWriter)],
        parameters: [
            ("disk_pool_name".to_string(), "default".to_string()),
            ("deployment_name".to_string(), "k8s".to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_without_a_director() {
    let mut o = start().await;
    let bad = [
        CreateVolumeRequest {
            name: String::new(),
            ..create("pvc-1")
        },
        CreateVolumeRequest {
            volume_capabilities: vec![],
            ..create("pvc-1")
        },
        CreateVolumeRequest {
            volume_capabilities: vec![cap(M::MultiNodeMultiWriter)],
            ..create("pvc-1")
        },
        CreateVolumeRequest {
            parameters: Default::default(),
            ..create("pvc-1")
        },
        CreateVolumeRequest {
            capacity_range: Some(CapacityRange {
                required_bytes: 10,
                limit_bytes: 5,
            }),
            ..create("pvc-1")
        },
    ];
    for req in bad {
        let e = o.ctl.create_volume(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    }
    let e = o
        .ctl
        .create_volume(CreateVolumeRequest {
            capacity_range: Some(CapacityRange {
                required_bytes: 0,
                limit_bytes: 1000,
            }),
            ..create("pvc-1")
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e}");
    let e = o
        .ctl
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: "csi-0123456789abcdef0123456789abcdef".into(),
            node_id: String::new(),
            volume_capability: Some(cap(M::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    // Ids this driver never issues: delete/unpublish OK, publish NOT_FOUND, no Director call needed.
    o.ctl
        .delete_volume(DeleteVolumeRequest {
            volume_id: "someone-elses-disk".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    o.ctl
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: "someone-elses-disk".into(),
            node_id: "n".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let e = o
        .ctl
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: "someone-elses-disk".into(),
            node_id: "n".into(),
            volume_capability: Some(cap(M::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
}

#[tokio::test]
async fn unreachable_director_is_unavailable() {
    let mut o = start().await;
    let e = o.ctl.create_volume(create("pvc-1")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(
        !e.message().contains("not-logged"),
        "the client secret leaked: {e}"
    );
    let e = o
        .ctl
        .delete_volume(DeleteVolumeRequest {
            volume_id: "csi-0123456789abcdef0123456789abcdef".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
}

#[tokio::test]
async fn identity() {
    let mut o = start().await;
    let info =
        o.id.get_plugin_info(GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
    assert_eq!(info.name, bosh_csi::DRIVER_NAME);
    assert!(!info.vendor_version.is_empty());
    let caps =
        o.id.get_plugin_capabilities(GetPluginCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner();
    assert_eq!(caps.capabilities.len(), 1, "CONTROLLER_SERVICE");
    // Ready even with the Director down: an outage must not get the plugin restarted.
    assert_eq!(
        o.id.probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
}
