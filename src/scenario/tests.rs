use super::*;

fn p(text: &str) -> Result<Scenario, ScenarioError> {
    parse(Path::new("t.yaml"), text)
}

const GOOD: &str = r#"name: ok
driver: { builtin: cosi-s3 }
bucket_classes:
  - { name: std, deletion_policy: Delete }
bucket_access_classes:
  - { name: rw, authentication_type: Key }
steps:
  - create_bucket_claim: { name: photos, class: std }
  - grant_access: { name: app, claim: photos, class: rw }
  - retry: { op: grant_access, name: app }
  - expect: { code: OK }
  - revoke_access: { name: app }
  - delete_bucket_claim: { name: photos }
"#;

#[test]
fn a_good_file_parses_with_defaults() {
    let s = p(GOOD).unwrap();
    assert_eq!(s.name, "ok");
    assert_eq!(s.steps.len(), 6);
    assert_eq!(s.steps[0].line, 8);
    assert_eq!(s.invariants, Invariant::cosi_defaults());
    assert_eq!(s.converge_within, Duration::from_secs(120));
    match &s.steps[1].value {
        Step::Cosi(CosiStep::GrantAccess(a)) => assert_eq!(a.namespace, "default"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn unknown_key_is_an_error_with_its_position() {
    let text = GOOD.replace(
        "  - { name: rw, authentication_type: Key }",
        "  - { name: rw, authentication_type: Key, colour: red }",
    );
    let e = p(&text).unwrap_err();
    assert_eq!(e.line, 6, "{e}");
    assert!(e.col > 0, "{e}");
    assert!(e.message.contains("colour"), "{e}");
    assert!(e.to_string().starts_with("t.yaml:6:"), "{e}");
    assert!(e.hint.is_some());
}

#[test]
fn unknown_step_is_an_error_naming_the_step() {
    let text = GOOD.replace("  - expect: { code: OK }", "  - teleport: { name: x }");
    let e = p(&text).unwrap_err();
    assert_eq!(e.line, 11, "{e}");
    assert!(e.message.contains("teleport"), "{e}");
}

#[test]
fn bad_values_are_errors() {
    let e = p(&GOOD.replace("deletion_policy: Delete", "deletion_policy: Sometimes")).unwrap_err();
    assert_eq!(e.line, 4, "{e}");
    assert!(e.message.contains("Sometimes"), "{e}");
    let e = p(&GOOD.replace("code: OK", "code: MAYBE")).unwrap_err();
    assert_eq!(e.line, 11, "{e}");
    let e = p(&GOOD.replace(
        "builtin: cosi-s3",
        "builtin: cosi-s3, mutants: [no-such-bug]",
    ))
    .unwrap_err();
    assert!(e.message.contains("no-such-bug"), "{e}");
}

#[test]
fn references_are_checked_at_the_step() {
    let e = p(&GOOD.replace("class: std }", "class: gold }")).unwrap_err();
    assert_eq!((e.line, e.message.contains("gold")), (8, true), "{e}");
    let e = p(&GOOD.replace("claim: photos, class: rw", "claim: videos, class: rw")).unwrap_err();
    assert_eq!(e.line, 9, "{e}");
    let e = p(&GOOD.replace(
        "  - retry: { op: grant_access, name: app }",
        "  - retry: { op: grant_access, name: other }",
    ))
    .unwrap_err();
    assert_eq!(e.line, 10, "{e}");
}

#[test]
fn s3_backend_is_checked_where_written() {
    assert_eq!(
        p(GOOD).unwrap().s3_backend,
        drivelab_fakes::s3::Backend::Rustfs
    );
    let s = p(&format!("{GOOD}s3_backend: minio\n")).unwrap();
    assert_eq!(s.s3_backend, drivelab_fakes::s3::Backend::Minio);
    assert_round_trips(&s);
    let e = p(&format!("{GOOD}s3_backend: ceph\n")).unwrap_err();
    assert_eq!((e.line, e.col), (14, 13), "{e}");
    assert!(
        e.message.contains("ceph") && e.hint.as_deref() == Some("write `rustfs` or `minio`"),
        "{e}"
    );
}

#[test]
fn empty_expectations_and_durations_are_rejected() {
    let e = p(&GOOD.replace("expect: { code: OK }", "expect: { namespace: x }")).unwrap_err();
    assert!(e.message.contains("asserts nothing"), "{e}");
    let e = p(&format!("{GOOD}converge_within: soon\n")).unwrap_err();
    assert!(e.message.contains("soon"), "{e}");
    assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("5 parsecs"), None);
}

#[test]
fn garbage_never_panics() {
    for text in [
        "",
        ":",
        "- - -",
        "name: [",
        "\u{0}\u{1}",
        "steps: 5",
        "name: x\ndriver: 7\nsteps: []",
    ] {
        let e = p(text).unwrap_err();
        assert!(!e.message.is_empty());
    }
}

#[test]
fn every_committed_scenario_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let files = discover(&[root]).unwrap();
    assert!(
        files.len() >= 8,
        "expected at least 8 scenarios, found {}",
        files.len()
    );
    for f in files {
        load(&f).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn every_committed_scenario_round_trips_through_the_writer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    for f in discover(&[root]).unwrap() {
        let a = load(&f).unwrap();
        let text = write::to_yaml(&a, &["generated".into()]);
        let b = parse(&f, &text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", f.display()));
        let steps = |s: &Scenario| s.steps.iter().map(|l| l.value.clone()).collect::<Vec<_>>();
        assert_eq!(steps(&a), steps(&b), "{}", f.display());
        let faults = |s: &Scenario| s.faults.iter().map(|l| l.value.clone()).collect::<Vec<_>>();
        assert_eq!(faults(&a), faults(&b), "{}", f.display());
        assert_eq!(a.invariants, b.invariants);
        assert_eq!(a.bucket_classes, b.bucket_classes);
        assert_eq!(a.access_classes, b.access_classes);
        assert_eq!(a.converge_within, b.converge_within);
        // A `scale:` block is written out expanded (its fleet and steps), not as itself.
        let mut expanded = a.csi.clone();
        if let Some(bosh) = expanded.as_mut().and_then(|c| c.bosh.as_mut()) {
            bosh.scale = None;
        }
        assert_eq!(expanded, b.csi, "{}", f.display());
        assert_eq!(a.driver, b.driver, "{}", f.display());
    }
}

const BOSH: &str = r#"name: b
driver: { builtin: bosh-csi }
bosh: {}
steps:
  - create_volume: { name: data }
  - publish: { pod: web, volume: data, node: node-1 }
  - concurrent:
      - recreate_vm: { node: node-0 }
      - unpublish: { pod: web }
  - delete_volume: { name: data }
"#;

#[test]
fn a_bosh_file_takes_every_default() {
    let s = p(BOSH).unwrap();
    assert_eq!(s.system(), System::Csi);
    let b = s.bosh().unwrap();
    assert_eq!(b.deployments.len(), 1);
    assert_eq!(b.deployments[0].name, "k8s");
    let nodes: Vec<(&str, &str)> = b
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.instance.as_str()))
        .collect();
    assert_eq!(nodes, [("node-0", "k8s/0"), ("node-1", "k8s/1")]);
    assert_eq!(b.storage_classes[0].name, "bosh");
    assert_eq!(b.workers, 2);
    assert_eq!(s.invariants, Invariant::bosh_defaults());
    assert!(matches!(&s.steps[2].value, Step::Concurrent(v) if v.len() == 2));
}

#[test]
fn bosh_mistakes_point_at_the_step() {
    let cases = [
        (
            BOSH.replace("node: node-1", "node: node-7"),
            6,
            "no node `node-7`",
        ),
        (
            BOSH.replace("  - create_volume: { name: data }\n", ""),
            5,
            "which no earlier step creates",
        ),
        (
            BOSH.replace(
                "{ name: data }\n  - publish",
                "{ name: data, size: lots }\n  - publish",
            ),
            5,
            "not a Kubernetes quantity",
        ),
        (
            BOSH.replace("bosh: {}", "bosh: { task_timeout: forever }"),
            3,
            "task_timeout",
        ),
        (BOSH.replace("bosh: {}\n", ""), 2, "needs the CSI system"),
        (
            BOSH.replace(
                "  - delete_volume: { name: data }",
                "  - grant_access: { name: a, claim: c, class: k }",
            ),
            10,
            "COSI step",
        ),
    ];
    assert_errors_at(&cases);
}

/// Each text fails to parse with a message containing the needle, at that line (and a column).
fn assert_errors_at(cases: &[(String, u64, &str)]) {
    for (text, line, needle) in cases {
        let e = p(text).expect_err(needle);
        assert!(e.message.contains(needle), "{needle}: {e}");
        assert_eq!((e.line, e.col > 0), (*line, true), "{needle}: {e}");
    }
}

/// Written out and parsed again, `s` has the same BOSH section and steps.
fn assert_round_trips(s: &Scenario) {
    let text = write::to_yaml(s, &["round trip".into()]);
    let again = p(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(again.csi, s.csi);
    let a: Vec<&Step> = s.steps.iter().map(|l| &l.value).collect();
    let b: Vec<&Step> = again.steps.iter().map(|l| &l.value).collect();
    assert_eq!(a, b);
}

#[test]
fn systems_and_drivers_must_match() {
    let e = p(&BOSH.replace("bosh-csi", "cosi-s3")).unwrap_err();
    assert!(e.message.contains("speaks COSI"), "{e}");
    let e = p(&GOOD.replace("cosi-s3", "bosh-csi")).unwrap_err();
    assert!(e.message.contains("speaks CSI"), "{e}");
    let e = p(&BOSH.replace("bosh: {}", "bosh: {}\ninvariants: [no-rotation]")).unwrap_err();
    assert!(e.message.contains("does not apply"), "{e}");
    let e = p(&BOSH.replace(
        "{ builtin: bosh-csi }",
        "{ builtin: bosh-csi, mutants: [rotate-on-retry] }",
    ))
    .unwrap_err();
    assert!(e.message.contains("is a bug of cosi-s3"), "{e}");
}

#[test]
fn a_bosh_scenario_round_trips_through_the_writer() {
    assert_round_trips(&p(BOSH).unwrap());
}

#[test]
fn a_bosh_step_in_a_cosi_file_says_what_is_missing() {
    let text = GOOD.replace(
        "  - delete_bucket_claim: { name: photos }",
        "  - create_volume: { name: data }",
    );
    let e = p(&text).unwrap_err();
    assert!(e.message.contains("no `csi:` or `bosh:` section"), "{e}");
    assert_eq!(e.line, 13, "{e}");
}

#[test]
fn snapshot_expectations_point_at_the_step() {
    let ok = BOSH.replace(
        "  - delete_volume: { name: data }",
        "  - snapshot: { name: s1, volume: data }\n  - expect: { snapshot: s1, ready_to_use: true, iaas_snapshots: 1 }",
    );
    let s = p(&ok).unwrap();
    match &s.steps[4].value {
        Step::Expect(e) => {
            assert_eq!(e.snapshot.as_deref(), Some("s1"));
            assert_eq!(e.ready_to_use, Some(true));
            assert_eq!(e.iaas_snapshots, Some(1));
        }
        other => panic!("{other:?}"),
    }
    let cases = [
        (ok.replace("snapshot: s1, ready_to_use: true, ", ""), None),
        (
            ok.replace(", ready_to_use: true", ""),
            Some("`snapshot` and `ready_to_use` go together"),
        ),
        (
            ok.replace("ready_to_use: true", "ready_to_use: soon"),
            Some("invalid boolean"),
        ),
        (
            ok.replace("iaas_snapshots: 1", "iaas_snapshots: -1"),
            Some("invalid u64"),
        ),
    ];
    for (text, needle) in cases {
        match needle {
            None => {
                p(&text).unwrap();
            }
            Some(needle) => {
                let e = p(&text).expect_err(needle);
                assert!(e.message.contains(needle), "{needle}: {e}");
                assert_eq!((e.line, e.col > 0), (11, true), "{needle}: {e}");
            }
        }
    }
}

/// A backup paused mid-stream and resumed after a sidecar restart, the base
/// of the cases below.
const PAUSED: &str = r#"name: p
driver: { builtin: bosh-csi }
bosh: {}
steps:
  - create_volume: { name: data }
  - write_blocks: { volume: data, ranges: [[0, 600]] }
  - snapshot: { name: s1, volume: data }
  - backup: { name: full, snapshot: s1, pause_after: 2 }
  - restart: { component: csi-snapshot-metadata }
  - resume_backup: { name: full }
"#;

#[test]
fn pause_and_resume_mistakes_point_at_the_step() {
    let s = p(PAUSED).unwrap();
    assert!(
        matches!(&s.steps[3].value, Step::Bosh(BoshStep::Backup(b)) if b.pause_after == Some(2))
    );
    assert!(matches!(&s.steps[5].value, Step::Bosh(BoshStep::ResumeBackup(r)) if r.name == "full"));
    assert_round_trips(&s);
    let cases = [
        (
            PAUSED.replace("pause_after: 2", "pause_after: 0"),
            8,
            "at least 1",
        ),
        (
            PAUSED.replace("pause_after: 2", "pause_after: -3"),
            8,
            "invalid",
        ),
        (
            PAUSED.replace(
                "resume_backup: { name: full }",
                "resume_backup: { name: other }",
            ),
            10,
            "no earlier backup `other` to resume",
        ),
        (PAUSED.replace(", pause_after: 2", ""), 10, "is not paused"),
        (
            format!("{PAUSED}  - resume_backup: {{ name: full }}\n"),
            11,
            "is not paused",
        ),
        (
            PAUSED.replace("  - resume_backup: { name: full }\n", ""),
            8,
            "no later step resumes it",
        ),
        (
            PAUSED.replace(
                "resume_backup: { name: full }",
                "resume_backup: { name: full, at: 3 }",
            ),
            10,
            "unknown field",
        ),
        (
            PAUSED.replace(
                "component: csi-snapshot-metadata",
                "component: csi-snapshotter",
            ),
            9,
            "cannot restart `csi-snapshotter`",
        ),
    ];
    assert_errors_at(&cases);
}

#[test]
fn create_backend_bucket_takes_a_name_or_a_claims_name_and_says_which_is_wrong() {
    let with = |step: &str| GOOD.replace("  - expect: { code: OK }", step);
    let s = p(&with(
        "  - create_backend_bucket: { name_of_claim: photos }",
    ))
    .unwrap();
    assert!(s.steps.iter().any(|l| matches!(
        &l.value,
        Step::Cosi(CosiStep::CreateBackendBucket(BackendBucketStep::NameOfClaim(c))) if c.name == "photos" && c.namespace == "default"
    )));
    for (step, says) in [
        (
            "  - create_backend_bucket: { name_of_claim: nosuch }",
            "no earlier step creates claim `default/nosuch`",
        ),
        (
            "  - create_backend_bucket: { name: other, name_of_claim: photos }",
            "exactly one of `name` and `name_of_claim`",
        ),
        ("  - create_backend_bucket: {}", "exactly one of"),
        (
            "  - create_backend_bucket: { name: other, namespace: x }",
            "`namespace` goes with `name_of_claim`",
        ),
    ] {
        let e = p(&with(step)).unwrap_err();
        assert_eq!(e.line, 11, "{e}");
        assert!(e.to_string().contains(says), "{step}: {e}");
    }
}

#[test]
fn planted_objects_and_access_modes_say_what_is_wrong() {
    let with = |step: &str| GOOD.replace("  - expect: { code: OK }", step);
    let s = p(&with(
        "  - create_backend_bucket: { name_of_claim: photos, prefix: old-, objects: [a.csv] }",
    ))
    .unwrap();
    assert_round_trips(&s);
    for (step, says) in [
        (
            "  - create_backend_bucket: { name_of_claim: nosuch, suffix: -x }",
            "no earlier step creates claim `default/nosuch`",
        ),
        (
            "  - create_backend_bucket: { name: other, suffix: -x }",
            "go with `name_of_claim`",
        ),
        (
            "  - create_backend_bucket: { name_of_claim: photos, suffix: _X }",
            "may hold only lowercase",
        ),
        (
            "  - create_backend_policy: { name: team, bucket: a, bucket_of_claim: photos }",
            "exactly one of `bucket` and `bucket_of_claim`",
        ),
        (
            "  - create_backend_policy: { name: \"has space\", bucket: a }",
            "not a canned policy name",
        ),
        (
            "  - create_backend_user: { access_key: ab }",
            "not a usable access key",
        ),
    ] {
        let e = p(&with(step)).unwrap_err();
        assert_eq!(e.line, 11, "{e}");
        assert!(e.to_string().contains(says), "{step}: {e}");
    }
    let ro = GOOD.replace(
        "authentication_type: Key }",
        "authentication_type: Key, parameters: { accessMode: WriteOnly } }",
    );
    assert_ne!(ro, GOOD, "the fixture has an access class");
    let e = p(&ro).unwrap_err();
    assert!(e.to_string().contains("accessMode: WriteOnly"), "{e}");
}

#[test]
fn the_writer_keeps_the_driver_that_ran() {
    // A found file must drive the driver that was explored, placeholders
    // intact — never the reference driver in its place.
    for decl in [
        r#"{ command: [/opt/drv, --endpoint, "{endpoint}", --x, "a b"], env: { K: "{kube_url}" }, start_timeout: 3000ms }"#,
        r#"{ image: "reg:5000/drv:1.2", args: [--endpoint, "{endpoint}"], call_timeout: 750ms }"#,
        r#"{ builtin: cosi-s3, mutants: [rotate-on-retry] }"#,
    ] {
        let text = GOOD.replace("{ builtin: cosi-s3 }", decl);
        assert_ne!(text, GOOD, "the fixture names its driver as replaced here");
        let s = p(&text).unwrap_or_else(|e| panic!("{decl}: {e}"));
        let again = p(&write::to_yaml(&s, &[])).unwrap_or_else(|e| panic!("{decl}: {e}"));
        assert_eq!(again.driver, s.driver, "{decl}");
    }
    let csi = BOSH.replace(
        "{ builtin: bosh-csi }",
        r#"{ command: [/opt/csi, --mode, "{mode}", --node-id, "{node_id}"], protocol: csi }"#,
    );
    let s = p(&csi).unwrap();
    let again = p(&write::to_yaml(&s, &[])).unwrap();
    assert_eq!(again.driver, s.driver);
    assert_round_trips(&s);
}

#[test]
fn placeholders_belong_to_a_protocol() {
    let csi_in_cosi = GOOD.replace(
        "{ builtin: cosi-s3 }",
        r#"{ command: [/opt/drv, "{node_id}"] }"#,
    );
    let e = p(&csi_in_cosi).unwrap_err();
    assert!(
        e.message
            .contains("`{node_id}` is a placeholder of csi drivers"),
        "{e}"
    );
    let cosi_in_csi = BOSH.replace(
        "{ builtin: bosh-csi }",
        r#"{ command: [/opt/csi, "{s3_endpoint}"], protocol: csi }"#,
    );
    let e = p(&cosi_in_csi).unwrap_err();
    assert!(e.message.contains("placeholder of cosi drivers"), "{e}");
}

const CSI: &str = r#"name: c
driver: { command: [/opt/csi, --endpoint, "{endpoint}", --node-id, "{node_id}"], protocol: csi }
csi:
  nodes: [node-0, node-1]
  storage_classes:
    - { name: fast, parameters: { tier: ssd }, fstype: xfs }
steps:
  - create_volume: { name: data }
  - publish: { pod: p, volume: data, node: node-1 }
  - snapshot: { name: s1, volume: data }
"#;

#[test]
fn a_csi_scenario_needs_no_bosh_backend() {
    let s = p(CSI).unwrap();
    assert_eq!(s.system(), System::Csi);
    assert!(s.bosh().is_none());
    let c = s.csi.as_ref().unwrap();
    assert_eq!(c.nodes, ["node-0", "node-1"]);
    assert_eq!(c.storage_classes[0].parameters["tier"], "ssd");
    assert_eq!(
        c.storage_classes[0].parameters["csi.storage.k8s.io/fstype"],
        "xfs"
    );
    // No `class:`: the first StorageClass.
    assert!(matches!(&s.steps[0].value, Step::Csi(CsiStep::CreateVolume(v)) if v.class == "fast"));
    // Only what needs no BOSH backend is checked by default.
    assert!(!s.invariants.is_empty());
    assert!(
        s.invariants.iter().all(|i| !i.needs_bosh()),
        "{:?}",
        s.invariants
    );
    assert_round_trips(&s);
    let d = p("name: d\ndriver: { command: [/x], protocol: csi }\ncsi: {}\nsteps:\n  - create_volume: { name: v }\n").unwrap();
    let c = d.csi.unwrap();
    assert_eq!(c.nodes, ["node-0"]);
    assert_eq!(c.storage_classes[0].name, "standard");
}

#[test]
fn bosh_only_steps_and_checks_are_refused_without_the_backend() {
    assert_errors_at(&[
        (
            CSI.replace("  - snapshot: { name: s1, volume: data }", "  - recreate_vm: { node: node-0 }"),
            10,
            "acts on the BOSH backend",
        ),
        (
            CSI.replace("  - snapshot: { name: s1, volume: data }", "  - director_down: {}"),
            10,
            "acts on the BOSH backend",
        ),
        (
            CSI.replace("  - snapshot: { name: s1, volume: data }", "  - restart: { component: director }"),
            10,
            "cannot restart `director`",
        ),
        (format!("{CSI}invariants: [token-bound]\n"), 11, "only the BOSH backend"),
        (CSI.replace("csi:\n", "bosh: {}\ncsi:\n"), 5, "not both"),
        (
            CSI.replace("node: node-1", "node: node-9"),
            9,
            "no node `node-9`",
        ),
        (
            CSI.replace("  - snapshot: { name: s1, volume: data }", "  - spec_sweep: { node: node-9 }"),
            10,
            "no node `node-9`",
        ),
        (
            CSI.replace("{ name: data }", "{ name: data, class: slow }"),
            8,
            "storage class `slow`",
        ),
        (
            CSI.replace("csi:\n  nodes: [node-0, node-1]\n  storage_classes:\n    - { name: fast, parameters: { tier: ssd }, fstype: xfs }\n", ""),
            2,
            "needs the CSI system",
        ),
    ]);
}

#[test]
fn a_misspelt_step_kind_or_key_gets_a_suggestion() {
    let e = p(&GOOD.replace("  - grant_access:", "  - grant_acess:")).unwrap_err();
    assert_eq!((e.line, e.col), (9, 5), "{e}");
    assert!(e.hint.unwrap().starts_with("did you mean `grant_access`?"));
    let e = p(&GOOD.replace(
        "{ name: photos, class: std }",
        "{ name: photos, clas: std }",
    ))
    .unwrap_err();
    assert!(
        e.hint
            .as_deref()
            .unwrap_or("")
            .starts_with("did you mean `class`?"),
        "{e:?}"
    );
}

#[test]
fn faults_name_only_what_the_system_answers() {
    let with_fault = |f: &str| GOOD.replace("steps:\n", &format!("faults:\n  - {f}\nsteps:\n"));
    let e = p(&with_fault("crash_driver: { on: s3admin.add_usr }")).unwrap_err();
    assert_eq!((e.line, e.col), (8, 25), "{e}");
    assert!(e.message.contains("did you mean `add_user`?"), "{e}");
    assert!(e.hint.unwrap().contains("add_user, remove_user"));
    let s = p(&with_fault(
        "crash_driver: { on: s3admin.add_user, optional: true }",
    ))
    .unwrap();
    assert!(s.faults[0].value.optional);
    assert_eq!(s.faults[0].line, 8);
    assert!(p(&with_fault("restart: { on: driver.DriverCreateBucket }")).is_err());
    let e = p(&with_fault("error: { on: kube.create_secrets, code: X }")).unwrap_err();
    assert!(e.message.contains("did you mean `create_secret`?"), "{e}");
}

#[test]
fn rejected_on_purpose_names_one_made_cosi_object_and_an_error_code() {
    let ok =
        format!("{GOOD}rejected_on_purpose:\n  - {{ claim: photos, code: FAILED_PRECONDITION }}\n");
    let s = p(&ok).unwrap();
    assert_eq!(s.rejected_on_purpose.len(), 1);
    assert_eq!(
        s.rejected_on_purpose[0].target.to_string(),
        "bucketclaim default/photos"
    );
    assert_eq!(s.rejected_on_purpose[0].code, GrpcCode::FailedPrecondition);
    // Written back (explore's shrunk files) and read again, it is the same.
    let again = p(&write::to_yaml(&s, &[])).unwrap();
    assert_eq!(again.rejected_on_purpose, s.rejected_on_purpose);
    for (entry, says) in [
        (
            "{ access: nobody, code: INVALID_ARGUMENT }",
            "no step makes",
        ),
        (
            "{ claim: photos, access: app, code: INVALID_ARGUMENT }",
            "exactly one of",
        ),
        ("{ code: INVALID_ARGUMENT }", "exactly one of"),
        ("{ access: app, code: OK }", "cannot end OK"),
        ("{ access: app, code: NOPE }", ""),
    ] {
        let text = format!("{GOOD}rejected_on_purpose:\n  - {entry}\n");
        let e = p(&text).unwrap_err();
        assert_eq!(e.line, 15, "{entry}: {e}");
        assert!(e.to_string().contains(says), "{entry}: {e}");
    }
    let twice = format!("{GOOD}rejected_on_purpose:\n  - {{ access: app, code: INVALID_ARGUMENT }}\n  - {{ access: app, code: INTERNAL }}\n");
    assert!(p(&twice).unwrap_err().to_string().contains("listed twice"));
}

#[test]
fn reference_design_marks_only_shape_and_is_kept_by_the_writer() {
    let text = GOOD.replace(
        "  - expect: { code: OK }",
        "  - expect: { code: OK }\n  - expect: { backend: { users: 1, policies: 1 }, reference_design: true }",
    );
    let s = p(&text).unwrap();
    match &s.steps[4].value {
        Step::Expect(e) => assert!(e.reference_design),
        other => panic!("unexpected {other:?}"),
    }
    assert_round_trips(&s);
    // A spec-level assertion may not hide behind the marker.
    let hidden = GOOD.replace(
        "  - expect: { code: OK }",
        "  - expect: { code: OK, backend: { users: 1 }, reference_design: true }",
    );
    let e = p(&hidden).unwrap_err();
    assert!(e.line == 11 && e.message.contains("(code)"), "{e}");
    let bad = GOOD.replace(
        "  - expect: { code: OK }",
        "  - expect: { backend: { users: 1 }, reference_design: sometimes }",
    );
    let e = p(&bad).unwrap_err();
    assert_eq!(e.line, 11, "{e}");
    // The design switch travels with the driver declaration.
    let variant = GOOD.replace(
        "driver: { builtin: cosi-s3 }",
        "driver: { builtin: cosi-s3, policy_layout: per-grant-with-owner-marker }",
    );
    let s = p(&variant).unwrap();
    assert!(!s.driver.is_reference_design());
    let again = p(&write::to_yaml(&s, &[])).unwrap();
    assert_eq!(again.driver, s.driver);
}

const SCALE: &str = r#"name: s
driver: { builtin: bosh-csi }
bosh:
  workers: 4
  scale: { nodes: 3, volumes: 6, wave: 3, reschedule_percent: 34 }
steps: []
"#;

#[test]
fn a_scale_block_expands_into_the_fleet_and_batches_and_errs_at_the_block() {
    let s = p(SCALE).unwrap();
    let b = s.bosh().unwrap();
    assert_eq!(b.nodes.len(), 3);
    assert!(b.virtual_lanes);
    // Two waves of six batches, a wait between them; each placed at the block.
    assert_eq!(s.steps.len(), 13);
    assert!(s.steps.iter().all(|l| (l.line, l.col) == (4, 3)));
    assert!(matches!(s.steps[6].value, Step::Bosh(BoshStep::Wait(_))));
    let e = p(&SCALE.replace("nodes: 3", "nodes: 1")).unwrap_err();
    assert_eq!((e.line, e.col), (4, 3), "{e}");
    assert!(e.message.contains("nodes"), "{e}");
    let e = p(&SCALE.replace("wave: 3", "wave: 3, waves: 2")).unwrap_err();
    assert!(e.message.contains("unknown field `waves`"), "{e}");
    let e = p(&SCALE.replace(
        "  workers: 4\n",
        "  workers: 4\n  nodes: [{ name: a, instance: k8s/0 }]\n",
    ))
    .unwrap_err();
    assert!(e.message.contains("generates the deployment"), "{e}");
}

/// A generated scenario past the parser's default budget of 250,000 YAML
/// nodes (~28,000 grant steps) parses: 10⁵-grant runs were refused at parse.
#[test]
fn a_scenario_past_the_parsers_default_node_budget_parses() {
    let n = 30_000;
    let mut text = GOOD.replace(
        "  - grant_access: { name: app, claim: photos, class: rw }\n",
        "",
    );
    let at = text.find("  - retry:").unwrap();
    let grants: String = (0..n)
        .map(|i| format!("  - grant_access: {{ name: app-{i}, claim: photos, class: rw }}\n"))
        .collect();
    text.insert_str(at, &grants);
    let text = text.replace("name: app }", "name: app-0 }");
    assert!(
        text.lines().count() * 9 > serde_saphyr::Budget::default().max_nodes,
        "the test must pass the default budget"
    );
    let s = p(&text).unwrap();
    assert_eq!(s.steps.len(), n + 5);
}

/// The alias limits stay the parser's: only the node and event budgets grow
/// with the text. One step replayed by 150 aliases passes the parser's ratio
/// of ten aliases per anchor, and the error names the limit, with a hint.
#[test]
fn alias_limits_still_apply_with_a_hint() {
    let mut text = String::from(
        "name: aliases\ndriver: { builtin: cosi-s3 }\nbucket_classes:\n  - { name: std, deletion_policy: Delete }\nbucket_access_classes:\n  - { name: rw, authentication_type: Key }\nsteps:\n  - &c { create_bucket_claim: { name: photos, class: std } }\n",
    );
    text.push_str(&"  - *c\n".repeat(150));
    let e = p(&text).unwrap_err();
    assert!(e.message.starts_with("budget breached"), "{e}");
    assert!(
        e.hint.as_deref().unwrap_or("").contains("parser limit"),
        "{e}"
    );
}

/// A file over the size limit is refused before it is read, saying how to fix it.
#[test]
fn a_file_over_the_size_limit_is_refused_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(MAX_SCENARIO_BYTES + 1).unwrap();
    let e = load(&path).unwrap_err();
    assert!(e.message.contains("limited to"), "{e}");
    assert_eq!(e.hint.as_deref(), Some("split it into several scenarios"));
}
