//! The CSI system of a scenario: its Kubernetes nodes and StorageClasses, and
//! the backend it stands up for the driver — the BOSH Director and CPI
//! (`bosh:`), or none (`csi:`) for a driver that brings its own.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::systems::bosh::scenario::Bosh;

/// The CSI system, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Csi {
    /// Kubernetes node names; each gets a kubelet, a mount table and a node plugin.
    pub nodes: Vec<String>,
    /// StorageClasses the lab creates for the driver.
    pub storage_classes: Vec<CsiStorageClass>,
    /// The BOSH backend (`bosh:`), or none when the driver brings its own.
    pub bosh: Option<Bosh>,
    /// The attach limit the node plugins are deployed with (what NodeGetInfo
    /// reports as max_volumes_per_node; 0: none configured).
    pub max_volumes_per_node: u32,
}

/// A StorageClass of the driver under test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsiStorageClass {
    /// Object name.
    pub name: String,
    /// The driver's parameters (the lab adds nothing but `csi.storage.k8s.io/fstype`
    /// from `fstype:`).
    pub parameters: BTreeMap<String, String>,
    /// `Delete` or `Retain`.
    pub reclaim_policy: String,
}

/// The StorageClass a `csi:` scenario gets when it declares none.
pub const DEFAULT_CSI_CLASS: &str = "standard";
/// The node a `csi:` scenario gets when it declares none.
pub const DEFAULT_CSI_NODE: &str = "node-0";

impl Csi {
    /// The CSI side of a `bosh:` section: its nodes, and its StorageClasses
    /// with the parameters bosh-csi's StorageClasses carry.
    pub fn with_bosh(bosh: Bosh) -> Csi {
        let storage_classes = bosh
            .storage_classes
            .iter()
            .map(|c| CsiStorageClass {
                name: c.name.clone(),
                parameters: BTreeMap::from([
                    ("disk_pool_name".to_string(), c.disk_pool.clone()),
                    ("deployment_name".to_string(), c.deployment.clone()),
                    ("csi.storage.k8s.io/fstype".to_string(), c.fstype.clone()),
                ]),
                reclaim_policy: c.reclaim_policy.clone(),
            })
            .collect();
        Csi {
            nodes: bosh.nodes.iter().map(|n| n.name.clone()).collect(),
            storage_classes,
            max_volumes_per_node: bosh.max_volumes_per_node,
            bosh: Some(bosh),
        }
    }
}

/// What the file holds under `csi:`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCsi {
    #[serde(default)]
    nodes: Vec<String>,
    #[serde(default)]
    storage_classes: Vec<RawCsiClass>,
    #[serde(default)]
    max_volumes_per_node: u32,
}

/// A StorageClass as written under `csi: storage_classes:`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCsiClass {
    name: String,
    #[serde(default)]
    parameters: BTreeMap<String, String>,
    #[serde(default)]
    fstype: Option<String>,
    #[serde(default = "delete")]
    reclaim_policy: String,
}

fn delete() -> String {
    "Delete".into()
}

impl RawCsi {
    /// Fill in defaults and check names; errors are message + hint.
    pub(crate) fn resolve(self) -> Result<Csi, (String, Option<&'static str>)> {
        let nodes = if self.nodes.is_empty() {
            vec![DEFAULT_CSI_NODE.to_string()]
        } else {
            self.nodes
        };
        let mut seen = std::collections::BTreeSet::new();
        for n in &nodes {
            if !is_dns_label(n) || !seen.insert(n.clone()) {
                return Err((
                    format!("node `{n}` is not a DNS label, or is listed twice"),
                    Some("e.g. nodes: [node-0, node-1]"),
                ));
            }
        }
        let raw_classes = if self.storage_classes.is_empty() {
            vec![RawCsiClass {
                name: DEFAULT_CSI_CLASS.into(),
                parameters: BTreeMap::new(),
                fstype: None,
                reclaim_policy: delete(),
            }]
        } else {
            self.storage_classes
        };
        let mut storage_classes = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for c in raw_classes {
            if !is_dns_label(&c.name) || !seen.insert(c.name.clone()) {
                return Err((
                    format!(
                        "storage class `{}` is not a DNS label, or is listed twice",
                        c.name
                    ),
                    None,
                ));
            }
            if !["Delete", "Retain"].contains(&c.reclaim_policy.as_str()) {
                return Err((
                    format!(
                        "reclaim_policy `{}` is not Delete or Retain",
                        c.reclaim_policy
                    ),
                    None,
                ));
            }
            let mut parameters = c.parameters;
            if let Some(fs) = c.fstype {
                parameters.insert("csi.storage.k8s.io/fstype".into(), fs);
            }
            storage_classes.push(CsiStorageClass {
                name: c.name,
                parameters,
                reclaim_policy: c.reclaim_policy,
            });
        }
        Ok(Csi {
            nodes,
            storage_classes,
            bosh: None,
            max_volumes_per_node: self.max_volumes_per_node,
        })
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}
