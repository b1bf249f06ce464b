//! The seeded bugs of every reference driver in one namespace, so scenario
//! files, `--mutant` and `drivelab mutate` name them the same way. Each
//! mutant belongs to one builtin driver; the engine hands each driver its own.

use super::BuiltinDriver;

/// A seeded bug in one of the reference drivers.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutant {
    /// A bug of the reference COSI driver (cosi-s3).
    Cosi(cosi_s3::Mutant),
    /// A bug of the reference BOSH CSI driver (bosh-csi).
    Bosh(bosh_csi::Mutant),
    /// A bug of the reference CSI driver with its own backend (hostpath-csi).
    Hostpath(hostpath_csi::Mutant),
}

impl Mutant {
    /// Every mutant of every reference driver, COSI first.
    pub fn all() -> Vec<Mutant> {
        cosi_s3::Mutant::all()
            .iter()
            .map(|m| Mutant::Cosi(*m))
            .chain(bosh_csi::Mutant::all().iter().map(|m| Mutant::Bosh(*m)))
            .chain(
                hostpath_csi::Mutant::all()
                    .iter()
                    .map(|m| Mutant::Hostpath(*m)),
            )
            .collect()
    }

    /// The kebab-case name (unique across drivers).
    pub fn name(self) -> &'static str {
        match self {
            Mutant::Cosi(m) => m.name(),
            Mutant::Bosh(m) => m.name(),
            Mutant::Hostpath(m) => m.name(),
        }
    }

    /// What the bug does and which check should catch it.
    pub fn describe(self) -> &'static str {
        match self {
            Mutant::Cosi(m) => m.describe(),
            Mutant::Bosh(m) => m.describe(),
            Mutant::Hostpath(m) => m.describe(),
        }
    }

    /// The driver it lives in.
    pub fn driver(self) -> BuiltinDriver {
        match self {
            Mutant::Cosi(_) => BuiltinDriver::CosiS3,
            Mutant::Bosh(_) => BuiltinDriver::BoshCsi,
            Mutant::Hostpath(_) => BuiltinDriver::HostpathCsi,
        }
    }

    /// By name, as written in files and on the command line.
    pub fn parse(s: &str) -> Option<Mutant> {
        let s = s.trim();
        Mutant::all().into_iter().find(|m| m.name() == s)
    }

    /// The cosi-s3 mutants among `ms`.
    pub fn cosi(ms: &[Mutant]) -> Vec<cosi_s3::Mutant> {
        ms.iter()
            .filter_map(|m| match m {
                Mutant::Cosi(c) => Some(*c),
                _ => None,
            })
            .collect()
    }

    /// The hostpath-csi mutants among `ms`.
    pub fn hostpath(ms: &[Mutant]) -> Vec<hostpath_csi::Mutant> {
        ms.iter()
            .filter_map(|m| match m {
                Mutant::Hostpath(h) => Some(*h),
                _ => None,
            })
            .collect()
    }

    /// The bosh-csi mutants among `ms`.
    pub fn bosh(ms: &[Mutant]) -> Vec<bosh_csi::Mutant> {
        ms.iter()
            .filter_map(|m| match m {
                Mutant::Bosh(b) => Some(*b),
                _ => None,
            })
            .collect()
    }
}

impl std::fmt::Display for Mutant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for Mutant {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Mutant {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Mutant::parse(&s).ok_or_else(|| {
            let names: Vec<&str> = Mutant::all().iter().map(|m| m.name()).collect();
            serde::de::Error::custom(format!(
                "unknown mutant `{s}` (one of {})",
                names.join(", ")
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_across_drivers_and_round_trip() {
        let all = Mutant::all();
        let mut names: Vec<&str> = all.iter().map(|m| m.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for m in all {
            assert_eq!(Mutant::parse(m.name()), Some(m));
        }
        assert_eq!(Mutant::parse("no-such-bug"), None);
    }
}
