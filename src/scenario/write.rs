//! Writing a scenario back out as a plain scenario file — how the explorer
//! turns a shrunk failing schedule into something `drivelab run` replays.
//! The output parses back to the same scenario (a test checks the round trip).

use crate::scenario::{BoshStep, CosiStep, CsiStep};
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::driver::{
    DriverLaunch, DriverProtocol, DriverSpec, DEFAULT_CALL_TIMEOUT, DEFAULT_START_TIMEOUT,
};
use super::{BackendBucketStep, FaultAction, FaultSpec, PartitionSpec, Scenario, Step, When};
use drivelab_fakes::cosi_sidecar::Target;

/// A YAML scalar, quoted whenever plain style could be misread.
fn q(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && !matches!(
            s,
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "~"
        )
        && !s.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '.');
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
    }
}

fn map(m: &BTreeMap<String, String>) -> String {
    let items: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("{}: {}", q(k), q(v)))
        .collect();
    format!("{{ {} }}", items.join(", "))
}

pub(crate) fn duration(d: std::time::Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// One fault as a flow mapping (`crash_driver: { ... }`).
pub fn fault_yaml(f: &FaultSpec) -> String {
    let optional = if f.optional { ", optional: true" } else { "" };
    let aim = format!(
        "on: {}, nth: {}, times: {}{optional}",
        q(&f.on.to_string()),
        f.nth,
        f.times
    );
    let when = match f.when {
        When::BeforeCommit => "before_commit",
        When::AfterCommit => "after_commit",
    };
    match &f.action {
        FaultAction::CrashDriver => format!("crash_driver: {{ {aim}, when: {when} }}"),
        FaultAction::DropResponse => format!("drop_response: {{ {aim} }}"),
        FaultAction::Restart => format!("restart: {{ {aim}, when: {when} }}"),
        FaultAction::Delay(d) => format!("delay: {{ {aim}, by: {} }}", duration(*d)),
        FaultAction::Error {
            status,
            code,
            message,
        } => {
            format!(
                "error: {{ {aim}, status: {status}, code: {}, message: {} }}",
                q(code),
                q(message)
            )
        }
    }
}

fn partition_yaml(p: &PartitionSpec) -> String {
    let mut s = format!(
        "partition: {{ from: {}, to: {}, one_way: {}",
        p.from, p.to, p.one_way
    );
    if let Some(d) = p.duration {
        let _ = write!(s, ", for: {}", duration(d));
    }
    if p.optional {
        s.push_str(", optional: true");
    }
    s + " }"
}

/// One step as a flow mapping, or a block for `concurrent`.
fn step_yaml(step: &Step, indent: &str) -> String {
    match step {
        Step::Cosi(CosiStep::CreateBucketClaim(c)) => {
            let mut s = format!(
                "create_bucket_claim: {{ name: {}, class: {}, namespace: {}",
                q(&c.name),
                q(&c.class),
                q(&c.namespace)
            );
            if let Some(b) = &c.existing_bucket {
                let _ = write!(s, ", existing_bucket: {}", q(b));
            }
            s + " }"
        }
        Step::Cosi(CosiStep::GrantAccess(a)) => {
            let mut s = format!(
                "grant_access: {{ name: {}, claim: {}, class: {}, namespace: {}",
                q(&a.name),
                q(&a.claim),
                q(&a.class),
                q(&a.namespace)
            );
            if let Some(c) = &a.credentials_secret {
                let _ = write!(s, ", credentials_secret: {}", q(c));
            }
            s + " }"
        }
        Step::Cosi(CosiStep::RevokeAccess(o)) => format!(
            "revoke_access: {{ name: {}, namespace: {} }}",
            q(&o.name),
            q(&o.namespace)
        ),
        Step::Cosi(CosiStep::DeleteBucketClaim(o)) => format!(
            "delete_bucket_claim: {{ name: {}, namespace: {} }}",
            q(&o.name),
            q(&o.namespace)
        ),
        Step::Cosi(CosiStep::Retry(r)) => {
            let mut s = format!(
                "retry: {{ op: {}, name: {}, namespace: {}",
                r.op.keyword(),
                q(&r.name),
                q(&r.namespace)
            );
            if let Some(p) = &r.parameters {
                let _ = write!(s, ", parameters: {}", map(p));
            }
            if let Some(a) = &r.authentication_type {
                let _ = write!(s, ", authentication_type: {}", q(a));
            }
            s + " }"
        }
        Step::Expect(e) => {
            let mut parts = Vec::new();
            if let Some(c) = e.code {
                parts.push(format!("code: {}", c.name()));
            }
            if let (Some(c), Some(r)) = (&e.claim, e.ready) {
                parts.push(format!("claim: {}, ready: {r}", q(c)));
            }
            if let (Some(a), Some(g)) = (&e.access, e.granted) {
                parts.push(format!("access: {}, granted: {g}", q(a)));
            }
            parts.push(format!("namespace: {}", q(&e.namespace)));
            if let Some(b) = &e.backend {
                let mut f = Vec::new();
                for (k, v) in [
                    ("buckets", b.buckets),
                    ("users", b.users),
                    ("policies", b.policies),
                ] {
                    if let Some(v) = v {
                        f.push(format!("{k}: {v}"));
                    }
                }
                parts.push(format!("backend: {{ {} }}", f.join(", ")));
            }
            if e.reference_design {
                parts.push("reference_design: true".to_string());
            }
            if let Some(d) = &e.driver_calls {
                let items: Vec<String> = d.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                parts.push(format!("driver_calls: {{ {} }}", items.join(", ")));
            }
            if let (Some(v), Some(b)) = (&e.volume, e.bound) {
                parts.push(format!("volume: {}, bound: {b}", q(v)));
            }
            if let (Some(p), Some(r)) = (&e.pod, e.running) {
                parts.push(format!("pod: {}, running: {r}", q(p)));
            }
            if let Some(n) = e.iaas_disks {
                parts.push(format!("iaas_disks: {n}"));
            }
            if let (Some(v), Some(r)) = (&e.snapshot, e.ready_to_use) {
                parts.push(format!("snapshot: {}, ready_to_use: {r}", q(v)));
            }
            if let Some(n) = e.iaas_snapshots {
                parts.push(format!("iaas_snapshots: {n}"));
            }
            format!("expect: {{ {} }}", parts.join(", "))
        }
        Step::Fault(f) => format!("fault: {{ {} }}", fault_yaml(f)),
        Step::Partition(p) => partition_yaml(p),
        Step::Heal(h) => match h.between {
            Some((a, b)) => format!("heal: {{ from: {a}, to: {b} }}"),
            None => "heal: {}".to_string(),
        },
        Step::Restart(r) => format!("restart: {{ component: {} }}", r.component.component()),
        Step::Concurrent(steps) => {
            let mut s = "concurrent:".to_string();
            for st in steps {
                let _ = write!(
                    s,
                    "\n{indent}    - {}",
                    step_yaml(st, &format!("{indent}    "))
                );
            }
            s
        }
        Step::Cosi(CosiStep::CreateBucket(b)) => format!(
            "create_bucket: {{ name: {}, class: {}, existing_bucket_id: {} }}",
            q(&b.name),
            q(&b.class),
            q(&b.existing_bucket_id)
        ),
        Step::Cosi(CosiStep::CreateBackendBucket(BackendBucketStep::Named(n))) => {
            format!("create_backend_bucket: {{ name: {} }}", q(n))
        }
        Step::Cosi(CosiStep::CreateBackendBucket(BackendBucketStep::NameOfClaim(c))) => format!(
            "create_backend_bucket: {{ name_of_claim: {}, namespace: {} }}",
            q(&c.name),
            q(&c.namespace)
        ),
        Step::Cosi(CosiStep::CreateBackendBucket(BackendBucketStep::Planted(p))) => {
            let objects: Vec<String> = p.objects.iter().map(|o| q(o)).collect();
            format!(
                "create_backend_bucket: {{ {}, objects: [{}] }}",
                backend_name_yaml(&p.name, "name", "name_of_claim"),
                objects.join(", ")
            )
        }
        Step::Cosi(CosiStep::CreateBackendPolicy(p)) => format!(
            "create_backend_policy: {{ name: {}, {} }}",
            q(&p.name),
            backend_name_yaml(&p.bucket, "bucket", "bucket_of_claim")
        ),
        Step::Cosi(CosiStep::CreateBackendUser(u)) => {
            let policies: Vec<String> = u.policies.iter().map(|p| q(p)).collect();
            format!(
                "create_backend_user: {{ access_key: {}, policies: [{}] }}",
                q(&u.access_key),
                policies.join(", ")
            )
        }
        Step::Csi(CsiStep::CreateVolume(v)) => format!(
            "create_volume: {{ name: {}, class: {}, namespace: {}, size: {}, access: {} }}",
            q(&v.name),
            q(&v.class),
            q(&v.namespace),
            q(&v.size),
            v.access.as_str()
        ),
        Step::Csi(CsiStep::DeleteVolume(v)) => format!(
            "delete_volume: {{ name: {}, namespace: {} }}",
            q(&v.name),
            q(&v.namespace)
        ),
        Step::Csi(CsiStep::Publish(p)) => format!(
            "publish: {{ pod: {}, volume: {}, node: {}, namespace: {}, read_only: {} }}",
            q(&p.pod),
            q(&p.volume),
            q(&p.node),
            q(&p.namespace),
            p.read_only
        ),
        Step::Csi(CsiStep::Unpublish(p)) => format!(
            "unpublish: {{ pod: {}, namespace: {} }}",
            q(&p.pod),
            q(&p.namespace)
        ),
        Step::Csi(CsiStep::NodeStage(n)) | Step::Csi(CsiStep::NodePublish(n)) => format!(
            "{}: {{ volume: {}, node: {}, namespace: {}, read_only: {} }}",
            step.keyword(),
            q(&n.volume),
            q(&n.node),
            q(&n.namespace),
            n.read_only
        ),
        Step::Csi(CsiStep::SpecSweep(sw)) => match &sw.node {
            Some(n) => format!("spec_sweep: {{ node: {} }}", q(n)),
            None => "spec_sweep: {}".to_string(),
        },
        Step::Bosh(BoshStep::Deploy(d)) | Step::Bosh(BoshStep::RollingUpdate(d)) => {
            format!("{}: {{ deployment: {} }}", step.keyword(), q(&d.deployment))
        }
        Step::Bosh(BoshStep::RecreateVm(n)) => format!("recreate_vm: {{ node: {} }}", q(&n.node)),
        Step::Bosh(BoshStep::DirectorDown) | Step::Bosh(BoshStep::DirectorUp) => {
            format!("{}: {{}}", step.keyword())
        }
        Step::Bosh(BoshStep::WriteBlocks(w)) => {
            let r: Vec<String> = w
                .ranges
                .iter()
                .map(|[a, n]| format!("[{a}, {n}]"))
                .collect();
            format!(
                "write_blocks: {{ volume: {}, namespace: {}, ranges: [{}] }}",
                q(&w.volume),
                q(&w.namespace),
                r.join(", ")
            )
        }
        Step::Csi(CsiStep::Snapshot(sn)) => format!(
            "snapshot: {{ name: {}, volume: {}, namespace: {} }}",
            q(&sn.name),
            q(&sn.volume),
            q(&sn.namespace)
        ),
        Step::Csi(CsiStep::DeleteSnapshot(sn)) => format!(
            "delete_snapshot: {{ name: {}, namespace: {} }}",
            q(&sn.name),
            q(&sn.namespace)
        ),
        Step::Bosh(BoshStep::Backup(b)) => format!(
            "backup: {{ name: {}, snapshot: {}, {}{}namespace: {}, token: {} }}",
            q(&b.name),
            q(&b.snapshot),
            b.base
                .as_ref()
                .map(|x| format!("base: {}, ", q(x)))
                .unwrap_or_default(),
            b.pause_after
                .map(|k| format!("pause_after: {k}, "))
                .unwrap_or_default(),
            q(&b.namespace),
            b.token.as_str()
        ),
        Step::Bosh(BoshStep::Wait(d)) => format!("wait: {}", duration(*d)),
        Step::Bosh(BoshStep::Batch(steps)) => {
            let mut s = "batch:".to_string();
            for st in steps {
                let _ = write!(
                    s,
                    "\n{indent}    - {}",
                    step_yaml(st, &format!("{indent}    "))
                );
            }
            s
        }
        Step::Bosh(BoshStep::ResumeBackup(r)) => {
            format!("resume_backup: {{ name: {} }}", q(&r.name))
        }
        Step::Bosh(BoshStep::ReplaySession(r)) => format!(
            "replay_session: {{ backup: {}, snapshot: {}, {}{}namespace: {} }}",
            q(&r.backup),
            q(&r.snapshot),
            r.base
                .as_ref()
                .map(|x| format!("base: {}, ", q(x)))
                .unwrap_or_default(),
            r.after
                .as_ref()
                .map(|x| format!("after: {}, ", q(x)))
                .unwrap_or_default(),
            q(&r.namespace)
        ),
        Step::Csi(CsiStep::ResendCreateVolume(r)) => format!(
            "resend_create_volume: {{ name: {}, namespace: {}, size: {} }}",
            q(&r.name),
            q(&r.namespace),
            q(&r.size)
        ),
    }
}

/// The `bosh:` section, every default spelled out.
fn bosh_yaml(b: &super::Bosh, out: &mut String) {
    let _ = writeln!(out, "bosh:");
    let _ = writeln!(out, "  workers: {}", b.workers);
    let _ = writeln!(out, "  task_timeout: {}", duration(b.task_timeout));
    let _ = writeln!(
        out,
        "  disk_jobs_take_vm_lock: {}",
        b.disk_jobs_take_vm_lock
    );
    let _ = writeln!(
        out,
        "  disk_jobs_take_deployment_lock: {}",
        b.disk_jobs_take_deployment_lock
    );
    let _ = writeln!(
        out,
        "  per_deployment_scoping: {}",
        b.per_deployment_scoping
    );
    if !b.iaas_latency.is_empty() {
        let items: Vec<String> = b
            .iaas_latency
            .iter()
            .map(|(m, d)| format!("{m}: {}", duration(*d)))
            .collect();
        let _ = writeln!(out, "  iaas_latency: {{ {} }}", items.join(", "));
    }
    if b.max_volumes_per_node > 0 {
        let _ = writeln!(out, "  max_volumes_per_node: {}", b.max_volumes_per_node);
    }
    if b.virtual_lanes {
        let _ = writeln!(out, "  virtual_lanes: true");
    }
    let ds: Vec<String> = b.client_deployments.iter().map(|d| q(d)).collect();
    let _ = writeln!(out, "  client_deployments: [{}]", ds.join(", "));
    let _ = writeln!(out, "  deployments:");
    for d in &b.deployments {
        let _ = writeln!(
            out,
            "    - {{ name: {}, instances: {}, instance_group: {} }}",
            q(&d.name),
            d.instances,
            q(&d.instance_group)
        );
    }
    let _ = writeln!(out, "  nodes:");
    for n in &b.nodes {
        let _ = writeln!(
            out,
            "    - {{ name: {}, instance: {} }}",
            q(&n.name),
            q(&n.instance)
        );
    }
    let _ = writeln!(out, "  storage_classes:");
    for c in &b.storage_classes {
        let _ = writeln!(
            out,
            "    - {{ name: {}, deployment: {}, disk_pool: {}, fstype: {}, reclaim_policy: {} }}",
            q(&c.name),
            q(&c.deployment),
            q(&c.disk_pool),
            q(&c.fstype),
            q(&c.reclaim_policy)
        );
    }
}

/// A `csi:` section (the CSI system without the BOSH backend).
fn csi_yaml(c: &super::Csi, out: &mut String) {
    let nodes: Vec<String> = c.nodes.iter().map(|n| q(n)).collect();
    let _ = writeln!(
        out,
        "csi:\n  nodes: [{}]\n  storage_classes:",
        nodes.join(", ")
    );
    for sc in &c.storage_classes {
        let _ = writeln!(
            out,
            "    - {{ name: {}, parameters: {}, reclaim_policy: {} }}",
            q(&sc.name),
            map(&sc.parameters),
            q(&sc.reclaim_policy)
        );
    }
    if c.max_volumes_per_node > 0 {
        let _ = writeln!(out, "  max_volumes_per_node: {}", c.max_volumes_per_node);
    }
}

/// A driver declaration as a flow mapping, exactly the driver that ran
/// (placeholders intact), so a found file or replay line drives it again.
pub fn driver_yaml(d: &DriverSpec) -> String {
    let list = |items: &[String]| {
        let items: Vec<String> = items.iter().map(|a| q(a)).collect();
        format!("[{}]", items.join(", "))
    };
    let mut parts = Vec::new();
    match &d.launch {
        DriverLaunch::Builtin(b) => {
            parts.push(format!("builtin: {}", b.name()));
            let mutants: Vec<&str> = d.mutants.iter().map(|m| m.name()).collect();
            parts.push(format!("mutants: [{}]", mutants.join(", ")));
            if let Some(l) = d.policy_layout {
                parts.push(format!("policy_layout: {}", l.name()));
            }
        }
        DriverLaunch::Command(e) | DriverLaunch::Image(e) => {
            if matches!(d.launch, DriverLaunch::Command(_)) {
                parts.push(format!("command: {}", list(&e.program)));
            } else {
                parts.push(format!("image: {}", q(&e.program[0])));
                if e.program.len() > 1 {
                    parts.push(format!("args: {}", list(&e.program[1..])));
                }
            }
            if !e.env.is_empty() {
                parts.push(format!("env: {}", map(&e.env)));
            }
            if e.protocol != DriverProtocol::default() {
                parts.push(format!("protocol: {}", e.protocol.name()));
            }
        }
    }
    if d.start_timeout != DEFAULT_START_TIMEOUT {
        parts.push(format!("start_timeout: {}", duration(d.start_timeout)));
    }
    if d.call_timeout != DEFAULT_CALL_TIMEOUT {
        parts.push(format!("call_timeout: {}", duration(d.call_timeout)));
    }
    format!("{{ {} }}", parts.join(", "))
}

/// Header key of the invariants a found file fails when replayed (as the
/// explorer or sweep saw them), for `drivelab merge-found`.
pub const FAILED_HEADER: &str = "Failed invariants:";
/// Header key of the mutants a found file was hunted with (`--mutant` flags;
/// never in the file's `driver:`: the correct driver must pass it).
pub const MUTANTS_HEADER: &str = "Mutants:";

/// A machine-readable header line: `key a, b` (`key -` when empty).
pub fn list_header(key: &str, items: &[&str]) -> String {
    if items.is_empty() {
        format!("{key} -")
    } else {
        format!("{key} {}", items.join(", "))
    }
}

/// The list a header line `# key a, b` holds, if the file's leading comments
/// have one (files written before the key existed do not).
pub fn read_list_header(text: &str, key: &str) -> Option<Vec<String>> {
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .find_map(|l| l.trim_start_matches('#').trim().strip_prefix(key))
        .map(|rest| {
            rest.split(',')
                .map(str::trim)
                .filter(|i| !i.is_empty() && *i != "-")
                .map(str::to_string)
                .collect()
        })
}

/// The whole scenario as a file `drivelab run` accepts. `header` lines become comments.
pub fn to_yaml(s: &Scenario, header: &[String]) -> String {
    let mut out = String::new();
    for h in header {
        let _ = writeln!(out, "# {h}");
    }
    let _ = writeln!(out, "name: {}", q(&s.name));
    if !s.description.is_empty() {
        let _ = writeln!(out, "description: {}", q(s.description.trim()));
    }
    let _ = writeln!(out, "driver: {}", driver_yaml(&s.driver));
    if let Some(seed) = s.seed {
        let _ = writeln!(out, "seed: {seed}");
    }
    let _ = writeln!(out, "converge_within: {}", duration(s.converge_within));
    if s.s3_backend != drivelab_fakes::s3::Backend::default() {
        let _ = writeln!(out, "s3_backend: {}", s.s3_backend);
    }
    if !s.bucket_classes.is_empty() {
        let _ = writeln!(out, "bucket_classes:");
        for c in &s.bucket_classes {
            let policy = match c.deletion_policy {
                super::DeletionPolicy::Delete => "Delete",
                super::DeletionPolicy::Retain => "Retain",
            };
            let _ = writeln!(
                out,
                "  - {{ name: {}, deletion_policy: {policy}, parameters: {} }}",
                q(&c.name),
                map(&c.parameters)
            );
        }
    }
    if !s.access_classes.is_empty() {
        let _ = writeln!(out, "bucket_access_classes:");
        for c in &s.access_classes {
            let _ = writeln!(
                out,
                "  - {{ name: {}, authentication_type: {}, parameters: {} }}",
                q(&c.name),
                q(&c.authentication_type),
                map(&c.parameters)
            );
        }
    }
    match &s.csi {
        Some(c) if c.bosh.is_some() => bosh_yaml(c.bosh.as_ref().expect("matched"), &mut out),
        Some(c) => csi_yaml(c, &mut out),
        None => {}
    }
    if !s.faults.is_empty() {
        let _ = writeln!(out, "faults:");
        for f in &s.faults {
            let _ = writeln!(out, "  - {}", fault_yaml(&f.value));
        }
    }
    let _ = writeln!(out, "steps:");
    for st in &s.steps {
        let _ = writeln!(out, "  - {}", step_yaml(&st.value, "  "));
    }
    let inv: Vec<&str> = s.invariants.iter().map(|i| i.id()).collect();
    let _ = writeln!(out, "invariants: [{}]", inv.join(", "));
    if !s.require_exercised.is_empty() {
        let req: Vec<&str> = s.require_exercised.iter().map(|i| i.id()).collect();
        let _ = writeln!(out, "require_exercised: [{}]", req.join(", "));
    }
    if !s.rejected_on_purpose.is_empty() {
        let _ = writeln!(out, "rejected_on_purpose:");
        for r in &s.rejected_on_purpose {
            let (kind, namespace, name) = match &r.target {
                Target::Claim { namespace, name } => ("claim", namespace, name),
                Target::Access { namespace, name } => ("access", namespace, name),
            };
            let _ = writeln!(
                out,
                "  - {{ {kind}: {}, namespace: {}, code: {} }}",
                q(name),
                q(namespace),
                r.code.name()
            );
        }
    }
    out
}

/// A planted object's name as the file writes it.
fn backend_name_yaml(n: &super::BackendName, name_key: &str, claim_key: &str) -> String {
    match n {
        super::BackendName::Absolute(v) => format!("{name_key}: {}", q(v)),
        super::BackendName::OfClaim {
            claim,
            prefix,
            suffix,
        } => format!(
            "{claim_key}: {}, namespace: {}, prefix: {}, suffix: {}",
            q(&claim.name),
            q(&claim.namespace),
            q(prefix),
            q(suffix)
        ),
    }
}
