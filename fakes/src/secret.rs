//! A secret value the lab handles but must never write out: `Debug` and
//! `Display` print a redaction marker, and it serialises only as a keyed
//! fingerprint, inside [`fingerprinting`] (a run's stored record).

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

// A run's record (what its checks read, kept to re-judge it later) must hold
// secrets without holding them: inside `fingerprinting`, a Secret serialises
// as a keyed fingerprint (HMAC-SHA256 under a key drawn for that record and
// never stored), so equal secrets stay equal and nothing can be recovered —
// not even a low-entropy secret by trying candidates. Outside a scope it
// refuses to serialise at all. A fingerprint read back is a Secret whose value
// is the fingerprint: comparisons still work, the raw value is gone.

thread_local! {
    static FINGERPRINT_KEY: std::cell::RefCell<Option<[u8; 32]>> = const { std::cell::RefCell::new(None) };
}

/// The prefix a fingerprinted secret's value carries.
pub const FINGERPRINT_PREFIX: &str = "fp:";

/// Run `f` (a serialisation) with secrets written as fingerprints under `key`.
pub fn fingerprinting<T>(key: [u8; 32], f: impl FnOnce() -> T) -> T {
    struct Reset(Option<[u8; 32]>);
    impl Drop for Reset {
        fn drop(&mut self) {
            FINGERPRINT_KEY.with(|k| *k.borrow_mut() = self.0.take());
        }
    }
    let _reset = Reset(FINGERPRINT_KEY.with(|k| k.borrow_mut().replace(key)));
    f()
}

impl Secret {
    /// The keyed fingerprint of this value (a fingerprint stays as it is, so a
    /// record read back and written again keeps its values).
    pub fn fingerprint(&self, key: &[u8; 32]) -> String {
        use hmac::{Hmac, Mac};
        if self.is_fingerprint() {
            return self.0.clone();
        }
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key)
            .expect("HMAC takes a key of any length");
        mac.update(self.0.as_bytes());
        let digest = mac.finalize().into_bytes();
        format!("{FINGERPRINT_PREFIX}{}", hex::encode(&digest[..16]))
    }

    /// True for a value read back from a record (a fingerprint, not a secret).
    pub fn is_fingerprint(&self) -> bool {
        self.0.len() == FINGERPRINT_PREFIX.len() + 32 && self.0.starts_with(FINGERPRINT_PREFIX)
    }
}

impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match FINGERPRINT_KEY.with(|k| *k.borrow()) {
            Some(key) => s.serialize_str(&self.fingerprint(&key)),
            None => Err(serde::ser::Error::custom(
                "a secret may be written only as a fingerprint (secret::fingerprinting)",
            )),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_only_as_a_keyed_fingerprint() {
        let s = Secret::new("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
        assert!(serde_json::to_string(&s).is_err(), "no scope, no output");
        let a = fingerprinting([1; 32], || serde_json::to_string(&s).unwrap());
        let again = fingerprinting([1; 32], || serde_json::to_string(&s).unwrap());
        let other_key = fingerprinting([2; 32], || serde_json::to_string(&s).unwrap());
        assert_eq!(a, again, "one key: equal secrets stay equal");
        assert_ne!(a, other_key);
        assert!(!a.contains("EXAMPLE"), "{a}");
        let back: Secret = serde_json::from_str(&a).unwrap();
        assert!(back.is_fingerprint());
        // Written again, a fingerprint keeps its value under any key.
        let rewritten = fingerprinting([2; 32], || serde_json::to_string(&back).unwrap());
        assert_eq!(rewritten, a);
        assert!(
            serde_json::to_string(&s).is_err(),
            "the scope ends with the call"
        );
    }
}
