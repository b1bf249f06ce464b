//! The sweep's cases, in the order they run: identity and capabilities,
//! missing required fields per RPC, the volume lifecycle through the node
//! (with idempotency, NOT_FOUND and the attach limit), snapshots and
//! restore, listings and paging, and "advertised ⇒ implemented".

use std::collections::{BTreeSet, HashMap};

use drivelab_fakes::csi::kubelet::{staging_path, target_path};
use drivelab_fakes::csi::{self as fcsi, capability};
use drivelab_proto::csi;
use drivelab_proto::csi::controller_service_capability::rpc::Type as Ctl;
use drivelab_proto::csi::node_service_capability::rpc::Type as NodeCap;
use drivelab_proto::csi::volume_capability::access_mode::Mode;

use super::client::{code_of, expect_code, said, Sweeper};
use super::{SweepCase, SweepTarget};

/// A name of the CSI maximum length the spec asks plugins to accept (128 bytes).
const MAX_NAME: usize = 128;

/// What the sweep learnt of the driver before the cases that depend on it.
struct Known {
    ctl: BTreeSet<i32>,
    node: BTreeSet<i32>,
    node_id: String,
    max_volumes: i64,
}

impl Known {
    fn has(&self, c: Ctl) -> bool {
        self.ctl.contains(&(c as i32))
    }
    fn node_has(&self, c: NodeCap) -> bool {
        self.node.contains(&(c as i32))
    }
}

/// Run every case against the driver; the cases, in order, and what the
/// sweep's calls made and removed.
pub(crate) async fn run(
    t: &SweepTarget,
    gate: drivelab_fakes::gate::Gate,
) -> (Vec<SweepCase>, super::SweepLedger) {
    let ctl = fcsi::connect_unix(&t.controller).await;
    let node = fcsi::connect_unix(&t.node.socket).await;
    let (ctl, node) = match (ctl, node) {
        (Ok(c), Ok(n)) => (c, n),
        (c, n) => {
            let why = format!(
                "the sweep could not reach the driver (controller: {}, node: {})",
                c.err().map_or("ok".into(), |e| e.to_string()),
                n.err().map_or("ok".into(), |e| e.to_string())
            );
            let case = SweepCase {
                id: "connect".into(),
                rule: "the plugin serves its gRPC endpoint".into(),
                outcome: super::CaseOutcome::Fail,
                detail: why,
                calls: Vec::new(),
            };
            return (vec![case], Default::default());
        }
    };
    let mut s = Sweeper::new(gate, ctl, node, t.call_timeout, t.hook.clone());
    let known = identity(&mut s).await;
    missing_fields(&mut s, t, &known).await;
    lifecycle(&mut s, t, &known).await;
    snapshots(&mut s, t, &known).await;
    clone_cases(&mut s, t, &known).await;
    implemented(&mut s, &known).await;
    (s.cases, s.ledger)
}

fn cap(t: &SweepTarget) -> csi::VolumeCapability {
    capability(false, &t.fs_type, &[], Mode::SingleNodeWriter)
}

fn create_req(t: &SweepTarget, name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(t)],
        parameters: t.parameters.clone(),
        ..Default::default()
    }
}

const GIB: i64 = 1 << 30;

/// Identity, capabilities and NodeGetInfo: what every later case depends on.
async fn identity(s: &mut Sweeper) -> Known {
    use drivelab_fakes::csi::{
        CONTROLLER_GET_CAPABILITIES, GET_PLUGIN_CAPABILITIES, GET_PLUGIN_INFO,
        NODE_GET_CAPABILITIES, NODE_GET_INFO, PROBE,
    };
    let info = s
        .identity(GET_PLUGIN_INFO, false, |mut c| async move {
            c.get_plugin_info(csi::GetPluginInfoRequest {}).await
        })
        .await;
    let mut fails = Vec::new();
    match &info {
        Ok(i) if i.name.is_empty() || i.vendor_version.is_empty() => fails.push(format!(
            "name {:?} and vendor_version {:?}: both are REQUIRED",
            i.name, i.vendor_version
        )),
        Ok(_) => {}
        Err(_) => fails.push(format!("GetPluginInfo answered {}", said(&info))),
    }
    s.judge(
        "identity.plugin-info",
        "GetPluginInfo: name and vendor_version are REQUIRED in the response",
        fails,
        "name and vendor_version set".into(),
    );
    let mut fails = Vec::new();
    for node_side in [false, true] {
        let r = s
            .identity(PROBE, node_side, |mut c| async move {
                c.probe(csi::ProbeRequest {}).await
            })
            .await;
        expect_code(&mut fails, "Probe", &r, "OK");
        let r = s
            .identity(GET_PLUGIN_CAPABILITIES, node_side, |mut c| async move {
                c.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
                    .await
            })
            .await;
        expect_code(&mut fails, "GetPluginCapabilities", &r, "OK");
    }
    s.judge(
        "identity.probe-and-capabilities",
        "Probe and GetPluginCapabilities: every plugin MUST implement them (Identity Service RPC)",
        fails,
        "Probe and GetPluginCapabilities OK on controller and node".into(),
    );
    let caps = s
        .ctl(CONTROLLER_GET_CAPABILITIES, "", |mut c| async move {
            c.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await
        })
        .await;
    let node_caps = s
        .node(NODE_GET_CAPABILITIES, "", |mut c| async move {
            c.node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
                .await
        })
        .await;
    let info = s
        .node(NODE_GET_INFO, "", |mut c| async move {
            c.node_get_info(csi::NodeGetInfoRequest {}).await
        })
        .await;
    let mut fails = Vec::new();
    expect_code(&mut fails, "ControllerGetCapabilities", &caps, "OK");
    expect_code(&mut fails, "NodeGetCapabilities", &node_caps, "OK");
    let ctl: BTreeSet<i32> = caps
        .map(|r| r.capabilities)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(csi::controller_service_capability::Type::Rpc(r)) => Some(r.r#type),
            None => None,
        })
        .collect();
    let node: BTreeSet<i32> = node_caps
        .map(|r| r.capabilities)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(csi::node_service_capability::Type::Rpc(r)) => Some(r.r#type),
            None => None,
        })
        .collect();
    let (node_id, max_volumes) = match &info {
        Ok(i) => (i.node_id.clone(), i.max_volumes_per_node),
        Err(_) => (String::new(), 0),
    };
    if node_id.is_empty() {
        fails.push(format!(
            "NodeGetInfo: node_id is REQUIRED, got {}",
            said(&info)
        ));
    }
    if max_volumes < 0 {
        fails.push(format!(
            "NodeGetInfo: max_volumes_per_node {max_volumes} is negative"
        ));
    }
    s.judge("capabilities-and-node-info", "ControllerGetCapabilities, NodeGetCapabilities, NodeGetInfo: MUST be implemented; node_id is REQUIRED; max_volumes_per_node MUST NOT be negative", fails, format!("{} controller and {} node capabilities; node id set; max_volumes_per_node {max_volumes}", ctl.len(), node.len()));
    Known {
        ctl,
        node,
        node_id,
        max_volumes,
    }
}

/// Each RPC with one required field left out at a time: INVALID_ARGUMENT.
async fn missing_fields(s: &mut Sweeper, t: &SweepTarget, k: &Known) {
    use drivelab_fakes::csi::*;
    const RULE: &str = "a REQUIRED field left out: the plugin MUST answer 3 INVALID_ARGUMENT (Error Scheme; each RPC's message marks its REQUIRED fields)";
    let vcap = cap(t);
    // CreateVolume
    if k.has(Ctl::CreateDeleteVolume) {
        let mut f = Vec::new();
        let mut no_name = create_req(t, "", GIB);
        no_name.name.clear();
        let r = s
            .ctl(CREATE_VOLUME, "", |mut c| async move {
                c.create_volume(no_name).await
            })
            .await;
        expect_code(&mut f, "CreateVolume without name", &r, "INVALID_ARGUMENT");
        let mut no_caps = create_req(t, "csi-spec-missing-caps", GIB);
        no_caps.volume_capabilities.clear();
        let r = s
            .ctl(CREATE_VOLUME, "csi-spec-missing-caps", |mut c| async move {
                c.create_volume(no_caps).await
            })
            .await;
        expect_code(
            &mut f,
            "CreateVolume without volume_capabilities",
            &r,
            "INVALID_ARGUMENT",
        );
        let r = s
            .ctl(DELETE_VOLUME, "", |mut c| async move {
                c.delete_volume(csi::DeleteVolumeRequest::default()).await
            })
            .await;
        expect_code(
            &mut f,
            "DeleteVolume without volume_id",
            &r,
            "INVALID_ARGUMENT",
        );
        s.judge("missing-field.create-delete-volume", RULE, f, "CreateVolume (name, volume_capabilities) and DeleteVolume (volume_id) refuse a missing field".into());
    } else {
        s.not_applicable(
            "missing-field.create-delete-volume",
            RULE,
            "CREATE_DELETE_VOLUME not advertised",
        );
    }
    // ValidateVolumeCapabilities: every controller implements it.
    let mut f = Vec::new();
    let req = csi::ValidateVolumeCapabilitiesRequest {
        volume_capabilities: vec![vcap.clone()],
        ..Default::default()
    };
    let r = s
        .ctl(VALIDATE_VOLUME_CAPABILITIES, "", |mut c| async move {
            c.validate_volume_capabilities(req).await
        })
        .await;
    expect_code(
        &mut f,
        "ValidateVolumeCapabilities without volume_id",
        &r,
        "INVALID_ARGUMENT",
    );
    let req = csi::ValidateVolumeCapabilitiesRequest {
        volume_id: "csi-spec-any".into(),
        ..Default::default()
    };
    let r = s
        .ctl(
            VALIDATE_VOLUME_CAPABILITIES,
            "csi-spec-any",
            |mut c| async move { c.validate_volume_capabilities(req).await },
        )
        .await;
    expect_code(
        &mut f,
        "ValidateVolumeCapabilities without volume_capabilities",
        &r,
        "INVALID_ARGUMENT",
    );
    s.judge(
        "missing-field.validate-volume-capabilities",
        RULE,
        f,
        "ValidateVolumeCapabilities refuses a missing volume_id or volume_capabilities".into(),
    );
    if k.has(Ctl::PublishUnpublishVolume) {
        let mut f = Vec::new();
        let base = csi::ControllerPublishVolumeRequest {
            volume_id: "csi-spec-any".into(),
            node_id: k.node_id.clone(),
            volume_capability: Some(vcap.clone()),
            ..Default::default()
        };
        for (field, req) in [
            (
                "volume_id",
                csi::ControllerPublishVolumeRequest {
                    volume_id: String::new(),
                    ..base.clone()
                },
            ),
            (
                "node_id",
                csi::ControllerPublishVolumeRequest {
                    node_id: String::new(),
                    ..base.clone()
                },
            ),
            (
                "volume_capability",
                csi::ControllerPublishVolumeRequest {
                    volume_capability: None,
                    ..base.clone()
                },
            ),
        ] {
            let r = s
                .ctl(CONTROLLER_PUBLISH_VOLUME, "", |mut c| async move {
                    c.controller_publish_volume(req).await
                })
                .await;
            expect_code(
                &mut f,
                &format!("ControllerPublishVolume without {field}"),
                &r,
                "INVALID_ARGUMENT",
            );
        }
        let req = csi::ControllerUnpublishVolumeRequest {
            node_id: k.node_id.clone(),
            ..Default::default()
        };
        let r = s
            .ctl(CONTROLLER_UNPUBLISH_VOLUME, "", |mut c| async move {
                c.controller_unpublish_volume(req).await
            })
            .await;
        expect_code(
            &mut f,
            "ControllerUnpublishVolume without volume_id",
            &r,
            "INVALID_ARGUMENT",
        );
        s.judge("missing-field.controller-publish", RULE, f, "ControllerPublishVolume (volume_id, node_id, volume_capability) and ControllerUnpublishVolume (volume_id) refuse a missing field".into());
    } else {
        s.not_applicable(
            "missing-field.controller-publish",
            RULE,
            "PUBLISH_UNPUBLISH_VOLUME not advertised",
        );
    }
    if k.has(Ctl::CreateDeleteSnapshot) {
        let mut f = Vec::new();
        let req = csi::CreateSnapshotRequest {
            source_volume_id: "csi-spec-any".into(),
            ..Default::default()
        };
        let r = s
            .ctl(CREATE_SNAPSHOT, "", |mut c| async move {
                c.create_snapshot(req).await
            })
            .await;
        expect_code(
            &mut f,
            "CreateSnapshot without name",
            &r,
            "INVALID_ARGUMENT",
        );
        let req = csi::CreateSnapshotRequest {
            name: "csi-spec-snap-missing".into(),
            ..Default::default()
        };
        let r = s
            .ctl(CREATE_SNAPSHOT, "", |mut c| async move {
                c.create_snapshot(req).await
            })
            .await;
        expect_code(
            &mut f,
            "CreateSnapshot without source_volume_id",
            &r,
            "INVALID_ARGUMENT",
        );
        let r = s
            .ctl(DELETE_SNAPSHOT, "", |mut c| async move {
                c.delete_snapshot(csi::DeleteSnapshotRequest::default())
                    .await
            })
            .await;
        expect_code(
            &mut f,
            "DeleteSnapshot without snapshot_id",
            &r,
            "INVALID_ARGUMENT",
        );
        s.judge("missing-field.snapshots", RULE, f, "CreateSnapshot (name, source_volume_id) and DeleteSnapshot (snapshot_id) refuse a missing field".into());
    } else {
        s.not_applicable(
            "missing-field.snapshots",
            RULE,
            "CREATE_DELETE_SNAPSHOT not advertised",
        );
    }
    missing_node_fields(s, t, k).await;
}

async fn missing_node_fields(s: &mut Sweeper, t: &SweepTarget, k: &Known) {
    use drivelab_fakes::csi::*;
    const RULE: &str = "a REQUIRED field left out: the plugin MUST answer 3 INVALID_ARGUMENT (Error Scheme; Node Service RPCs)";
    let vcap = cap(t);
    let staging = staging_path(&t.driver_name, "csi-spec-any");
    let target = target_path("csi-spec", "csi-spec-any");
    let mut f = Vec::new();
    if k.node_has(NodeCap::StageUnstageVolume) {
        let base = csi::NodeStageVolumeRequest {
            volume_id: "csi-spec-any".into(),
            staging_target_path: staging.clone(),
            volume_capability: Some(vcap.clone()),
            ..Default::default()
        };
        for (field, req) in [
            (
                "volume_id",
                csi::NodeStageVolumeRequest {
                    volume_id: String::new(),
                    ..base.clone()
                },
            ),
            (
                "staging_target_path",
                csi::NodeStageVolumeRequest {
                    staging_target_path: String::new(),
                    ..base.clone()
                },
            ),
            (
                "volume_capability",
                csi::NodeStageVolumeRequest {
                    volume_capability: None,
                    ..base.clone()
                },
            ),
        ] {
            let r = s
                .node(NODE_STAGE_VOLUME, "", |mut c| async move {
                    c.node_stage_volume(req).await
                })
                .await;
            expect_code(
                &mut f,
                &format!("NodeStageVolume without {field}"),
                &r,
                "INVALID_ARGUMENT",
            );
        }
        for (field, req) in [
            (
                "volume_id",
                csi::NodeUnstageVolumeRequest {
                    volume_id: String::new(),
                    staging_target_path: staging.clone(),
                },
            ),
            (
                "staging_target_path",
                csi::NodeUnstageVolumeRequest {
                    volume_id: "csi-spec-any".into(),
                    staging_target_path: String::new(),
                },
            ),
        ] {
            let r = s
                .node(NODE_UNSTAGE_VOLUME, "", |mut c| async move {
                    c.node_unstage_volume(req).await
                })
                .await;
            expect_code(
                &mut f,
                &format!("NodeUnstageVolume without {field}"),
                &r,
                "INVALID_ARGUMENT",
            );
        }
    }
    let base = csi::NodePublishVolumeRequest {
        volume_id: "csi-spec-any".into(),
        staging_target_path: staging.clone(),
        target_path: target.clone(),
        volume_capability: Some(vcap.clone()),
        ..Default::default()
    };
    for (field, req) in [
        (
            "volume_id",
            csi::NodePublishVolumeRequest {
                volume_id: String::new(),
                ..base.clone()
            },
        ),
        (
            "target_path",
            csi::NodePublishVolumeRequest {
                target_path: String::new(),
                ..base.clone()
            },
        ),
        (
            "volume_capability",
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..base.clone()
            },
        ),
    ] {
        let r = s
            .node(NODE_PUBLISH_VOLUME, "", |mut c| async move {
                c.node_publish_volume(req).await
            })
            .await;
        expect_code(
            &mut f,
            &format!("NodePublishVolume without {field}"),
            &r,
            "INVALID_ARGUMENT",
        );
    }
    for (field, req) in [
        (
            "volume_id",
            csi::NodeUnpublishVolumeRequest {
                volume_id: String::new(),
                target_path: target.clone(),
            },
        ),
        (
            "target_path",
            csi::NodeUnpublishVolumeRequest {
                volume_id: "csi-spec-any".into(),
                target_path: String::new(),
            },
        ),
    ] {
        let r = s
            .node(NODE_UNPUBLISH_VOLUME, "", |mut c| async move {
                c.node_unpublish_volume(req).await
            })
            .await;
        expect_code(
            &mut f,
            &format!("NodeUnpublishVolume without {field}"),
            &r,
            "INVALID_ARGUMENT",
        );
    }
    s.judge("missing-field.node", RULE, f, "NodeStage/NodeUnstage (when advertised) and NodePublish/NodeUnpublish refuse each missing field".into());
}

/// A volume's life through controller and node, each mutating call repeated.
async fn lifecycle(s: &mut Sweeper, t: &SweepTarget, k: &Known) {
    use drivelab_fakes::csi::*;
    if !k.has(Ctl::CreateDeleteVolume) {
        s.not_applicable(
            "lifecycle",
            "CreateVolume/DeleteVolume MUST be implemented with CREATE_DELETE_VOLUME",
            "CREATE_DELETE_VOLUME not advertised: no volume to take through its life",
        );
        return;
    }
    let Some(id) = create_volume_cases(s, t).await else {
        return;
    };
    validate_cases(s, t, &id).await;
    list_volume_cases(s, t, k, &id).await;
    let ctx = publish_cases(s, t, k, &id).await;
    node_cases(s, t, k, &id, ctx).await;
    if k.has(Ctl::PublishUnpublishVolume) {
        let mut f = Vec::new();
        for i in 0..2 {
            let req = csi::ControllerUnpublishVolumeRequest {
                volume_id: id.clone(),
                node_id: k.node_id.clone(),
                ..Default::default()
            };
            let r = s
                .ctl(CONTROLLER_UNPUBLISH_VOLUME, &id, |mut c| async move {
                    c.controller_unpublish_volume(req).await
                })
                .await;
            expect_code(
                &mut f,
                &format!("ControllerUnpublishVolume #{}", i + 1),
                &r,
                "OK",
            );
        }
        s.judge(
            "controller-unpublish.idempotent",
            "ControllerUnpublishVolume MUST be idempotent: not attached to the node → 0 OK",
            f,
            "OK twice".into(),
        );
    }
    let mut f = Vec::new();
    for i in 0..2 {
        let vid = id.clone();
        let r = s
            .ctl(DELETE_VOLUME, &id, |mut c| async move {
                c.delete_volume(csi::DeleteVolumeRequest {
                    volume_id: vid,
                    ..Default::default()
                })
                .await
            })
            .await;
        expect_code(&mut f, &format!("DeleteVolume #{}", i + 1), &r, "OK");
    }
    let r = s
        .ctl(DELETE_VOLUME, "csi-spec-unknown", |mut c| async move {
            c.delete_volume(csi::DeleteVolumeRequest {
                volume_id: "csi-spec-unknown-volume".into(),
                ..Default::default()
            })
            .await
        })
        .await;
    expect_code(&mut f, "DeleteVolume of an unknown id", &r, "OK");
    s.judge(
        "delete-volume.idempotent",
        "DeleteVolume MUST be idempotent: a volume that does not exist → 0 OK",
        f,
        "OK twice, and OK for an unknown id".into(),
    );
}

/// CreateVolume: OK, the same again, an incompatible size, a maximum-length name.
async fn create_volume_cases(s: &mut Sweeper, t: &SweepTarget) -> Option<String> {
    use drivelab_fakes::csi::*;
    let req = create_req(t, "csi-spec-a", GIB);
    let (r1, r2) = (req.clone(), req);
    let a = s
        .ctl(CREATE_VOLUME, "csi-spec-a", |mut c| async move {
            c.create_volume(r1).await
        })
        .await;
    let b = s
        .ctl(CREATE_VOLUME, "csi-spec-a", |mut c| async move {
            c.create_volume(r2).await
        })
        .await;
    let id_a = a
        .as_ref()
        .ok()
        .and_then(|r| r.volume.as_ref())
        .map(|v| v.volume_id.clone())
        .unwrap_or_default();
    let id_b = b
        .as_ref()
        .ok()
        .and_then(|r| r.volume.as_ref())
        .map(|v| v.volume_id.clone())
        .unwrap_or_default();
    let mut f = Vec::new();
    expect_code(&mut f, "CreateVolume", &a, "OK");
    expect_code(&mut f, "CreateVolume again", &b, "OK");
    if a.is_ok() && id_a.is_empty() {
        f.push("CreateVolume OK without a volume_id".into());
    }
    if a.is_ok() && b.is_ok() && id_a != id_b {
        f.push(format!(
            "the same CreateVolume twice gave two volumes: {id_a} and {id_b}"
        ));
    }
    s.judge("create-volume.idempotent", "CreateVolume MUST be idempotent: a volume with the name that is compatible → 0 OK with that volume", f, format!("volume {id_a}, the same on the second call"));
    if id_a.is_empty() {
        return None;
    }
    let big = create_req(t, "csi-spec-a", 64 * GIB);
    let r = s
        .ctl(CREATE_VOLUME, "csi-spec-a", |mut c| async move {
            c.create_volume(big).await
        })
        .await;
    let mut f = Vec::new();
    expect_code(
        &mut f,
        "CreateVolume of the name with 64Gi required",
        &r,
        "ALREADY_EXISTS",
    );
    if let Ok(v) = &r {
        let extra = v
            .volume
            .as_ref()
            .map(|v| v.volume_id.clone())
            .unwrap_or_default();
        if !extra.is_empty() && extra != id_a {
            let _ = delete(s, &extra).await;
        }
    }
    s.judge("create-volume.incompatible", "CreateVolume Errors: volume already exists but is incompatible (capacity_range) → 6 ALREADY_EXISTS", f, "ALREADY_EXISTS".into());
    let long: String = "csi-spec-"
        .chars()
        .chain(std::iter::repeat('n'))
        .take(MAX_NAME)
        .collect();
    let req = create_req(t, &long, GIB);
    let r = s
        .ctl(CREATE_VOLUME, &long, |mut c| async move {
            c.create_volume(req).await
        })
        .await;
    let mut f = Vec::new();
    expect_code(&mut f, "CreateVolume with a 128-byte name", &r, "OK");
    let lid = r
        .as_ref()
        .ok()
        .and_then(|r| r.volume.as_ref())
        .map(|v| v.volume_id.clone())
        .unwrap_or_default();
    if !lid.is_empty() {
        let d = delete(s, &lid).await;
        expect_code(&mut f, "DeleteVolume of it", &d, "OK");
    }
    s.judge("create-volume.max-name", "Size Limits: the plugin SHOULD accept names of up to 128 bytes (csi-test: maximum-length name)", f, "a 128-byte name created and deleted".into());
    Some(id_a)
}

async fn delete(s: &mut Sweeper, id: &str) -> super::client::Reply<csi::DeleteVolumeResponse> {
    let vid = id.to_string();
    s.ctl(drivelab_fakes::csi::DELETE_VOLUME, id, |mut c| async move {
        c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: vid,
            ..Default::default()
        })
        .await
    })
    .await
}

/// ValidateVolumeCapabilities: confirmed for the capability it was made with; NOT_FOUND for an unknown volume.
async fn validate_cases(s: &mut Sweeper, t: &SweepTarget, id: &str) {
    use drivelab_fakes::csi::VALIDATE_VOLUME_CAPABILITIES as V;
    let req = csi::ValidateVolumeCapabilitiesRequest {
        volume_id: id.to_string(),
        volume_capabilities: vec![cap(t)],
        parameters: t.parameters.clone(),
        ..Default::default()
    };
    let r = s
        .ctl(V, id, |mut c| async move {
            c.validate_volume_capabilities(req).await
        })
        .await;
    let mut f = Vec::new();
    expect_code(&mut f, "ValidateVolumeCapabilities", &r, "OK");
    if let Ok(v) = &r {
        match &v.confirmed {
            None => f.push(format!(
                "not confirmed for the capability the volume was created with: {:?}",
                v.message
            )),
            Some(c) if c.volume_capabilities.is_empty() => {
                f.push("confirmed without volume_capabilities (REQUIRED)".into())
            }
            Some(_) => {}
        }
    }
    s.judge("validate.confirmed", "ValidateVolumeCapabilities MUST be implemented and SHALL return confirmed only if all capabilities asked are supported", f, "confirmed".into());
    let req = csi::ValidateVolumeCapabilitiesRequest {
        volume_id: "csi-spec-unknown-volume".into(),
        volume_capabilities: vec![cap(t)],
        ..Default::default()
    };
    let r = s
        .ctl(V, "csi-spec-unknown-volume", |mut c| async move {
            c.validate_volume_capabilities(req).await
        })
        .await;
    let mut f = Vec::new();
    expect_code(
        &mut f,
        "ValidateVolumeCapabilities of an unknown volume",
        &r,
        "NOT_FOUND",
    );
    s.judge(
        "validate.not-found",
        "ValidateVolumeCapabilities Errors: volume does not exist → 5 NOT_FOUND",
        f,
        "NOT_FOUND".into(),
    );
}

/// ListVolumes (LIST_VOLUMES): the volume is listed; max_entries pages; a bad token is ABORTED.
async fn list_volume_cases(s: &mut Sweeper, t: &SweepTarget, k: &Known, id: &str) {
    use drivelab_fakes::csi::{CREATE_VOLUME, LIST_VOLUMES as L};
    const RULE: &str = "ListVolumes MUST be implemented with LIST_VOLUMES: it lists every volume; with max_entries it pages through next_token; an invalid starting_token → 10 ABORTED";
    if !k.has(Ctl::ListVolumes) {
        s.not_applicable("list-volumes.paging", RULE, "LIST_VOLUMES not advertised");
        return;
    }
    let req = create_req(t, "csi-spec-b", GIB);
    let b = s
        .ctl(CREATE_VOLUME, "csi-spec-b", |mut c| async move {
            c.create_volume(req).await
        })
        .await;
    let id_b = b
        .as_ref()
        .ok()
        .and_then(|r| r.volume.as_ref())
        .map(|v| v.volume_id.clone())
        .unwrap_or_default();
    let mut f = Vec::new();
    expect_code(&mut f, "CreateVolume of a second volume", &b, "OK");
    let mut all = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let req = csi::ListVolumesRequest {
            max_entries: 1,
            starting_token: token.clone(),
        };
        let r = s
            .ctl(L, "", |mut c| async move { c.list_volumes(req).await })
            .await;
        pages += 1;
        match r {
            Ok(p) => {
                if p.entries.len() > 1 {
                    f.push(format!(
                        "max_entries 1 answered {} entries",
                        p.entries.len()
                    ));
                }
                all.extend(
                    p.entries
                        .into_iter()
                        .filter_map(|e| e.volume)
                        .map(|v| v.volume_id),
                );
                if p.next_token.is_empty() || pages > 50 {
                    break;
                }
                token = p.next_token;
            }
            Err(e) => {
                f.push(format!("ListVolumes page {pages}: {}", said::<()>(&Err(e))));
                break;
            }
        }
    }
    for want in [id, id_b.as_str()] {
        if !want.is_empty() && !all.iter().any(|v| v == want) {
            f.push(format!(
                "volume {want} missing from the paged listing ({} pages)",
                pages
            ));
        }
    }
    let req = csi::ListVolumesRequest {
        max_entries: 0,
        starting_token: "csi-spec-not-a-token".into(),
    };
    let r = s
        .ctl(L, "", |mut c| async move { c.list_volumes(req).await })
        .await;
    expect_code(
        &mut f,
        "ListVolumes with an invalid starting_token",
        &r,
        "ABORTED",
    );
    if !id_b.is_empty() {
        let d = delete(s, &id_b).await;
        expect_code(&mut f, "DeleteVolume of the second volume", &d, "OK");
    }
    s.judge(
        "list-volumes.paging",
        RULE,
        f,
        format!("both volumes found over {pages} pages of one; a bad token ABORTED"),
    );
}

/// ControllerPublishVolume: NOT_FOUND for unknown volume and node, OK twice, RESOURCE_EXHAUSTED at the limit.
async fn publish_cases(
    s: &mut Sweeper,
    t: &SweepTarget,
    k: &Known,
    id: &str,
) -> HashMap<String, String> {
    use drivelab_fakes::csi::CONTROLLER_PUBLISH_VOLUME as P;
    if !k.has(Ctl::PublishUnpublishVolume) {
        let why = "PUBLISH_UNPUBLISH_VOLUME not advertised";
        s.not_applicable(
            "controller-publish.not-found",
            "ControllerPublishVolume Errors: unknown volume or node → 5 NOT_FOUND",
            why,
        );
        s.not_applicable(
            "controller-publish.idempotent",
            "ControllerPublishVolume MUST be idempotent",
            why,
        );
        s.not_applicable(
            "controller-publish.attach-limit",
            "ControllerPublishVolume Errors: max volumes attached → 8 RESOURCE_EXHAUSTED",
            why,
        );
        return HashMap::new();
    }
    let req = |vol: &str, node: &str| csi::ControllerPublishVolumeRequest {
        volume_id: vol.into(),
        node_id: node.into(),
        volume_capability: Some(cap(t)),
        ..Default::default()
    };
    let mut f = Vec::new();
    let r1 = req("csi-spec-unknown-volume", &k.node_id);
    let r = s
        .ctl(P, "csi-spec-unknown-volume", |mut c| async move {
            c.controller_publish_volume(r1).await
        })
        .await;
    expect_code(
        &mut f,
        "ControllerPublishVolume of an unknown volume",
        &r,
        "NOT_FOUND",
    );
    let r2 = req(id, "csi-spec-unknown-node");
    let r = s
        .ctl(P, id, |mut c| async move {
            c.controller_publish_volume(r2).await
        })
        .await;
    expect_code(
        &mut f,
        "ControllerPublishVolume to an unknown node",
        &r,
        "NOT_FOUND",
    );
    s.judge("controller-publish.not-found", "ControllerPublishVolume Errors: volume does not exist → 5 NOT_FOUND; node does not exist → 5 NOT_FOUND", f, "NOT_FOUND for both".into());
    let mut f = Vec::new();
    let (a, b) = (req(id, &k.node_id), req(id, &k.node_id));
    let x = s
        .ctl(P, id, |mut c| async move {
            c.controller_publish_volume(a).await
        })
        .await;
    let y = s
        .ctl(P, id, |mut c| async move {
            c.controller_publish_volume(b).await
        })
        .await;
    expect_code(&mut f, "ControllerPublishVolume", &x, "OK");
    expect_code(&mut f, "ControllerPublishVolume again", &y, "OK");
    let ctx = x
        .as_ref()
        .map(|r| r.publish_context.clone())
        .unwrap_or_default();
    if let (Ok(x), Ok(y)) = (&x, &y) {
        if x.publish_context != y.publish_context {
            f.push("the repeated publish answered another publish_context".into());
        }
    }
    s.judge("controller-publish.idempotent", "ControllerPublishVolume MUST be idempotent: already published to the node, compatible → 0 OK", f, "OK twice, same publish_context".into());
    attach_limit(s, t, k, id).await;
    ctx
}

/// Fill the node up to max_volumes_per_node (the sweep's volume is the first), then one more.
async fn attach_limit(s: &mut Sweeper, t: &SweepTarget, k: &Known, id: &str) {
    use drivelab_fakes::csi::{
        CONTROLLER_PUBLISH_VOLUME as P, CONTROLLER_UNPUBLISH_VOLUME as U, CREATE_VOLUME,
    };
    const RULE: &str = "ControllerPublishVolume Errors: the node already has max_volumes_per_node (NodeGetInfo) volumes attached → 8 RESOURCE_EXHAUSTED";
    if k.max_volumes <= 0 || k.max_volumes > 16 {
        s.not_applicable(
            "controller-publish.attach-limit",
            RULE,
            format!(
                "NodeGetInfo reports max_volumes_per_node {} (the sweep exercises 1..=16)",
                k.max_volumes
            ),
        );
        return;
    }
    let _ = id;
    let mut f = Vec::new();
    let mut extra = Vec::new();
    for i in 1..=k.max_volumes {
        let name = format!("csi-spec-limit-{i}");
        let req = create_req(t, &name, GIB);
        let r = s
            .ctl(CREATE_VOLUME, &name, |mut c| async move {
                c.create_volume(req).await
            })
            .await;
        match r.as_ref().ok().and_then(|r| r.volume.as_ref()) {
            Some(v) => extra.push(v.volume_id.clone()),
            None => f.push(format!("CreateVolume {name}: {}", said(&r))),
        }
    }
    // The sweep's own volume is attached: max_volumes - 1 more fill the node.
    let fill = (k.max_volumes - 1) as usize;
    for v in extra.iter().take(fill) {
        let req = csi::ControllerPublishVolumeRequest {
            volume_id: v.clone(),
            node_id: k.node_id.clone(),
            volume_capability: Some(cap(t)),
            ..Default::default()
        };
        let r = s
            .ctl(P, v, |mut c| async move {
                c.controller_publish_volume(req).await
            })
            .await;
        expect_code(
            &mut f,
            &format!("ControllerPublishVolume {v} (within the limit)"),
            &r,
            "OK",
        );
    }
    if let Some(over) = extra.get(fill) {
        let req = csi::ControllerPublishVolumeRequest {
            volume_id: over.clone(),
            node_id: k.node_id.clone(),
            volume_capability: Some(cap(t)),
            ..Default::default()
        };
        let r = s
            .ctl(P, over, |mut c| async move {
                c.controller_publish_volume(req).await
            })
            .await;
        expect_code(
            &mut f,
            &format!(
                "ControllerPublishVolume {over} (one over the limit of {})",
                k.max_volumes
            ),
            &r,
            "RESOURCE_EXHAUSTED",
        );
    }
    for v in &extra {
        let req = csi::ControllerUnpublishVolumeRequest {
            volume_id: v.clone(),
            node_id: k.node_id.clone(),
            ..Default::default()
        };
        let r = s
            .ctl(U, v, |mut c| async move {
                c.controller_unpublish_volume(req).await
            })
            .await;
        expect_code(
            &mut f,
            &format!("cleanup: ControllerUnpublishVolume {v}"),
            &r,
            "OK",
        );
        let d = delete(s, v).await;
        expect_code(&mut f, &format!("cleanup: DeleteVolume {v}"), &d, "OK");
    }
    s.judge(
        "controller-publish.attach-limit",
        RULE,
        f,
        format!(
            "{} volumes attached, the next one RESOURCE_EXHAUSTED",
            k.max_volumes
        ),
    );
}

/// NodeStage/NodePublish and their reverses, each twice; the target path appears and goes.
async fn node_cases(
    s: &mut Sweeper,
    t: &SweepTarget,
    k: &Known,
    id: &str,
    ctx: HashMap<String, String>,
) {
    use drivelab_fakes::csi::*;
    let staging = staging_path(&t.driver_name, id);
    let target = target_path("csi-spec", "csi-spec-a");
    let stage = k.node_has(NodeCap::StageUnstageVolume);
    let mut f = Vec::new();
    let unknown = csi::NodePublishVolumeRequest {
        volume_id: "csi-spec-unknown-volume".into(),
        staging_target_path: if stage {
            staging_path(&t.driver_name, "csi-spec-unknown-volume")
        } else {
            String::new()
        },
        target_path: target_path("csi-spec", "csi-spec-unknown"),
        volume_capability: Some(cap(t)),
        ..Default::default()
    };
    let r = s
        .node(
            NODE_PUBLISH_VOLUME,
            "csi-spec-unknown-volume",
            |mut c| async move { c.node_publish_volume(unknown).await },
        )
        .await;
    expect_code(
        &mut f,
        "NodePublishVolume of an unknown volume",
        &r,
        "NOT_FOUND",
    );
    s.judge(
        "node-publish.not-found",
        "NodePublishVolume Errors: volume does not exist → 5 NOT_FOUND",
        f,
        "NOT_FOUND".into(),
    );
    let mut f = Vec::new();
    if stage {
        for i in 0..2 {
            let req = csi::NodeStageVolumeRequest {
                volume_id: id.into(),
                publish_context: ctx.clone(),
                staging_target_path: staging.clone(),
                volume_capability: Some(cap(t)),
                ..Default::default()
            };
            let r = s
                .node(NODE_STAGE_VOLUME, id, |mut c| async move {
                    c.node_stage_volume(req).await
                })
                .await;
            expect_code(&mut f, &format!("NodeStageVolume #{}", i + 1), &r, "OK");
        }
        s.judge(
            "node-stage.idempotent",
            "NodeStageVolume MUST be idempotent: already staged at the path, compatible → 0 OK",
            f,
            "OK twice".into(),
        );
    } else {
        s.not_applicable(
            "node-stage.idempotent",
            "NodeStageVolume with STAGE_UNSTAGE_VOLUME",
            "STAGE_UNSTAGE_VOLUME not advertised",
        );
    }
    let mut f = Vec::new();
    for i in 0..2 {
        let req = csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            publish_context: ctx.clone(),
            staging_target_path: if stage {
                staging.clone()
            } else {
                String::new()
            },
            target_path: target.clone(),
            volume_capability: Some(cap(t)),
            ..Default::default()
        };
        let r = s
            .node(NODE_PUBLISH_VOLUME, id, |mut c| async move {
                c.node_publish_volume(req).await
            })
            .await;
        expect_code(&mut f, &format!("NodePublishVolume #{}", i + 1), &r, "OK");
    }
    let published = f.is_empty();
    if published && !(t.node.path_exists)(&target) {
        f.push(format!(
            "NodePublishVolume OK but {target} does not exist on the node"
        ));
    }
    s.judge("node-publish.creates-target", "NodePublishVolume MUST be idempotent, and the SP creates target_path (file or directory) and publishes the volume there", f, format!("OK twice; {target} exists"));
    let mut f = Vec::new();
    for i in 0..2 {
        let req = csi::NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.clone(),
        };
        let r = s
            .node(NODE_UNPUBLISH_VOLUME, id, |mut c| async move {
                c.node_unpublish_volume(req).await
            })
            .await;
        expect_code(&mut f, &format!("NodeUnpublishVolume #{}", i + 1), &r, "OK");
    }
    if !published {
        s.not_applicable("node-unpublish.removes-target", "NodeUnpublishVolume: the SP MUST delete the file or directory it created at target_path", "the publish before it failed");
    } else {
        if (t.node.path_exists)(&target) {
            f.push(format!(
                "NodeUnpublishVolume OK but {target} is still there"
            ));
        }
        s.judge("node-unpublish.removes-target", "NodeUnpublishVolume MUST be idempotent, and the SP MUST delete the file or directory it created at target_path", f, format!("OK twice; {target} gone"));
    }
    if stage {
        let mut f = Vec::new();
        for i in 0..2 {
            let req = csi::NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.clone(),
            };
            let r = s
                .node(NODE_UNSTAGE_VOLUME, id, |mut c| async move {
                    c.node_unstage_volume(req).await
                })
                .await;
            expect_code(&mut f, &format!("NodeUnstageVolume #{}", i + 1), &r, "OK");
        }
        s.judge(
            "node-unstage.idempotent",
            "NodeUnstageVolume MUST be idempotent: not staged at the path → 0 OK",
            f,
            "OK twice".into(),
        );
    }
}

/// Snapshots (CREATE_DELETE_SNAPSHOT): create twice, name clash, maximum name, listing, restore, delete twice.
async fn snapshots(s: &mut Sweeper, t: &SweepTarget, k: &Known) {
    use drivelab_fakes::csi::*;
    const RULE: &str = "CreateSnapshot/DeleteSnapshot MUST be implemented with CREATE_DELETE_SNAPSHOT and be idempotent";
    if !k.has(Ctl::CreateDeleteSnapshot) || !k.has(Ctl::CreateDeleteVolume) {
        for id in [
            "snapshot.idempotent",
            "snapshot.restore",
            "list-snapshots.filters-and-paging",
        ] {
            s.not_applicable(
                id,
                RULE,
                "CREATE_DELETE_SNAPSHOT (with CREATE_DELETE_VOLUME) not advertised",
            );
        }
        return;
    }
    let req = create_req(t, "csi-spec-snap-src", GIB);
    let v = s
        .ctl(CREATE_VOLUME, "csi-spec-snap-src", |mut c| async move {
            c.create_volume(req).await
        })
        .await;
    let vid = v
        .as_ref()
        .ok()
        .and_then(|r| r.volume.as_ref())
        .map(|v| v.volume_id.clone())
        .unwrap_or_default();
    let mut f = Vec::new();
    expect_code(&mut f, "CreateVolume of the source", &v, "OK");
    let snap = |name: &str, src: &str| csi::CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: src.into(),
        ..Default::default()
    };
    let (a, b) = (snap("csi-spec-snap", &vid), snap("csi-spec-snap", &vid));
    let x = s
        .ctl(CREATE_SNAPSHOT, "csi-spec-snap", |mut c| async move {
            c.create_snapshot(a).await
        })
        .await;
    let y = s
        .ctl(CREATE_SNAPSHOT, "csi-spec-snap", |mut c| async move {
            c.create_snapshot(b).await
        })
        .await;
    expect_code(&mut f, "CreateSnapshot", &x, "OK");
    expect_code(&mut f, "CreateSnapshot again", &y, "OK");
    let sid = x
        .as_ref()
        .ok()
        .and_then(|r| r.snapshot.as_ref())
        .map(|s| s.snapshot_id.clone())
        .unwrap_or_default();
    let sid2 = y
        .as_ref()
        .ok()
        .and_then(|r| r.snapshot.as_ref())
        .map(|s| s.snapshot_id.clone())
        .unwrap_or_default();
    if sid != sid2 {
        f.push(format!(
            "the same CreateSnapshot twice gave {sid:?} and {sid2:?}"
        ));
    }
    let long: String = "csi-spec-"
        .chars()
        .chain(std::iter::repeat('s'))
        .take(MAX_NAME)
        .collect();
    let lreq = snap(&long, &vid);
    let l = s
        .ctl(CREATE_SNAPSHOT, &long, |mut c| async move {
            c.create_snapshot(lreq).await
        })
        .await;
    expect_code(&mut f, "CreateSnapshot with a 128-byte name", &l, "OK");
    let lid = l
        .as_ref()
        .ok()
        .and_then(|r| r.snapshot.as_ref())
        .map(|s| s.snapshot_id.clone())
        .unwrap_or_default();
    let r = s
        .ctl(CREATE_SNAPSHOT, "csi-spec-snap", |mut c| async move {
            c.create_snapshot(snap("csi-spec-snap", "csi-spec-unknown-volume"))
                .await
        })
        .await;
    if code_of(&r) != "ALREADY_EXISTS" && code_of(&r) != "NOT_FOUND" {
        f.push(format!(
            "CreateSnapshot of the name from another source: answered {}, expected ALREADY_EXISTS",
            said(&r)
        ));
    }
    s.judge("snapshot.idempotent", "CreateSnapshot MUST be idempotent (same name and source → 0 OK, the same snapshot); the name from another source → 6 ALREADY_EXISTS; names of 128 bytes SHOULD be accepted", f, format!("snapshot {sid} twice; 128-byte name OK"));
    if !sid.is_empty() {
        list_snapshot_cases(s, k, &sid, &lid, &vid).await;
        restore_cases(s, t, &sid).await;
    }
    let mut f = Vec::new();
    for (i, id) in [&sid, &sid, &lid].into_iter().enumerate() {
        let req = csi::DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        };
        let r = s
            .ctl(DELETE_SNAPSHOT, id, |mut c| async move {
                c.delete_snapshot(req).await
            })
            .await;
        expect_code(&mut f, &format!("DeleteSnapshot #{}", i + 1), &r, "OK");
    }
    let req = csi::DeleteSnapshotRequest {
        snapshot_id: "csi-spec-unknown-snapshot".into(),
        ..Default::default()
    };
    let r = s
        .ctl(
            DELETE_SNAPSHOT,
            "csi-spec-unknown-snapshot",
            |mut c| async move { c.delete_snapshot(req).await },
        )
        .await;
    expect_code(&mut f, "DeleteSnapshot of an unknown id", &r, "OK");
    if !vid.is_empty() {
        let d = delete(s, &vid).await;
        expect_code(&mut f, "cleanup: DeleteVolume of the source", &d, "OK");
    }
    s.judge(
        "delete-snapshot.idempotent",
        "DeleteSnapshot MUST be idempotent: a snapshot that does not exist → 0 OK",
        f,
        "OK twice, and OK for an unknown id".into(),
    );
}

/// ListSnapshots (LIST_SNAPSHOTS): by id, by source, unknown id empty, paging.
async fn list_snapshot_cases(s: &mut Sweeper, k: &Known, sid: &str, lid: &str, vid: &str) {
    use drivelab_fakes::csi::LIST_SNAPSHOTS as L;
    const RULE: &str = "ListSnapshots MUST be implemented with LIST_SNAPSHOTS: snapshot_id and source_volume_id filter it (an unknown id → empty, not an error); max_entries pages through next_token";
    if !k.has(Ctl::ListSnapshots) {
        s.not_applicable(
            "list-snapshots.filters-and-paging",
            RULE,
            "LIST_SNAPSHOTS not advertised",
        );
        return;
    }
    let mut f = Vec::new();
    let ids = |r: &super::client::Reply<csi::ListSnapshotsResponse>| -> Vec<String> {
        r.as_ref()
            .map(|r| {
                r.entries
                    .iter()
                    .filter_map(|e| e.snapshot.as_ref())
                    .map(|s| s.snapshot_id.clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    let req = csi::ListSnapshotsRequest {
        snapshot_id: sid.into(),
        ..Default::default()
    };
    let r = s
        .ctl(L, sid, |mut c| async move { c.list_snapshots(req).await })
        .await;
    expect_code(&mut f, "ListSnapshots by snapshot_id", &r, "OK");
    if r.is_ok() && ids(&r) != vec![sid.to_string()] {
        f.push(format!(
            "ListSnapshots by snapshot_id {sid} listed {:?}",
            ids(&r)
        ));
    }
    let req = csi::ListSnapshotsRequest {
        source_volume_id: vid.into(),
        ..Default::default()
    };
    let r = s
        .ctl(L, vid, |mut c| async move { c.list_snapshots(req).await })
        .await;
    let mut by_src = ids(&r);
    by_src.sort();
    let mut want = vec![sid.to_string(), lid.to_string()];
    want.retain(|x| !x.is_empty());
    want.sort();
    if by_src != want {
        f.push(format!(
            "ListSnapshots by source_volume_id listed {by_src:?}, expected {want:?}"
        ));
    }
    let req = csi::ListSnapshotsRequest {
        snapshot_id: "csi-spec-unknown-snapshot".into(),
        ..Default::default()
    };
    let r = s
        .ctl(L, "", |mut c| async move { c.list_snapshots(req).await })
        .await;
    expect_code(&mut f, "ListSnapshots of an unknown snapshot_id", &r, "OK");
    if !ids(&r).is_empty() {
        f.push(format!(
            "ListSnapshots of an unknown snapshot_id listed {:?}",
            ids(&r)
        ));
    }
    let req = csi::ListSnapshotsRequest {
        max_entries: 1,
        ..Default::default()
    };
    let r = s
        .ctl(L, "", |mut c| async move { c.list_snapshots(req).await })
        .await;
    let n = ids(&r).len();
    if n != 1 || r.as_ref().map(|r| r.next_token.is_empty()).unwrap_or(true) {
        f.push(format!("ListSnapshots with max_entries 1 (2 snapshots exist) answered {n} entries and next_token {:?}", r.as_ref().map(|r| r.next_token.clone()).unwrap_or_default()));
    }
    s.judge(
        "list-snapshots.filters-and-paging",
        RULE,
        f,
        "by id, by source, unknown id empty, one per page".into(),
    );
}

/// CreateVolume from the snapshot, and from a snapshot that does not exist.
async fn restore_cases(s: &mut Sweeper, t: &SweepTarget, sid: &str) {
    use csi::volume_content_source::{SnapshotSource, Type};
    use drivelab_fakes::csi::CREATE_VOLUME;
    const RULE: &str = "CreateVolume from a snapshot (volume_content_source): OK with the volume's content_source set, or 3 INVALID_ARGUMENT when the plugin does not support the source; a source that does not exist → 5 NOT_FOUND";
    let from = |snap: &str, name: &str| csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(Type::Snapshot(SnapshotSource {
                snapshot_id: snap.into(),
            })),
        }),
        ..create_req(t, name, GIB)
    };
    let req = from(sid, "csi-spec-restored");
    let r = s
        .ctl(CREATE_VOLUME, "csi-spec-restored", |mut c| async move {
            c.create_volume(req).await
        })
        .await;
    let mut f = Vec::new();
    let unsupported = code_of(&r) == "INVALID_ARGUMENT";
    match &r {
        Ok(v) => {
            let vol = v.volume.clone().unwrap_or_default();
            let echoed = matches!(vol.content_source.as_ref().and_then(|c| c.r#type.as_ref()), Some(Type::Snapshot(x)) if x.snapshot_id == sid);
            if !echoed {
                f.push(format!(
                    "restored volume {} does not name snapshot {sid} as its content_source",
                    vol.volume_id
                ));
            }
            if !vol.volume_id.is_empty() {
                let d = delete(s, &vol.volume_id).await;
                expect_code(
                    &mut f,
                    "cleanup: DeleteVolume of the restored volume",
                    &d,
                    "OK",
                );
            }
        }
        Err(_) if unsupported => {}
        Err(_) => f.push(format!(
            "CreateVolume from snapshot {sid}: answered {}",
            said(&r)
        )),
    }
    let req = from("csi-spec-unknown-snapshot", "csi-spec-restored-missing");
    let m = s
        .ctl(
            CREATE_VOLUME,
            "csi-spec-restored-missing",
            |mut c| async move { c.create_volume(req).await },
        )
        .await;
    let want = if unsupported {
        "INVALID_ARGUMENT"
    } else {
        "NOT_FOUND"
    };
    expect_code(
        &mut f,
        "CreateVolume from a snapshot that does not exist",
        &m,
        want,
    );
    if f.is_empty() && unsupported {
        let why = format!("the driver declares snapshot sources unsupported (INVALID_ARGUMENT: {}), as the spec allows; restore not exercised", said(&r));
        s.not_applicable("snapshot.restore", RULE, why);
    } else {
        s.judge(
            "snapshot.restore",
            RULE,
            f,
            "restored with content_source set; a missing snapshot NOT_FOUND".into(),
        );
    }
}

/// CreateVolume from a volume (CLONE_VOLUME): the clone names its source; a
/// source that does not exist is NOT_FOUND. Advertising the capability takes
/// away the "source not supported" answer restore has.
async fn clone_cases(s: &mut Sweeper, t: &SweepTarget, k: &Known) {
    use csi::volume_content_source::{Type, VolumeSource};
    use drivelab_fakes::csi::CREATE_VOLUME;
    const RULE: &str = "CLONE_VOLUME: the SP supports CreateVolume with a volume as its volume_content_source — the new volume names it as content_source; a source volume that does not exist → 5 NOT_FOUND";
    if !k.has(Ctl::CloneVolume) || !k.has(Ctl::CreateDeleteVolume) {
        s.not_applicable(
            "volume.clone",
            RULE,
            "CLONE_VOLUME (with CREATE_DELETE_VOLUME) not advertised",
        );
        return;
    }
    let from = |src: &str, name: &str| csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(Type::Volume(VolumeSource {
                volume_id: src.into(),
            })),
        }),
        ..create_req(t, name, GIB)
    };
    let mut f = Vec::new();
    let req = create_req(t, "csi-spec-clone-src", GIB);
    let v = s
        .ctl(CREATE_VOLUME, "csi-spec-clone-src", |mut c| async move {
            c.create_volume(req).await
        })
        .await;
    expect_code(&mut f, "CreateVolume of the source", &v, "OK");
    let src = v
        .as_ref()
        .ok()
        .and_then(|r| r.volume.as_ref())
        .map(|v| v.volume_id.clone())
        .unwrap_or_default();
    let mut made = Vec::new();
    if !src.is_empty() {
        let req = from(&src, "csi-spec-clone");
        let r = s
            .ctl(CREATE_VOLUME, "csi-spec-clone", |mut c| async move {
                c.create_volume(req).await
            })
            .await;
        expect_code(&mut f, &format!("CreateVolume cloning {src}"), &r, "OK");
        if let Ok(v) = &r {
            let vol = v.volume.clone().unwrap_or_default();
            let echoed = matches!(vol.content_source.as_ref().and_then(|c| c.r#type.as_ref()), Some(Type::Volume(x)) if x.volume_id == src);
            if !echoed {
                f.push(format!(
                    "clone {} does not name volume {src} as its content_source",
                    vol.volume_id
                ));
            }
            made.push(vol.volume_id);
        }
    }
    let req = from("csi-spec-unknown-volume", "csi-spec-clone-missing");
    let m = s
        .ctl(
            CREATE_VOLUME,
            "csi-spec-clone-missing",
            |mut c| async move { c.create_volume(req).await },
        )
        .await;
    expect_code(
        &mut f,
        "CreateVolume cloning a volume that does not exist",
        &m,
        "NOT_FOUND",
    );
    if let Ok(v) = &m {
        made.extend(v.volume.as_ref().map(|v| v.volume_id.clone()));
    }
    made.push(src);
    for id in made.into_iter().filter(|id| !id.is_empty()) {
        let d = delete(s, &id).await;
        expect_code(&mut f, &format!("cleanup: DeleteVolume {id}"), &d, "OK");
    }
    s.judge(
        "volume.clone",
        RULE,
        f,
        "cloned with content_source set; a missing source NOT_FOUND".into(),
    );
}

/// Every advertised capability answers something other than UNIMPLEMENTED.
async fn implemented(s: &mut Sweeper, k: &Known) {
    use drivelab_fakes::csi::*;
    const RULE: &str = "a plugin MUST implement the RPCs of every capability it advertises (each RPC's \"MUST implement this RPC call if it has ... capability\")";
    let mut f = Vec::new();
    let mut probed = Vec::new();
    let check = |f: &mut Vec<String>, what: &str, code: String, probed: &mut Vec<String>| {
        probed.push(what.to_string());
        if code == "UNIMPLEMENTED" {
            f.push(format!("{what} is advertised but answers UNIMPLEMENTED"));
        }
    };
    if k.has(Ctl::GetCapacity) {
        let r = s
            .ctl(GET_CAPACITY, "", |mut c| async move {
                c.get_capacity(csi::GetCapacityRequest::default()).await
            })
            .await;
        check(
            &mut f,
            "GET_CAPACITY (GetCapacity)",
            code_of(&r),
            &mut probed,
        );
    }
    if k.has(Ctl::ExpandVolume) {
        let r = s
            .ctl(CONTROLLER_EXPAND_VOLUME, "", |mut c| async move {
                c.controller_expand_volume(csi::ControllerExpandVolumeRequest::default())
                    .await
            })
            .await;
        check(
            &mut f,
            "EXPAND_VOLUME (ControllerExpandVolume)",
            code_of(&r),
            &mut probed,
        );
    }
    if k.has(Ctl::GetVolume) {
        let r = s
            .ctl(CONTROLLER_GET_VOLUME, "", |mut c| async move {
                c.controller_get_volume(csi::ControllerGetVolumeRequest {
                    volume_id: "csi-spec-unknown-volume".into(),
                })
                .await
            })
            .await;
        check(
            &mut f,
            "GET_VOLUME (ControllerGetVolume)",
            code_of(&r),
            &mut probed,
        );
    }
    if k.has(Ctl::ListVolumes) {
        let r = s
            .ctl(LIST_VOLUMES, "", |mut c| async move {
                c.list_volumes(csi::ListVolumesRequest::default()).await
            })
            .await;
        check(
            &mut f,
            "LIST_VOLUMES (ListVolumes)",
            code_of(&r),
            &mut probed,
        );
    }
    if k.has(Ctl::ListSnapshots) {
        let r = s
            .ctl(LIST_SNAPSHOTS, "", |mut c| async move {
                c.list_snapshots(csi::ListSnapshotsRequest::default()).await
            })
            .await;
        check(
            &mut f,
            "LIST_SNAPSHOTS (ListSnapshots)",
            code_of(&r),
            &mut probed,
        );
    }
    if k.node_has(NodeCap::GetVolumeStats) {
        let r = s
            .node(NODE_GET_VOLUME_STATS, "", |mut c| async move {
                c.node_get_volume_stats(csi::NodeGetVolumeStatsRequest::default())
                    .await
            })
            .await;
        check(
            &mut f,
            "node GET_VOLUME_STATS (NodeGetVolumeStats)",
            code_of(&r),
            &mut probed,
        );
    }
    if k.node_has(NodeCap::ExpandVolume) {
        let r = s
            .node(NODE_EXPAND_VOLUME, "", |mut c| async move {
                c.node_expand_volume(csi::NodeExpandVolumeRequest::default())
                    .await
            })
            .await;
        check(
            &mut f,
            "node EXPAND_VOLUME (NodeExpandVolume)",
            code_of(&r),
            &mut probed,
        );
    }
    if probed.is_empty() {
        s.not_applicable(
            "advertised-implemented",
            RULE,
            "no capability beyond those the lifecycle cases exercise is advertised",
        );
    } else {
        let ok = format!("implemented: {}", probed.join(", "));
        s.judge("advertised-implemented", RULE, f, ok);
    }
}
