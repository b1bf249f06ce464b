//! A secret value the lab handles but must never write out: it has no
//! `Serialize`, and `Debug`/`Display` print a redaction marker.

use std::fmt;

/// A secret string (access secret key, admin secret). Compare and expose only on purpose.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret value.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    /// The raw value, for the places that must send it (signing, the driver).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}
