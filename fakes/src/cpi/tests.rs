use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::clock::SimClock;
use crate::history::{calls, History};
use crate::store::MemStore;

fn cpi(slots: usize) -> Cpi {
    let gate = Gate::new(History::new(SimClock::new()));
    Cpi::new(
        Arc::new(MemStore::default()),
        gate,
        CpiConfig {
            max_disks_per_vm: slots,
            ..CpiConfig::default()
        },
    )
}

async fn vm(c: &Cpi, agent: &str) -> String {
    let st = c.create_stemcell("/tmp/image").await.unwrap();
    c.create_vm(
        agent,
        &st,
        json!({}),
        json!({"default": {}}),
        vec![],
        json!({}),
    )
    .await
    .unwrap()
    .0
}

#[tokio::test]
async fn info_says_v2() {
    let c = cpi(2);
    let i = c.info().await.unwrap();
    assert_eq!(i["api_version"], 2);
    assert!(i["stemcell_formats"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
}

#[tokio::test]
async fn disk_attaches_to_one_vm_and_hint_names_it() {
    let c = cpi(2);
    let a = vm(&c, "agent-a").await;
    let b = vm(&c, "agent-b").await;
    let d = c.create_disk(1024, json!({}), Some(&a)).await.unwrap();
    let hint = c.attach_disk(&a, &d).await.unwrap();
    assert_eq!(hint["id"], d.as_str());
    assert_eq!(hint["path"], "/dev/sdc");
    // same VM again: same hint
    assert_eq!(c.attach_disk(&a, &d).await.unwrap(), hint);
    let e = c.attach_disk(&b, &d).await.unwrap_err();
    assert!(e.is(ErrorType::CloudError), "{e}");
    assert!(!e.ok_to_retry);
    assert_eq!(
        c.attachments(),
        vec![Attachment {
            disk_cid: d.clone(),
            vm_cid: a.clone()
        }]
    );
    // detach from the wrong VM: DiskNotAttached
    let e = c.detach_disk(&b, &d).await.unwrap_err();
    assert!(e.is(ErrorType::DiskNotAttached), "{e}");
    c.detach_disk(&a, &d).await.unwrap();
    let e = c.detach_disk(&a, &d).await.unwrap_err();
    assert!(e.is(ErrorType::DiskNotAttached), "{e}");
    c.attach_disk(&b, &d).await.unwrap();
}

#[tokio::test]
async fn slots_are_bounded() {
    let c = cpi(2);
    let a = vm(&c, "agent-a").await;
    let mut disks = vec![];
    for _ in 0..3 {
        disks.push(c.create_disk(10, json!({}), None).await.unwrap());
    }
    c.attach_disk(&a, &disks[0]).await.unwrap();
    let h = c.attach_disk(&a, &disks[1]).await.unwrap();
    assert_eq!(h["path"], "/dev/sdd");
    let e = c.attach_disk(&a, &disks[2]).await.unwrap_err();
    assert!(e.message.contains("no free attachment slot"), "{e}");
    c.detach_disk(&a, &disks[0]).await.unwrap();
    // the freed slot is reused
    assert_eq!(
        c.attach_disk(&a, &disks[2]).await.unwrap()["path"],
        "/dev/sdc"
    );
}

#[tokio::test]
async fn delete_vm_with_disks_disassociates_them() {
    let c = cpi(4);
    let a = vm(&c, "agent-a").await;
    let d = c.create_disk(10, json!({}), Some(&a)).await.unwrap();
    c.attach_disk(&a, &d).await.unwrap();
    // an attached disk cannot be deleted
    assert!(c
        .delete_disk(&d)
        .await
        .unwrap_err()
        .is(ErrorType::CloudError));
    c.delete_vm(&a).await.unwrap();
    assert!(c.attachments().is_empty());
    assert_eq!(c.call("has_disk", vec![json!(d)]).await.unwrap(), true);
    assert!(c.delete_vm(&a).await.unwrap_err().is(ErrorType::VmNotFound));
    c.delete_disk(&d).await.unwrap();
    assert!(c
        .delete_disk(&d)
        .await
        .unwrap_err()
        .is(ErrorType::DiskNotFound));
}

#[tokio::test]
async fn every_method_answers() {
    let c = cpi(4);
    let st = c.create_stemcell("/img").await.unwrap();
    let (v, nets) = c
        .create_vm(
            "ag",
            &st,
            json!({}),
            json!({"n": {"ip": "10.0.0.2"}}),
            vec![],
            json!({}),
        )
        .await
        .unwrap();
    assert_eq!(nets["n"]["ip"], "10.0.0.2");
    assert_eq!(c.call("has_vm", vec![json!(v)]).await.unwrap(), true);
    c.call("reboot_vm", vec![json!(v)]).await.unwrap();
    c.set_vm_metadata(&v, json!({"director": "lab"}))
        .await
        .unwrap();
    let p = c
        .call(
            "calculate_vm_cloud_properties",
            vec![json!({"cpu": 2, "ram": 1024, "ephemeral_disk_size": 10})],
        )
        .await
        .unwrap();
    assert!(p["instance_type"].is_string());
    let d = c.create_disk(100, json!({}), Some(&v)).await.unwrap();
    c.call("resize_disk", vec![json!(d), json!(200)])
        .await
        .unwrap();
    assert!(c
        .call("resize_disk", vec![json!(d), json!(50)])
        .await
        .unwrap_err()
        .is(ErrorType::NotSupported));
    c.attach_disk(&v, &d).await.unwrap();
    assert_eq!(
        c.call("get_disks", vec![json!(v)]).await.unwrap(),
        json!([d])
    );
    c.set_disk_metadata(&d, json!({"k": "v"})).await.unwrap();
    assert_eq!(c.disks()[0].metadata["k"], "v");
    assert_eq!(c.disks()[0].size_mib, 200);
    let snap = c
        .call("snapshot_disk", vec![json!(d), json!({})])
        .await
        .unwrap();
    c.call("delete_snapshot", vec![snap]).await.unwrap();
    c.call("delete_stemcell", vec![json!(st)]).await.unwrap();
    let e = c.call("no_such_method", vec![]).await.unwrap_err();
    assert!(e.is(ErrorType::NotImplemented));
    let e = c.call("attach_disk", vec![json!(1)]).await.unwrap_err();
    assert!(e.is(ErrorType::CpiError), "{e}");
    let e = c
        .create_vm("ag", "nope", json!({}), json!({}), vec![], json!({}))
        .await;
    assert!(e.unwrap_err().is(ErrorType::VmCreationFailed));
}

#[tokio::test]
async fn every_call_passes_the_gate() {
    let c = cpi(4);
    let a = vm(&c, "ag").await;
    let d = c.create_disk(1, json!({}), Some(&a)).await.unwrap();
    let _ = c.detach_disk(&a, &d).await;
    let cs = calls(&c.gate().history().events());
    let ops: Vec<&str> = cs.iter().map(|c| c.op.as_str()).collect();
    assert_eq!(
        ops,
        ["create_stemcell", "create_vm", "create_disk", "detach_disk"]
    );
    assert!(cs
        .iter()
        .all(|c| c.from == Component::Director && c.to == Component::Cpi));
    assert_eq!(cs[3].subject, format!("{a}/{d}"));
    assert_eq!(
        cs[3].outcome,
        Some(Outcome::Grpc {
            code: "Bosh::Clouds::DiskNotAttached".into(),
            message: format!("Disk '{d}' is not attached to VM '{a}'"),
        })
    );
}

#[test]
fn state_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let cid = {
        let db = sled::open(dir.path()).unwrap();
        let core = CpiCore::new(
            Arc::new(crate::store::SledStore::open(&db, "cpi").unwrap()),
            CpiConfig::default(),
        );
        core.dispatch("create_disk", &[json!(5), json!({}), Value::Null])
            .unwrap()
    };
    let db = crate::store::reopen(dir.path());
    let core = CpiCore::new(
        Arc::new(crate::store::SledStore::open(&db, "cpi").unwrap()),
        CpiConfig::default(),
    );
    assert_eq!(core.dispatch("has_disk", &[cid]).unwrap(), true);
}

#[test]
fn external_reply_shape_and_malformed_request() {
    let dir = tempfile::tempdir().unwrap();
    let opts = external::ExternalOptions {
        state_dir: dir.path().to_path_buf(),
        config: CpiConfig::default(),
    };
    let mut out = Vec::new();
    external::run_stdio(&opts, &b"{not json"[..], &mut out).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["result"], Value::Null);
    assert_eq!(v["error"]["type"], "Bosh::Clouds::CpiError");
    assert_eq!(v["error"]["ok_to_retry"], false);
    assert!(v.get("log").is_some());
    let mut out = Vec::new();
    let req = json!({"method": "info", "arguments": [], "context": {"director_uuid": "u", "request_id": "cpi-000001"}});
    external::run_stdio(&opts, req.to_string().as_bytes(), &mut out).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["error"], Value::Null);
    assert_eq!(v["result"]["api_version"], 2);
}

fn r(start: u64, count: u64) -> BlockRange {
    BlockRange { start, count }
}

#[tokio::test]
async fn snapshots_freeze_the_block_map_and_deltas_are_exact() {
    let c = cpi(4);
    let d = c.create_disk(1024, json!({}), None).await.unwrap();
    assert_eq!(blocks_in(1024), 2048);
    c.write_blocks(&d, &[r(0, 4), r(10, 1)]).unwrap();
    let s1 = c.snapshot_disk(&d, json!({})).await.unwrap();
    // Rewriting a block changes it; writing new ones adds them.
    c.write_blocks(&d, &[r(3, 2), r(2047, 1)]).unwrap();
    let s2 = c.snapshot_disk(&d, json!({})).await.unwrap();
    assert_eq!(c.allocated_blocks(&s1).unwrap(), vec![0, 1, 2, 3, 10]);
    assert_eq!(
        c.allocated_blocks(&s2).unwrap(),
        vec![0, 1, 2, 3, 4, 10, 2047]
    );
    assert_eq!(c.changed_blocks(&s1, &s2).unwrap(), vec![3, 4, 2047]);
    assert_eq!(c.changed_blocks(&s2, &s2).unwrap(), Vec::<u64>::new());
    // Later writes do not reach a frozen snapshot.
    c.write_blocks(&d, &[r(500, 1)]).unwrap();
    assert_eq!(c.allocated_blocks(&s2).unwrap().len(), 7);
    // Snapshots of different disks have no delta.
    let e = c.create_disk(1024, json!({}), None).await.unwrap();
    let s3 = c.snapshot_disk(&e, json!({})).await.unwrap();
    assert!(c.changed_blocks(&s1, &s3).is_err());
    c.delete_snapshot(&s1).await.unwrap();
    assert!(c.allocated_blocks(&s1).is_err());
}

#[test]
fn writes_beyond_the_disk_or_empty_are_refused() {
    let c = cpi(4);
    let d = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(c.create_disk(1, json!({}), None))
        .unwrap();
    assert_eq!(blocks_in(1), 2);
    assert!(c.write_blocks(&d, &[r(1, 1)]).is_ok());
    assert!(c.write_blocks(&d, &[r(2, 1)]).is_err());
    assert!(c.write_blocks(&d, &[r(0, 0)]).is_err());
    assert!(c.write_blocks(&d, &[r(u64::MAX, 2)]).is_err());
    assert!(c.write_blocks("disk-nope", &[r(0, 1)]).is_err());
}

#[test]
fn diff_counts_rewrites_and_new_blocks_only() {
    let v = |seq| BlockVersion { seq, hash: seq };
    let a: BlockMap = [(1, v(1)), (2, v(1))].into();
    let b: BlockMap = [(1, v(1)), (2, v(2)), (7, v(2))].into();
    assert_eq!(block_api::diff(&a, &b), vec![2, 7]);
}
