//! `scale:` under `bosh:` — a generated fleet and volume churn: N nodes on one
//! deployment, V volumes in waves (create, attach on a seeded node, reschedule
//! some pods to other nodes, detach, delete), a rolling update of the
//! deployment during the middle wave's reschedules, and `wait` between waves;
//! each part of a wave is one `batch` (its changes at once, one convergence).
//! The expansion is fixed by `seed`; `drivelab validate --expand` prints it.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::Deserialize;

use super::scenario::{DeploymentRef, PodRef, PublishStep, VolumeRef, VolumeStep};

/// Most nodes a generated fleet may have.
pub const MAX_NODES: u32 = 1000;
/// Most volumes a generated churn may have.
pub const MAX_VOLUMES: u32 = 100_000;

/// The `scale:` block as written.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScale {
    nodes: u32,
    volumes: u32,
    #[serde(default)]
    wave: Option<u32>,
    #[serde(default)]
    every: Option<String>,
    #[serde(default = "quarter")]
    reschedule_percent: u32,
    #[serde(default = "yes")]
    rolling_update: bool,
    #[serde(default = "one")]
    seed: u64,
}

fn quarter() -> u32 {
    25
}
fn yes() -> bool {
    true
}
fn one() -> u64 {
    1
}

/// A generated fleet and churn, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scale {
    /// Nodes, one per instance of the deployment.
    pub nodes: u32,
    /// Volumes churned in all.
    pub volumes: u32,
    /// Volumes per wave.
    pub wave: u32,
    /// Virtual time from one wave's end to the next wave's start.
    pub every: Duration,
    /// Percent of each wave's pods rescheduled to another node.
    pub reschedule_percent: u32,
    /// A rolling update of the deployment runs beside the middle wave's reschedules.
    pub rolling_update: bool,
    /// Seeds the node choices.
    pub seed: u64,
}

impl RawScale {
    /// Check the sizes; errors are message + hint.
    pub(crate) fn resolve(self) -> Result<Scale, (String, Option<&'static str>)> {
        if self.nodes < 2 || self.nodes > MAX_NODES {
            return Err((
                format!(
                    "scale: `nodes` is {}; it must be 2..={MAX_NODES}",
                    self.nodes
                ),
                Some("reschedules need a second node"),
            ));
        }
        if self.volumes == 0 || self.volumes > MAX_VOLUMES {
            return Err((
                format!(
                    "scale: `volumes` is {}; it must be 1..={MAX_VOLUMES}",
                    self.volumes
                ),
                None,
            ));
        }
        let wave = self.wave.unwrap_or(self.nodes.min(self.volumes));
        if wave == 0 || wave > self.volumes {
            return Err((
                format!(
                    "scale: `wave` is {wave}; it must be 1..=volumes ({})",
                    self.volumes
                ),
                Some("a wave is how many volumes churn at once"),
            ));
        }
        if self.reschedule_percent > 100 {
            return Err(("scale: `reschedule_percent` is at most 100".into(), None));
        }
        let every = match &self.every {
            None => Duration::from_secs(60),
            Some(s) => crate::scenario::parse_duration(s).ok_or_else(|| {
                (
                    format!("scale: `every` is `{s}`, not a duration"),
                    Some("write e.g. 30s, 1m"),
                )
            })?,
        };
        Ok(Scale {
            nodes: self.nodes,
            volumes: self.volumes,
            wave,
            every,
            reschedule_percent: self.reschedule_percent,
            rolling_update: self.rolling_update,
            seed: self.seed,
        })
    }
}

/// One generated step, before the validator checks it like a written one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenStep {
    /// `create_volume`.
    Create(VolumeStep),
    /// `publish`.
    Publish(PublishStep),
    /// `unpublish`.
    Unpublish(PodRef),
    /// `delete_volume`.
    Delete(VolumeRef),
    /// `rolling_update`.
    RollingUpdate(DeploymentRef),
    /// `wait`.
    Wait(String),
    /// `batch` (one or more of the above, one convergence).
    Batch(Vec<GenStep>),
}

fn together(v: Vec<GenStep>) -> Option<GenStep> {
    (!v.is_empty()).then_some(GenStep::Batch(v))
}

/// The node name of instance `i` of the generated deployment.
pub fn node_name(i: u32) -> String {
    format!("node-{i}")
}

impl Scale {
    /// The steps the block stands for, waves in order.
    pub fn expand(&self, deployment: &str) -> Vec<GenStep> {
        let mut rng = ChaCha20Rng::seed_from_u64(self.seed);
        let ns = || crate::scenario::default_namespace();
        let waves = self.volumes.div_ceil(self.wave);
        let middle = waves / 2;
        let mut out = Vec::new();
        for w in 0..waves {
            let k = self.wave.min(self.volumes - w * self.wave);
            let vol = |i: u32| format!("v{w}-{i}");
            let pod = |i: u32| format!("p{w}-{i}");
            let moved = |i: u32| format!("p{w}-{i}-r");
            out.extend(together(
                (0..k)
                    .map(|i| {
                        GenStep::Create(VolumeStep {
                            name: vol(i),
                            class: String::new(),
                            namespace: ns(),
                            size: "1Gi".into(),
                            access: Default::default(),
                        })
                    })
                    .collect(),
            ));
            let placed: Vec<u32> = (0..k).map(|_| rng.random_range(0..self.nodes)).collect();
            out.extend(together(
                (0..k)
                    .map(|i| {
                        GenStep::Publish(PublishStep {
                            pod: pod(i),
                            volume: vol(i),
                            node: node_name(placed[i as usize]),
                            namespace: ns(),
                            read_only: false,
                        })
                    })
                    .collect(),
            ));
            let r = k * self.reschedule_percent / 100;
            out.extend(together(
                (0..r)
                    .map(|i| {
                        GenStep::Unpublish(PodRef {
                            pod: pod(i),
                            namespace: ns(),
                        })
                    })
                    .collect(),
            ));
            let mut again: Vec<GenStep> = (0..r)
                .map(|i| {
                    // Another node than the first: one of the other N-1.
                    let mut n = rng.random_range(0..self.nodes - 1);
                    if n >= placed[i as usize] {
                        n += 1;
                    }
                    GenStep::Publish(PublishStep {
                        pod: moved(i),
                        volume: vol(i),
                        node: node_name(n),
                        namespace: ns(),
                        read_only: false,
                    })
                })
                .collect();
            if self.rolling_update && w == middle {
                again.insert(
                    0,
                    GenStep::RollingUpdate(DeploymentRef {
                        deployment: deployment.to_string(),
                    }),
                );
            }
            out.extend(together(again));
            out.extend(together(
                (0..k)
                    .map(|i| {
                        GenStep::Unpublish(PodRef {
                            pod: if i < r { moved(i) } else { pod(i) },
                            namespace: ns(),
                        })
                    })
                    .collect(),
            ));
            out.extend(together(
                (0..k)
                    .map(|i| {
                        GenStep::Delete(VolumeRef {
                            name: vol(i),
                            namespace: ns(),
                        })
                    })
                    .collect(),
            ));
            if w + 1 < waves && !self.every.is_zero() {
                out.push(GenStep::Wait(crate::scenario::write::duration(self.every)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scale(nodes: u32, volumes: u32, wave: u32) -> Scale {
        RawScale {
            nodes,
            volumes,
            wave: Some(wave),
            every: None,
            reschedule_percent: 50,
            rolling_update: true,
            seed: 7,
        }
        .resolve()
        .unwrap()
    }

    #[test]
    fn expansion_is_fixed_by_the_seed_and_reschedules_elsewhere() {
        let s = scale(3, 8, 4);
        let a = s.expand("k8s");
        assert_eq!(a, s.expand("k8s"));
        // Two waves of create, publish, unpublish, re-publish, unpublish, delete; one wait.
        assert_eq!(a.len(), 13);
        let GenStep::Batch(first) = &a[1] else {
            panic!("{:?}", a[1])
        };
        let GenStep::Batch(moved) = &a[3] else {
            panic!("{:?}", a[3])
        };
        for (p, m) in first.iter().zip(moved) {
            if let (GenStep::Publish(p), GenStep::Publish(m)) = (p, m) {
                assert_eq!(p.volume, m.volume);
                assert_ne!(p.node, m.node, "a reschedule goes to another node");
            }
        }
        // The middle wave (the second of two) reschedules beside a rolling update.
        let GenStep::Batch(mid) = &a[10] else {
            panic!("{:?}", a[10])
        };
        assert!(matches!(mid[0], GenStep::RollingUpdate(_)));
    }

    #[test]
    fn sizes_are_bounded() {
        let raw = |nodes, volumes, wave| RawScale {
            nodes,
            volumes,
            wave,
            every: None,
            reschedule_percent: 25,
            rolling_update: true,
            seed: 1,
        };
        assert!(raw(1, 10, None).resolve().is_err());
        assert!(raw(1001, 10, None).resolve().is_err());
        assert!(raw(10, 0, None).resolve().is_err());
        assert!(raw(10, 5, Some(6)).resolve().is_err());
        assert_eq!(raw(10, 5, None).resolve().unwrap().wave, 5);
    }
}
