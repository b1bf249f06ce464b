//! A fake UAA (client credentials) and the Director's bearer-token check:
//! HS256 JWTs carrying the client's scopes and (when per-deployment scoping
//! is on) its deployments, expiring on the virtual clock.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::secret::Secret;

/// `bosh.admin`: passes every check.
pub const ADMIN: &str = "bosh.admin";

/// A dynamic-disks permission and the RFC's scope for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permission {
    /// `bosh.dynamic-disks.create`
    Create,
    /// `bosh.dynamic-disks.attach`
    Attach,
    /// `bosh.dynamic-disks.detach`
    Detach,
    /// `bosh.dynamic-disks.delete`
    Delete,
    /// `bosh.dynamic-disks.list`
    List,
    /// `bosh.read` (deployments, instances)
    Read,
}

impl Permission {
    /// The scope string.
    pub fn scope(self) -> &'static str {
        match self {
            Permission::Create => "bosh.dynamic-disks.create",
            Permission::Attach => "bosh.dynamic-disks.attach",
            Permission::Detach => "bosh.dynamic-disks.detach",
            Permission::Delete => "bosh.dynamic-disks.delete",
            Permission::List => "bosh.dynamic-disks.list",
            Permission::Read => "bosh.read",
        }
    }
}

/// What a verified token says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Token id.
    pub jti: String,
    /// The UAA client it was issued to.
    pub client_id: String,
    /// Granted scopes.
    pub scope: Vec<String>,
    /// Deployments the client may touch (empty: all).
    #[serde(default)]
    pub deployments: Vec<String>,
    /// Issued at (virtual seconds).
    pub iat: u64,
    /// Expires at (virtual seconds).
    pub exp: u64,
}

impl Claims {
    /// Holds bosh.admin.
    pub fn is_admin(&self) -> bool {
        self.scope.iter().any(|s| s == ADMIN)
    }

    /// Holds `p`'s scope (or admin).
    pub fn has(&self, p: Permission) -> bool {
        self.is_admin() || self.scope.iter().any(|s| s == p.scope())
    }

    /// May touch `deployment` (admin and unscoped clients may touch all).
    pub fn may_touch(&self, deployment: &str) -> bool {
        self.is_admin()
            || self.deployments.is_empty()
            || self.deployments.iter().any(|d| d == deployment)
    }
}

type HmacSha256 = Hmac<Sha256>;

fn mac(key: &Secret, data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length; new_from_slice cannot fail for it.
    match HmacSha256::new_from_slice(key.expose().as_bytes()) {
        Ok(mut m) => {
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

/// Sign `claims` as a JWT.
pub fn issue(key: &Secret, claims: &Claims) -> Secret {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap_or_default());
    let signing_input = format!("{header}.{body}");
    let sig = URL_SAFE_NO_PAD.encode(mac(key, signing_input.as_bytes()));
    Secret::new(format!("{signing_input}.{sig}"))
}

/// Why a token was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum TokenError {
    /// Not a token we signed.
    Invalid,
    /// Past its `exp`.
    Expired,
}

/// Verify a token's signature and expiry at virtual second `now`.
pub fn verify(key: &Secret, token: &str, now: u64) -> Result<Claims, TokenError> {
    let mut parts = token.split('.');
    let (Some(h), Some(b), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Invalid);
    };
    let got = URL_SAFE_NO_PAD.decode(s).map_err(|_| TokenError::Invalid)?;
    // verify_slice compares in constant time.
    let mut m =
        HmacSha256::new_from_slice(key.expose().as_bytes()).map_err(|_| TokenError::Invalid)?;
    m.update(format!("{h}.{b}").as_bytes());
    m.verify_slice(&got).map_err(|_| TokenError::Invalid)?;
    let body = URL_SAFE_NO_PAD.decode(b).map_err(|_| TokenError::Invalid)?;
    let claims: Claims = serde_json::from_slice(&body).map_err(|_| TokenError::Invalid)?;
    if claims.exp <= now {
        return Err(TokenError::Expired);
    }
    Ok(claims)
}

/// Tokens that verified, with their claims. A client sends the same token on
/// every request until it expires; checking its HMAC and decoding its claims
/// again each time was an eighth of the fake Director's own work per call.
/// Only a token byte-equal to one that verified under the same key is
/// taken from here; its expiry is still checked at every use.
#[derive(Default)]
pub struct Verified(std::sync::Mutex<Vec<(Secret, Claims)>>);

/// How many distinct tokens [`Verified`] keeps (one per client in practice);
/// past it, it starts over.
const VERIFIED_KEPT: usize = 16;

impl Verified {
    /// [`verify`], answered from the tokens already verified where it can be.
    pub fn verify(&self, key: &Secret, token: &str, now: u64) -> Result<Claims, TokenError> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, claims)) = kept.iter().find(|(t, _)| t.expose() == token) {
            return if claims.exp <= now {
                Err(TokenError::Expired)
            } else {
                Ok(claims.clone())
            };
        }
        let claims = verify(key, token, now)?;
        if kept.len() >= VERIFIED_KEPT {
            kept.clear();
        }
        kept.push((Secret::new(token), claims.clone()));
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            jti: "1".into(),
            client_id: "csi".into(),
            scope: vec![Permission::Attach.scope().into()],
            deployments: vec!["a".into()],
            iat: 0,
            exp: 100,
        }
    }

    #[test]
    fn token_round_trip_and_refusals() {
        let k = Secret::new("key");
        let t = issue(&k, &claims());
        assert_eq!(verify(&k, t.expose(), 5), Ok(claims()));
        assert_eq!(verify(&k, t.expose(), 100), Err(TokenError::Expired));
        assert_eq!(
            verify(&Secret::new("other"), t.expose(), 5),
            Err(TokenError::Invalid)
        );
        let mut forged = t.expose().to_string();
        forged.insert(forged.len() - 2, 'x');
        assert_eq!(verify(&k, &forged, 5), Err(TokenError::Invalid));
        assert_eq!(verify(&k, "a.b", 5), Err(TokenError::Invalid));
        let c = claims();
        assert!(c.has(Permission::Attach) && !c.has(Permission::Delete));
        assert!(c.may_touch("a") && !c.may_touch("b"));
    }

    #[test]
    fn kept_tokens_answer_as_verify_does() {
        let k = Secret::new("key");
        let kept = Verified::default();
        let t = issue(&k, &claims());
        let mut forged = t.expose().to_string();
        forged.insert(forged.len() - 2, 'x');
        for _ in 0..2 {
            // First from verify, then from what it kept: the same answers.
            assert_eq!(kept.verify(&k, t.expose(), 5), Ok(claims()));
            assert_eq!(kept.verify(&k, &forged, 5), Err(TokenError::Invalid));
        }
        assert_eq!(kept.verify(&k, t.expose(), 100), Err(TokenError::Expired));
        // More clients than it keeps: it starts over and still answers.
        for i in 0..(VERIFIED_KEPT as u64 + 3) {
            let c = Claims {
                jti: i.to_string(),
                ..claims()
            };
            let t = issue(&k, &c);
            assert_eq!(kept.verify(&k, t.expose(), 5), Ok(c));
        }
        assert!(kept.0.lock().unwrap().len() <= VERIFIED_KEPT);
    }
}
