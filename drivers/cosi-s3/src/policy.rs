//! Deterministic names (checkpoint objects, generated policies) and the
//! per-grant policy documents. A generated policy is owned by exactly one
//! grant and scoped to exactly one bucket, so replacing it never touches
//! anyone else's permissions.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::config::AccessMode;

/// First 16 hex chars of sha256(s): short, DNS-safe, stable across restarts.
pub fn short_hash(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    hex::encode(&d[..8])
}

/// Name of the checkpoint object for a bucket (the bucket name itself may not be a DNS label).
pub fn bucket_checkpoint_name(bucket: &str) -> String {
    format!("bucket-{}", short_hash(bucket))
}

/// Name of the checkpoint Secret for a grant, from the COSI account name.
pub fn grant_checkpoint_name(account_name: &str) -> String {
    format!("grant-{}", short_hash(account_name))
}

/// Name of the ConfigMap reserving one access key (`preferredAccessKey`).
pub fn key_reservation_name(access_key: &str) -> String {
    format!("key-{}", short_hash(access_key))
}

/// Name of the canned policy generated for one grant.
pub fn generated_policy_name(account_name: &str) -> String {
    format!("cosi-{}", short_hash(account_name))
}

/// Name of the owner-marker policy of one grant (`per-grant-with-owner-marker` layout).
pub fn owner_marker_policy_name(account_name: &str) -> String {
    format!("cosi-owner-{}", short_hash(account_name))
}

/// The owner marker's document: only `s3:GetBucketLocation` on the grant's
/// bucket, a subset of every access mode, so the marker never widens access.
pub fn owner_marker_document(bucket: &str) -> Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Action": ["s3:GetBucketLocation"],
            "Resource": [format!("arn:aws:s3:::{bucket}")],
        }]
    })
}

/// Policy name the `shared-policy` mutant uses when the class names none.
pub const SHARED_POLICY_FALLBACK: &str = "cosi-shared";

/// The actions a grant gets, per access mode.
pub fn actions(mode: AccessMode) -> &'static [&'static str] {
    match mode {
        AccessMode::ReadWrite => &[
            "s3:GetObject",
            "s3:PutObject",
            "s3:DeleteObject",
            "s3:ListBucket",
            "s3:GetBucketLocation",
        ],
        AccessMode::ReadOnly => &["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"],
    }
}

/// IAM policy document granting `mode` on exactly `bucket` and its objects.
pub fn policy_document(bucket: &str, mode: AccessMode) -> Value {
    json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Action": actions(mode),
            "Resource": [
                format!("arn:aws:s3:::{bucket}"),
                format!("arn:aws:s3:::{bucket}/*"),
            ],
        }]
    })
}

/// Whether a document read back from info-canned-policy is the one we would
/// write. Servers may reorder keys or wrap the document, so compare parsed.
pub fn same_document(found: &Value, want: &Value) -> bool {
    normalise(found) == normalise(want)
}

fn normalise(v: &Value) -> Value {
    // Single-element Action/Resource may come back as a bare string; lists
    // are sets in IAM, so sort them.
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("Action" | "Resource", Value::String(s)) => {
                            Value::Array(vec![Value::String(s.clone())])
                        }
                        _ => v.clone(),
                    };
                    (k.clone(), normalise(&v))
                })
                .collect(),
        ),
        Value::Array(a) => {
            let mut items: Vec<Value> = a.iter().map(normalise).collect();
            if items.iter().all(|i| i.is_string()) {
                items.sort_by(|x, y| x.as_str().cmp(&y.as_str()));
            }
            Value::Array(items)
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::is_dns_label;

    #[test]
    fn names_are_deterministic_dns_labels() {
        let a = grant_checkpoint_name("ba-0f6e7c1a-2b3c-4d5e-8f90-123456789abc");
        assert_eq!(
            a,
            grant_checkpoint_name("ba-0f6e7c1a-2b3c-4d5e-8f90-123456789abc")
        );
        assert_ne!(a, grant_checkpoint_name("ba-other"));
        assert_eq!(a.len(), "grant-".len() + 16);
        assert!(is_dns_label(&a));
        let b = bucket_checkpoint_name("bucket-x");
        assert!(is_dns_label(&b) && b.starts_with("bucket-"));
        let p = generated_policy_name("ba-1");
        assert!(p.starts_with("cosi-") && p.len() == 21);
        assert_eq!(short_hash(""), "e3b0c44298fc1c14");
    }

    #[test]
    fn documents_are_scoped_to_one_bucket() {
        let d = policy_document("b1", AccessMode::ReadWrite);
        let st = &d["Statement"][0];
        assert_eq!(st["Effect"], "Allow");
        assert_eq!(
            st["Resource"],
            json!(["arn:aws:s3:::b1", "arn:aws:s3:::b1/*"])
        );
        let acts: Vec<&str> = st["Action"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            acts,
            [
                "s3:GetObject",
                "s3:PutObject",
                "s3:DeleteObject",
                "s3:ListBucket",
                "s3:GetBucketLocation"
            ]
        );
        let ro = policy_document("b1", AccessMode::ReadOnly);
        let acts = ro["Statement"][0]["Action"].as_array().unwrap();
        assert!(!acts
            .iter()
            .any(|a| a == "s3:PutObject" || a == "s3:DeleteObject"));
        assert!(d.to_string().matches("arn:aws:s3:::").count() == 2);
    }

    #[test]
    fn document_comparison_tolerates_server_rewrites() {
        let want = policy_document("b1", AccessMode::ReadOnly);
        let reordered = json!({
            "Statement": [{
                "Resource": ["arn:aws:s3:::b1/*", "arn:aws:s3:::b1"],
                "Action": ["s3:ListBucket", "s3:GetObject", "s3:GetBucketLocation"],
                "Effect": "Allow"
            }],
            "Version": "2012-10-17"
        });
        assert!(same_document(&reordered, &want));
        assert!(!same_document(
            &policy_document("b2", AccessMode::ReadOnly),
            &want
        ));
        assert!(!same_document(
            &policy_document("b1", AccessMode::ReadWrite),
            &want
        ));
    }
}
