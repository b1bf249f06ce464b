//! What a scenario may name, per system: the components a fault may hit (and
//! their operations, from the fakes' own registry), the sides a partition may
//! cut, the fakes a restart may restart; and "did you mean" for a wrong name.

use drivelab_fakes::history::Component;
use drivelab_fakes::ops::{self, Op, Stack};

use super::System;

/// A wrong name, as the validator reports it: what is wrong and what would be right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameError {
    /// What is wrong (with a suggestion when one is close).
    pub message: String,
    /// The valid names.
    pub hint: Option<String>,
}

impl NameError {
    fn new(message: String, hint: String) -> Self {
        Self {
            message,
            hint: Some(hint),
        }
    }
}

fn stack(system: System) -> Stack {
    match system {
        System::Cosi => Stack::Cosi,
        System::Csi => Stack::Csi,
    }
}

/// Every component name a scenario may write, with its component.
const COMPONENT_NAMES: &[Component] = &[
    Component::Sidecar,
    Component::Driver,
    Component::S3,
    Component::S3Admin,
    Component::Kube,
    Component::Director,
    Component::Cpi,
    Component::Agent,
    Component::Mounts,
    Component::CsiProvisioner,
    Component::CsiAttacher,
    Component::Kubelet,
    Component::CsiSnapshotter,
    Component::CsiSnapshotMetadata,
];

/// The component named `s` (in any system).
pub fn component(s: &str) -> Option<Component> {
    COMPONENT_NAMES.iter().copied().find(|c| c.as_str() == s)
}

/// Components that answer calls in `system`: what a fault's `on:` may name.
pub fn callees(system: System) -> Vec<Component> {
    let st = stack(system);
    let mut out: Vec<Component> = Vec::new();
    for g in ops::registry() {
        if g.stack == st && !out.contains(&g.component) {
            out.push(g.component);
        }
    }
    out
}

/// The operations `component` answers in `system`.
pub fn ops_of(system: System, component: Component) -> Vec<Op> {
    ops::ops_of(stack(system), component)
}

/// The two ends of every link a partition may cut in `system`.
pub fn partition_sides(system: System) -> &'static [Component] {
    match system {
        System::Cosi => &[
            Component::Sidecar,
            Component::Driver,
            Component::S3,
            Component::S3Admin,
            Component::Kube,
        ],
        System::Csi => &[
            Component::Driver,
            Component::Director,
            Component::Cpi,
            Component::Agent,
            Component::Mounts,
            Component::Kube,
            Component::CsiProvisioner,
            Component::CsiAttacher,
            Component::Kubelet,
            Component::CsiSnapshotter,
            Component::CsiSnapshotMetadata,
        ],
    }
}

/// A fake a `restart` step may restart. The engine of each system matches on
/// this value; nothing parses a component name again at run time.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Restartable {
    /// The S3 server, its admin API included (`s3` or `s3admin`).
    S3,
    /// The Kubernetes API server.
    Kube,
    /// The BOSH Director.
    Director,
    /// The CSI snapshot-metadata sidecar.
    CsiSnapshotMetadata,
}

impl Restartable {
    /// The component it restarts.
    pub fn component(self) -> Component {
        match self {
            Restartable::S3 => Component::S3,
            Restartable::Kube => Component::Kube,
            Restartable::Director => Component::Director,
            Restartable::CsiSnapshotMetadata => Component::CsiSnapshotMetadata,
        }
    }

    /// What a `restart` step may restart in `system`.
    pub fn in_system(system: System) -> &'static [Restartable] {
        match system {
            System::Cosi => &[Restartable::S3, Restartable::Kube],
            System::Csi => &[Restartable::Director, Restartable::CsiSnapshotMetadata],
        }
    }

    /// What a `restart:` fault may restart in `system` (it restarts the
    /// callee, so it must be a fake that answers calls).
    pub fn by_fault(system: System) -> &'static [Restartable] {
        match system {
            System::Cosi => &[Restartable::S3, Restartable::Kube],
            System::Csi => &[Restartable::Director],
        }
    }

    /// The restartable fake `c` is (`s3admin` is the S3 server).
    pub fn of(c: Component) -> Option<Restartable> {
        match c {
            Component::S3 | Component::S3Admin => Some(Restartable::S3),
            Component::Kube => Some(Restartable::Kube),
            Component::Director => Some(Restartable::Director),
            Component::CsiSnapshotMetadata => Some(Restartable::CsiSnapshotMetadata),
            _ => None,
        }
    }
}

fn system_name(system: System) -> &'static str {
    match system {
        System::Cosi => "a COSI scenario",
        System::Csi => "a CSI scenario",
    }
}

fn join(names: impl IntoIterator<Item = impl AsRef<str>>) -> String {
    names
        .into_iter()
        .map(|n| n.as_ref().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parse a component name that must be one of `allowed` (`what` says for what).
pub fn component_in(
    s: &str,
    allowed: &[Component],
    system: System,
    what: &str,
) -> Result<Component, NameError> {
    let valid: Vec<&str> = allowed.iter().map(|c| c.as_str()).collect();
    match component(s) {
        Some(c) if allowed.contains(&c) => Ok(c),
        Some(_) => Err(NameError::new(
            format!("{what} cannot name `{s}` in {}", system_name(system)),
            format!("valid here: {}", join(&valid)),
        )),
        None => Err(NameError::new(
            format!("unknown component `{s}`{}", did_you_mean(s, &valid)),
            format!("valid here: {}", join(&valid)),
        )),
    }
}

/// Parse a `restart` step's component for `system`.
pub fn restartable(s: &str, system: System) -> Result<Restartable, NameError> {
    let allowed = Restartable::in_system(system);
    let mut valid: Vec<&str> = allowed.iter().map(|r| r.component().as_str()).collect();
    if allowed.contains(&Restartable::S3) {
        valid.push("s3admin");
    }
    match component(s).and_then(Restartable::of) {
        Some(r) if allowed.contains(&r) => Ok(r),
        Some(_) => Err(NameError::new(
            format!("cannot restart `{s}` in {}", system_name(system)),
            format!(
                "restart {}; crash the driver with a crash_driver fault",
                join(&valid)
            ),
        )),
        None => Err(NameError::new(
            format!("cannot restart `{s}`{}", did_you_mean(s, &valid)),
            format!(
                "restart {}; crash the driver with a crash_driver fault",
                join(&valid)
            ),
        )),
    }
}

/// Parse `component.operation` against what `system` stands up.
pub fn fault_target(s: &str, system: System) -> Result<(Component, Op), NameError> {
    let callees = callees(system);
    let valid_components: Vec<&str> = callees.iter().map(|c| c.as_str()).collect();
    let Some((c, op)) = s.split_once('.') else {
        return Err(NameError::new(
            format!("`{s}` is not `component.operation`"),
            format!(
                "e.g. s3admin.add_user; components here: {}",
                join(&valid_components)
            ),
        ));
    };
    let component = match component(c) {
        Some(k) if callees.contains(&k) => k,
        Some(k) if k == Component::Sidecar || is_caller_only(k) => {
            return Err(NameError::new(
                format!("faults hit the callee; `{c}` is never called"),
                format!(
                    "aim at the component it calls (e.g. `driver.<RPC>`); components here: {}",
                    join(&valid_components)
                ),
            ))
        }
        Some(_) => {
            return Err(NameError::new(
                format!("{} has no `{c}`", system_name(system)),
                format!("components here: {}", join(&valid_components)),
            ))
        }
        None => {
            return Err(NameError::new(
                format!(
                    "unknown component `{c}`{}",
                    did_you_mean(c, &valid_components)
                ),
                format!("components here: {}", join(&valid_components)),
            ))
        }
    };
    let ops = ops_of(system, component);
    if let Some(o) = Op::find(&ops, op) {
        return Ok((component, o));
    }
    let names: Vec<&str> = ops.iter().map(|o| o.as_str()).collect();
    let what = if op.is_empty() {
        format!("`{s}` names no operation")
    } else {
        format!(
            "{component} has no operation `{op}`{}",
            did_you_mean(op, &names)
        )
    };
    Err(NameError::new(
        what,
        format!("{component} operations: {}", join(&names)),
    ))
}

/// Components that only ever call others (faults hit callees).
fn is_caller_only(c: Component) -> bool {
    matches!(
        c,
        Component::Sidecar
            | Component::CsiProvisioner
            | Component::CsiAttacher
            | Component::Kubelet
            | Component::CsiSnapshotter
            | Component::CsiSnapshotMetadata
    )
}

/// `; did you mean `x`?` for the closest of `valid`, or nothing when none is close.
pub fn did_you_mean(s: &str, valid: &[&str]) -> String {
    closest(s, valid)
        .map(|c| format!("; did you mean `{c}`?"))
        .unwrap_or_default()
}

/// The name of `valid` closest to `s` by edit distance, if it is close enough
/// to be a slip (at most 2 edits, or a third of the name for long names).
pub fn closest<'a>(s: &str, valid: &[&'a str]) -> Option<&'a str> {
    let limit = (s.chars().count() / 3).max(2);
    valid
        .iter()
        .map(|v| {
            (
                levenshtein(&s.to_ascii_lowercase(), &v.to_ascii_lowercase()),
                *v,
            )
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// Edit distance (insertions, deletions, substitutions) between `a` and `b`.
pub fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_and_suggestion() {
        assert_eq!(levenshtein("add_usr", "add_user"), 1);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(
            closest("add_usr", &["remove_user", "add_user"]),
            Some("add_user")
        );
        assert_eq!(closest("zzzzzz", &["add_user"]), None);
    }

    #[test]
    fn a_misspelled_op_is_refused_with_the_right_name() {
        let e = fault_target("s3admin.add_usr", System::Cosi).unwrap_err();
        assert!(e.message.contains("did you mean `add_user`?"), "{e:?}");
        assert!(e.hint.unwrap().contains("remove_user"));
        assert_eq!(
            fault_target("s3admin.add_user", System::Cosi).unwrap().1,
            "add_user"
        );
    }

    #[test]
    fn each_system_names_only_what_it_stands_up() {
        assert!(fault_target("director.dynamic_disks.create", System::Cosi).is_err());
        assert!(fault_target("director.dynamic_disks.create", System::Csi).is_ok());
        assert!(fault_target("driver.CreateVolume", System::Cosi).is_err());
        assert!(fault_target("driver.DriverGrantBucketAccess", System::Csi).is_err());
        assert!(fault_target("sidecar.DriverCreateBucket", System::Cosi).is_err());
        assert!(restartable("kube", System::Csi).is_err());
        assert_eq!(restartable("s3admin", System::Cosi), Ok(Restartable::S3));
    }
}
