//! The CSI lab's samples of the state at every step boundary, kept as what
//! changed since the sample before. Whole samples made a run of N steps
//! hold, write and read back N copies of the state: O(N²) memory (a 400-step
//! run peaked at 1 GB). Checks still see every sample whole, one at a time.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::checks::Sample;

/// Every sample of a run, in step order (the final convergence last).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples {
    deltas: Vec<SampleDelta>,
    /// The newest sample whole: what the next one is diffed against.
    last: Sample,
}

impl Samples {
    /// Add the sample taken after the samples so far.
    pub fn push(&mut self, s: Sample) {
        self.deltas.push(SampleDelta::between(&self.last, &s));
        self.last = s;
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.deltas.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.deltas.is_empty()
    }

    /// The newest sample.
    pub fn last(&self) -> Option<&Sample> {
        (!self.deltas.is_empty()).then_some(&self.last)
    }

    /// Every sample in turn, rebuilt in place and lent (no copy per sample).
    pub fn visit(&self, mut f: impl FnMut(&Sample)) {
        let mut cur = Sample::default();
        for d in &self.deltas {
            // Checked when the samples were made or read, so it applies.
            let _ = d.apply(&mut cur);
            f(&cur);
        }
    }

    /// Every mount any sample holds (a mount held by several is given as
    /// often as it was mounted): the samples start from nothing, so each
    /// came in with some sample's change.
    pub fn mounts_ever(&self) -> impl Iterator<Item = &drivelab_fakes::csi::mounts::MountView> {
        (self.deltas.iter())
            .filter_map(|d| d.mounts.as_ref())
            .flat_map(|m| &m.insert)
    }

    /// Samples from deltas as written; each must apply to the one before.
    fn replay(deltas: Vec<SampleDelta>) -> Result<Self, String> {
        let mut last = Sample::default();
        for (i, d) in deltas.iter().enumerate() {
            d.apply(&mut last)
                .map_err(|e| format!("sample {i} does not follow the one before: {e}"))?;
        }
        Ok(Self { deltas, last })
    }
}

impl FromIterator<Sample> for Samples {
    fn from_iter<I: IntoIterator<Item = Sample>>(iter: I) -> Self {
        let mut s = Samples::default();
        for x in iter {
            s.push(x);
        }
        s
    }
}

impl Serialize for Samples {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.deltas.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Samples {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Samples::replay(Vec::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A PV as a sample holds it: name, then volume handle and access modes.
type PvEntry = (String, (String, Vec<String>));

/// One sample as the change from the one before; a field that did not
/// change is left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct SampleDelta {
    step: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attachments: Option<Splice<(String, String)>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mounts: Option<Splice<drivelab_fakes::csi::mounts::MountView>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    volume_attachments: Option<Splice<(String, String, bool)>>,
    /// Over the PVs in name order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pvs: Option<Splice<PvEntry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disks: Option<Splice<drivelab_fakes::director::DiskView>>,
}

impl SampleDelta {
    fn between(old: &Sample, new: &Sample) -> Self {
        // The PV maps as entry lists, borrowed: only the stretch kept is copied.
        let (was, is): (Vec<_>, Vec<_>) = (old.pvs.iter().collect(), new.pvs.iter().collect());
        let pvs = Splice::between_by(&was, &is, |(k, v)| ((*k).clone(), (*v).clone()));
        SampleDelta {
            step: new.step,
            attachments: Splice::between(&old.attachments, &new.attachments),
            mounts: Splice::between(&old.mounts, &new.mounts),
            volume_attachments: Splice::between(&old.volume_attachments, &new.volume_attachments),
            pvs,
            disks: Splice::between(&old.disks, &new.disks),
        }
    }

    fn apply(&self, s: &mut Sample) -> Result<(), String> {
        s.step = self.step;
        let field = |name: &'static str| move |e: String| format!("{name}: {e}");
        Splice::apply_opt(&self.attachments, &mut s.attachments).map_err(field("attachments"))?;
        Splice::apply_opt(&self.mounts, &mut s.mounts).map_err(field("mounts"))?;
        Splice::apply_opt(&self.volume_attachments, &mut s.volume_attachments)
            .map_err(field("volume_attachments"))?;
        Splice::apply_opt(&self.disks, &mut s.disks).map_err(field("disks"))?;
        if let Some(p) = &self.pvs {
            let mut entries: Vec<_> = std::mem::take(&mut s.pvs).into_iter().collect();
            p.apply(&mut entries).map_err(field("pvs"))?;
            let n = entries.len();
            s.pvs = entries.into_iter().collect();
            if s.pvs.len() != n {
                return Err("pvs: two entries have one name".into());
            }
        }
        Ok(())
    }
}

/// A list made from the one before by replacing one stretch: `remove`
/// items at `at` give way to `insert`. Between two step boundaries the
/// lists change in one place or a few close together, so one stretch is small.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Splice<T> {
    at: usize,
    remove: usize,
    insert: Vec<T>,
}

impl<T: PartialEq + Clone> Splice<T> {
    /// The stretch that turns `old` into `new`; None if they are equal.
    fn between(old: &[T], new: &[T]) -> Option<Self> {
        Self::between_by(old, new, T::clone)
    }

    /// [`Splice::between`] over lists of another form (borrowed entries),
    /// `own` making the items the stretch keeps.
    fn between_by<U: PartialEq>(old: &[U], new: &[U], own: impl Fn(&U) -> T) -> Option<Self> {
        let prefix = old.iter().zip(new).take_while(|(a, b)| a == b).count();
        if prefix == old.len() && prefix == new.len() {
            return None;
        }
        let room = old.len().min(new.len()) - prefix;
        let suffix = old
            .iter()
            .rev()
            .zip(new.iter().rev())
            .take(room)
            .take_while(|(a, b)| a == b)
            .count();
        Some(Splice {
            at: prefix,
            remove: old.len() - prefix - suffix,
            insert: new[prefix..new.len() - suffix].iter().map(own).collect(),
        })
    }

    fn apply(&self, v: &mut Vec<T>) -> Result<(), String> {
        let end = self
            .at
            .checked_add(self.remove)
            .filter(|end| *end <= v.len())
            .ok_or_else(|| {
                format!(
                    "replaces {} item(s) at {} of a list of {}",
                    self.remove,
                    self.at,
                    v.len()
                )
            })?;
        v.splice(self.at..end, self.insert.iter().cloned());
        Ok(())
    }

    fn apply_opt(s: &Option<Self>, v: &mut Vec<T>) -> Result<(), String> {
        s.as_ref().map_or(Ok(()), |s| s.apply(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn sample(step: usize, attached: &[(&str, &str)], pvs: &[&str]) -> Sample {
        Sample {
            step,
            attachments: attached
                .iter()
                .map(|(d, v)| (d.to_string(), v.to_string()))
                .collect(),
            pvs: pvs
                .iter()
                .map(|p| {
                    (
                        p.to_string(),
                        (format!("h-{p}"), vec!["ReadWriteOnce".into()]),
                    )
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn samples_come_back_whole_and_in_order_through_the_record() {
        let made = vec![
            sample(0, &[], &[]),
            sample(1, &[("d1", "vm1")], &["pv-a"]),
            sample(2, &[("d1", "vm1"), ("d2", "vm2")], &["pv-a", "pv-b"]),
            sample(3, &[("d2", "vm2")], &["pv-b"]),
            sample(4, &[("d2", "vm2")], &["pv-b"]),
            sample(5, &[], &[]),
        ];
        let samples: Samples = made.iter().cloned().collect();
        assert_eq!(samples.len(), made.len());
        assert_eq!(samples.last(), made.last());
        assert_eq!(whole(&samples), made);
        let text = serde_json::to_string(&samples).unwrap();
        let read: Samples = serde_json::from_str(&text).unwrap();
        assert_eq!(read, samples);
        assert_eq!(whole(&read), made);
        // An unchanged step writes its step number only.
        assert!(text.contains(r#"{"step":4}"#), "{text}");
    }

    fn whole(samples: &Samples) -> Vec<Sample> {
        let mut out = Vec::new();
        samples.visit(|s| out.push(s.clone()));
        out
    }

    #[test]
    fn every_mount_any_sample_held_is_found_in_the_changes() {
        let mount = |node: &str, target: &str| drivelab_fakes::csi::mounts::MountView {
            node: node.into(),
            source: String::new(),
            target: target.into(),
            fstype: "ext4".into(),
            read_only: false,
            bind: false,
            disk_cid: String::new(),
            host_dir: String::new(),
            device_present: true,
        };
        let with = |step, mounts: Vec<_>| Sample {
            step,
            mounts,
            ..Default::default()
        };
        let made = [
            with(0, vec![mount("n1", "/a")]),
            with(1, vec![mount("n1", "/a"), mount("n2", "/b")]),
            with(2, vec![mount("n2", "/b")]),
            with(3, vec![]),
            with(4, vec![mount("n1", "/a")]),
        ];
        let samples: Samples = made.iter().cloned().collect();
        let ever: BTreeSet<_> = samples
            .mounts_ever()
            .map(|m| (&m.node, &m.target))
            .collect();
        let held: BTreeSet<_> = (made.iter().flat_map(|s| &s.mounts))
            .map(|m| (&m.node, &m.target))
            .collect();
        assert_eq!(ever, held);
        assert_eq!(ever.len(), 2);
    }

    #[test]
    fn a_delta_that_does_not_follow_is_refused() {
        let bad = r#"[{"step":0,"attachments":{"at":2,"remove":1,"insert":[]}}]"#;
        let e = serde_json::from_str::<Samples>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sample 0") && e.contains("attachments"), "{e}");
        let twice =
            r#"[{"step":0,"pvs":{"at":0,"remove":0,"insert":[["a",["h",[]]],["a",["h",[]]]]}}]"#;
        let e = serde_json::from_str::<Samples>(twice)
            .unwrap_err()
            .to_string();
        assert!(e.contains("one name"), "{e}");
    }

    proptest! {
        #[test]
        fn a_splice_turns_the_old_list_into_the_new(
            old in proptest::collection::vec(0u8..4, 0..12),
            new in proptest::collection::vec(0u8..4, 0..12),
        ) {
            let mut v = old.clone();
            match Splice::between(&old, &new) {
                None => prop_assert_eq!(&old, &new),
                Some(s) => {
                    prop_assert!(s.insert.len() <= new.len());
                    s.apply(&mut v).unwrap();
                    prop_assert_eq!(v, new);
                }
            }
        }
    }
}
