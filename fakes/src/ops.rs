//! Operation names, declared once by the component that answers them (beside
//! the code that classifies its requests) and used by its gate, by the fault
//! validator and by `drivelab list faults`, so a name cannot drift between them.

use crate::history::Component;

/// One operation of a component, as histories, faults and reports name it.
///
/// Values come from a component's registry ([`declare_ops!`], or a table built
/// from the same parts the classifier uses); [`CallSpec`](crate::gate::CallSpec)
/// only takes an `Op`, so every recorded call names a declared operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Op(&'static str);

impl Op {
    /// Declare a name. Only registries call this (see [`declare_ops!`]).
    #[doc(hidden)]
    pub const fn declare(name: &'static str) -> Op {
        Op(name)
    }

    /// The name.
    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// The op of `ops` named `name`.
    pub fn find(ops: &[Op], name: &str) -> Option<Op> {
        ops.iter().copied().find(|o| o.0 == name)
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl PartialEq<str> for Op {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Op {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<Op> for &str {
    fn eq(&self, other: &Op) -> bool {
        *self == other.0
    }
}

/// Declare operation constants and the registry slice that lists them all, in
/// one place: `declare_ops!(pub OPS { ADD_USER = "add_user", ... });`.
#[macro_export]
macro_rules! declare_ops {
    ($(#[$m:meta])* $vis:vis $all:ident { $($name:ident = $s:literal),* $(,)? }) => {
        $(
            #[doc = concat!("`", $s, "`")]
            $vis const $name: $crate::ops::Op = $crate::ops::Op::declare($s);
        )*
        $(#[$m])*
        $vis const $all: &[$crate::ops::Op] = &[$($name),*];
    };
}

/// Which lab stands a group's server up: the COSI lab (sidecar, S3, the
/// Kubernetes API over HTTP) or the CSI lab (CSI sidecars, BOSH Director, CPI,
/// agents, mount tables).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Stack {
    /// The COSI lab.
    Cosi,
    /// The CSI lab (with its BOSH backend).
    Csi,
}

/// The operations one callee answers, as one group of the registry.
#[derive(Clone, Debug)]
pub struct OpGroup {
    /// The lab that has this server.
    pub stack: Stack,
    /// The callee.
    pub component: Component,
    /// Who serves them (several groups may share a component: the driver
    /// answers COSI or CSI RPCs, the CPI answers its API and the block API).
    pub served_by: &'static str,
    /// The names.
    pub ops: &'static [Op],
}

/// Every operation any component answers, grouped by who serves it.
pub fn registry() -> Vec<OpGroup> {
    let g = |component, served_by, ops| OpGroup {
        stack: Stack::Csi,
        component,
        served_by,
        ops,
    };
    let cosi = |component, served_by, ops| OpGroup {
        stack: Stack::Cosi,
        ..g(component, served_by, ops)
    };
    vec![
        cosi(
            Component::Driver,
            "COSI driver (RPCs the COSI sidecar makes)",
            crate::cosi_sidecar::DRIVER_RPCS,
        ),
        g(
            Component::Driver,
            "CSI driver (RPCs the CSI sidecars make)",
            crate::csi::DRIVER_RPCS,
        ),
        g(
            Component::Driver,
            "CSI driver (further RPCs the lab's spec sweep makes)",
            crate::csi::SWEEP_RPCS,
        ),
        g(
            Component::Driver,
            "CSI driver (SnapshotMetadata RPCs the snapshot-metadata sidecar makes)",
            crate::csi::snapshot_metadata::DRIVER_RPCS,
        ),
        cosi(Component::S3, "S3 API", crate::s3::s3_ops::ALL),
        cosi(
            Component::S3Admin,
            "MinIO/RustFS admin API",
            crate::s3::admin_ops::ALL,
        ),
        cosi(
            Component::Kube,
            "Kubernetes API (HTTP)",
            crate::kube::all_ops(),
        ),
        g(
            Component::Kube,
            "Kubernetes API (in-process, from the snapshot-metadata sidecar)",
            crate::csi::snapshot_metadata::KUBE_OPS,
        ),
        g(
            Component::Director,
            "BOSH Director API",
            crate::director::api_ops::ALL,
        ),
        g(
            Component::Agent,
            "BOSH agent (from the Director)",
            crate::director::AGENT_OPS,
        ),
        g(
            Component::Cpi,
            "CPI API v2 (from the Director)",
            crate::cpi::METHODS,
        ),
        g(
            Component::Cpi,
            "IaaS block API (EBS direct style)",
            crate::cpi::block_api::OPS,
        ),
        g(
            Component::Mounts,
            "node mount table",
            crate::csi::mounts::OPS,
        ),
    ]
}

/// Every operation `component` answers in `stack` (all its groups there).
pub fn ops_of(stack: Stack, component: Component) -> Vec<Op> {
    registry()
        .into_iter()
        .filter(|g| g.stack == stack && g.component == component)
        .flat_map(|g| g.ops.iter().copied())
        .collect()
}

/// The op named `name` that `component` declares (in any lab): how a
/// recorded history's names are read back.
pub fn lookup(component: Component, name: &str) -> Option<Op> {
    registry()
        .iter()
        .filter(|g| g.component == component)
        .find_map(|g| Op::find(g.ops, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_per_component() {
        let mut seen = std::collections::BTreeSet::new();
        for g in registry() {
            assert!(!g.ops.is_empty(), "{} declares no ops", g.served_by);
            for op in g.ops {
                assert!(
                    seen.insert((g.component, op.as_str())),
                    "{}.{op} is declared twice",
                    g.component
                );
            }
        }
    }
}
