//! The MinIO/RustFS admin API: users, canned policies and their attachment,
//! server info. Root credentials only. On `/minio/admin` the bodies madmin
//! encrypts are encrypted here too; `/rustfs/admin` speaks plain JSON.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use http::{HeaderValue, Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::backend::{Backend, Site};
use super::errors::{admin_error_response, rustfs_admin_error_response, ApiError};
use super::madmin;
use super::policy::Policy;
use super::sigv4::{parse_query, query_value};
use super::state::{now_rfc3339, PolicyRec, UserRec};
use super::{
    authenticate, caller_secret, read_body, surface, BodyLimit, Inner, Principal, Surface,
};
use crate::ops::Op;

type Query = [(Vec<u8>, Vec<u8>)];

/// Which server's admin API a request addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavour {
    /// `/minio/admin/v3`: madmin-encrypted bodies.
    Minio,
    /// `/rustfs/admin/v3`: plain JSON bodies.
    Rustfs,
}

/// The admin API's operations: what its gate records and faults aim at.
pub mod ops {
    crate::declare_ops!(
        /// Every admin API operation.
        pub ALL {
            ADD_USER = "add_user",
            REMOVE_USER = "remove_user",
            USER_INFO = "user_info",
            LIST_USERS = "list_users",
            SET_USER_STATUS = "set_user_status",
            LIST_CANNED_POLICIES = "list_canned_policies",
            INFO_CANNED_POLICY = "info_canned_policy",
            ADD_CANNED_POLICY = "add_canned_policy",
            REMOVE_CANNED_POLICY = "remove_canned_policy",
            SET_POLICY = "set_policy",
            ATTACH_POLICY = "attach_policy",
            DETACH_POLICY = "detach_policy",
            SERVER_INFO = "server_info",
            ADD_SERVICE_ACCOUNT = "add_service_account",
            UPDATE_SERVICE_ACCOUNT = "update_service_account",
            INFO_SERVICE_ACCOUNT = "info_service_account",
            LIST_SERVICE_ACCOUNTS = "list_service_accounts",
            DELETE_SERVICE_ACCOUNT = "delete_service_account",
            UNKNOWN_ADMIN_API = "unknown_admin_api",
        }
    );
}

/// Operation name and subject for the gate.
pub(crate) fn classify(method: &Method, route: Option<&str>, q: &Query) -> (Op, String) {
    use ops::*;
    let arg = |name: &str| query_value(q, name).unwrap_or_default();
    match (method.as_str(), route.unwrap_or("")) {
        ("PUT", "add-user") => (ADD_USER, arg("accessKey")),
        ("DELETE", "remove-user") => (REMOVE_USER, arg("accessKey")),
        ("GET", "user-info") => (USER_INFO, arg("accessKey")),
        ("GET", "list-users") => (LIST_USERS, String::new()),
        ("PUT", "set-user-status") => (SET_USER_STATUS, arg("accessKey")),
        ("GET", "list-canned-policies") => (LIST_CANNED_POLICIES, String::new()),
        ("GET", "info-canned-policy") => (INFO_CANNED_POLICY, arg("name")),
        ("PUT", "add-canned-policy") => (ADD_CANNED_POLICY, arg("name")),
        ("DELETE", "remove-canned-policy") => (REMOVE_CANNED_POLICY, arg("name")),
        ("PUT", "set-user-or-group-policy") | ("PUT", "set-policy") => {
            (SET_POLICY, arg("userOrGroup"))
        }
        // The user is inside the (possibly encrypted) body, which the gate does not read.
        ("POST", "idp/builtin/policy/attach") => (ATTACH_POLICY, String::new()),
        ("POST", "idp/builtin/policy/detach") => (DETACH_POLICY, String::new()),
        ("GET", "info") => (SERVER_INFO, String::new()),
        ("PUT", "add-service-account") => (ADD_SERVICE_ACCOUNT, String::new()),
        ("POST", "update-service-account") => (UPDATE_SERVICE_ACCOUNT, arg("accessKey")),
        ("GET", "info-service-account") => (INFO_SERVICE_ACCOUNT, arg("accessKey")),
        ("GET", "list-service-accounts") => (LIST_SERVICE_ACCOUNTS, arg("user")),
        ("DELETE", "delete-service-account") => (DELETE_SERVICE_ACCOUNT, arg("accessKey")),
        _ => (UNKNOWN_ADMIN_API, String::new()),
    }
}

fn json_response(status: u16, body: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn ok_empty() -> Response {
    json_response(200, Vec::new())
}

/// axum handler for `/minio/admin/...` and `/rustfs/admin/...`.
pub(crate) async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    match serve(&inner, parts, body).await {
        Ok(r) => r,
        Err(e) => match inner.config.backend {
            Backend::Minio => admin_error_response(&e, &path),
            Backend::Rustfs => rustfs_admin_error_response(&e),
        },
    }
}

fn version_mismatch(found: &str) -> ApiError {
    let msg = if found == "v3" {
        "This 'admin' API is not supported by server in 'mode-server-xl-single'".to_string()
    } else {
        format!("Server expects client requests with 'admin' API version 'v3', found '{found}', please upgrade the client to latest releases")
    };
    ApiError::new(426, "XMinioAdminVersionMismatch", msg)
}

async fn serve(
    inner: &Arc<Inner>,
    parts: http::request::Parts,
    body: Body,
) -> Result<Response, ApiError> {
    let path = parts.uri.path().to_string();
    let backend = inner.config.backend;
    let Surface::Admin { flavour, route } = surface(&path, backend) else {
        return Err(backend.unknown_route(version_mismatch("")));
    };
    let Some(route) = route else {
        let found = path.split('/').nth(3).unwrap_or("");
        return Err(backend.unknown_route(version_mismatch(found)));
    };
    let query = parse_query(parts.uri.query())?;
    let body = read_body(&parts, body, BodyLimit::Admin(backend)).await?;
    let (who, (body, _trailers)) = authenticate(inner, &parts, &query, body)?;
    if !matches!(who, Principal::Root) {
        return Err(ApiError::access_denied());
    }
    let secret = caller_secret(inner, &who).unwrap_or_default();
    let (op, _) = classify(&parts.method, Some(route), &query);
    let ctx = Ctx {
        inner: inner.clone(),
        flavour,
        secret,
        query,
    };
    match op {
        ops::ADD_USER => ctx.add_user(body).await,
        ops::REMOVE_USER => ctx.remove_user(),
        ops::USER_INFO => ctx.user_info(),
        ops::LIST_USERS => ctx.list_users().await,
        ops::SET_USER_STATUS => ctx.set_user_status(),
        ops::LIST_CANNED_POLICIES => ctx.list_policies(),
        ops::INFO_CANNED_POLICY => ctx.info_policy(),
        ops::ADD_CANNED_POLICY => ctx.add_policy(&body),
        ops::REMOVE_CANNED_POLICY => ctx.remove_policy(),
        ops::SET_POLICY => ctx.set_policy(),
        ops::ATTACH_POLICY => ctx.attach_detach(body, true).await,
        ops::DETACH_POLICY => ctx.attach_detach(body, false).await,
        ops::SERVER_INFO => ctx.info(),
        ops::ADD_SERVICE_ACCOUNT
        | ops::UPDATE_SERVICE_ACCOUNT
        | ops::INFO_SERVICE_ACCOUNT
        | ops::LIST_SERVICE_ACCOUNTS
        | ops::DELETE_SERVICE_ACCOUNT => Err(ApiError::new(
            501,
            "NotImplemented",
            format!(
                "Service accounts ({} {route}) are not implemented by the drivelab admin API fake ({} profile).",
                parts.method, inner.config.backend
            ),
        )),
        _ => Err(backend.unknown_route(version_mismatch("v3"))),
    }
}

struct Ctx {
    inner: Arc<Inner>,
    flavour: Flavour,
    secret: String,
    query: super::sigv4::QueryPairs,
}

#[derive(Deserialize)]
struct AddUserReq {
    #[serde(rename = "secretKey")]
    secret_key: String,
    /// MinIO defaults it to enabled; RustFS's `AddOrUpdateUserReq` requires it.
    #[serde(default)]
    status: Option<String>,
}

#[derive(Deserialize)]
struct AssocReq {
    #[serde(default)]
    policies: Vec<String>,
    #[serde(default)]
    user: String,
    #[serde(default)]
    group: String,
}

fn user_info_json(u: &UserRec) -> Value {
    let mut m = serde_json::Map::new();
    if !u.policies.is_empty() {
        m.insert("policyName".into(), Value::String(u.policies.join(",")));
    }
    m.insert("status".into(), Value::String(u.status.clone()));
    m.insert("updatedAt".into(), Value::String(u.updated_at.clone()));
    Value::Object(m)
}

fn groups_not_supported() -> ApiError {
    ApiError::new(
        501,
        "NotImplemented",
        "Groups are not implemented by the drivelab admin API fake.",
    )
}

impl Ctx {
    fn backend(&self) -> Backend {
        self.inner.config.backend
    }

    /// RustFS's user handlers refuse to act on the caller's own access key
    /// (`user.rs` RemoveUser, SetUserStatus); the caller is always root here.
    fn refuse_own_user(&self, ak: &str, why: &str) -> Result<(), ApiError> {
        if self.backend() == Backend::Rustfs && ak == self.inner.config.admin_access_key {
            return Err(ApiError::new(400, "InvalidArgument", why));
        }
        Ok(())
    }

    fn arg(&self, name: &str) -> String {
        query_value(&self.query, name).unwrap_or_default()
    }

    fn required(&self, name: &str) -> Result<String, ApiError> {
        let v = self.arg(name);
        if v.is_empty() {
            return Err(self.backend().invalid_argument(format!(
                "Invalid arguments specified: '{name}' is required."
            )));
        }
        Ok(v)
    }

    /// The request body as JSON: madmin-decrypted on `/minio/admin`.
    async fn body_json<T: serde::de::DeserializeOwned>(
        &self,
        body: bytes::Bytes,
    ) -> Result<T, ApiError> {
        let plain = match self.flavour {
            Flavour::Rustfs => body.to_vec(),
            Flavour::Minio => {
                // Argon2id takes 64 MiB: bounded, off the async workers.
                madmin::decrypt_bounded(self.secret.clone(), body)
                    .await
                    .map_err(|e| match e {
                        madmin::MadminError::Kdf(m) => ApiError::internal(m),
                        other => self
                            .backend()
                            .bad_body(&format!("failed to decrypt MinIO admin payload: {other}")),
                    })?
            }
        };
        serde_json::from_slice(&plain).map_err(|e| self.backend().bad_body(&e.to_string()))
    }

    /// A JSON answer, madmin-encrypted on `/minio/admin` for the calls whose
    /// answers madmin decrypts.
    async fn encrypted_json(&self, v: &Value) -> Result<Response, ApiError> {
        let plain = serde_json::to_vec(v).map_err(ApiError::internal)?;
        match self.flavour {
            Flavour::Rustfs => Ok(json_response(200, plain)),
            Flavour::Minio => {
                let ct = madmin::encrypt_bounded(self.secret.clone(), plain)
                    .await
                    .map_err(ApiError::internal)?;
                let mut r = json_response(200, ct);
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                );
                Ok(r)
            }
        }
    }

    async fn add_user(&self, body: bytes::Bytes) -> Result<Response, ApiError> {
        let ak = self.required("accessKey")?;
        let backend = self.backend();
        backend.check_user_access_key(&ak)?;
        if ak == self.inner.config.admin_access_key {
            return Err(backend.root_user_refused());
        }
        let req: AddUserReq = self.body_json(body).await?;
        backend.check_user_secret_key(&req.secret_key)?;
        let status = match (backend, req.status.as_deref()) {
            (_, Some("enabled")) => "enabled",
            (_, Some("disabled")) => "disabled",
            (Backend::Minio, None | Some("")) => "enabled",
            // RustFS reads `status` as its AccountStatus enum.
            (Backend::Rustfs, other) => {
                return Err(backend.bad_body(&match other {
                    None => "missing field `status`".to_string(),
                    Some(v) => format!("unknown variant `{v}`, expected `enabled` or `disabled`"),
                }))
            }
            (Backend::Minio, Some(other)) => {
                return Err(backend.invalid_argument(format!("Invalid status '{other}'")))
            }
        };
        let st = &self.inner.state;
        let _g = st.lock();
        // MinIO's add-user on an existing user replaces its secret and status
        // and keeps its policies: the rotation a retried grant causes.
        let policies = st.user(&ak)?.map(|u| u.policies).unwrap_or_default();
        st.put_user(
            &ak,
            &UserRec {
                secret_key: req.secret_key,
                status: status.into(),
                policies,
                updated_at: now_rfc3339(),
            },
        )?;
        st.flush()?;
        Ok(ok_empty())
    }

    fn remove_user(&self) -> Result<Response, ApiError> {
        let ak = self.required("accessKey")?;
        self.refuse_own_user(&ak, "cannot remove the current user")?;
        let st = &self.inner.state;
        let _g = st.lock();
        if !st.remove_user(&ak)? {
            return Err(self.backend().no_such_user(&ak, Site::Remove));
        }
        st.flush()?;
        Ok(ok_empty())
    }

    fn user_info(&self) -> Result<Response, ApiError> {
        let ak = self.required("accessKey")?;
        let u = self
            .inner
            .state
            .user(&ak)?
            .ok_or_else(|| self.backend().no_such_user(&ak, Site::Info))?;
        Ok(json_response(
            200,
            user_info_json(&u).to_string().into_bytes(),
        ))
    }

    async fn list_users(&self) -> Result<Response, ApiError> {
        let users: BTreeMap<String, Value> = self
            .inner
            .state
            .users()?
            .iter()
            .map(|(k, u)| (k.clone(), user_info_json(u)))
            .collect();
        self.encrypted_json(&json!(users)).await
    }

    fn set_user_status(&self) -> Result<Response, ApiError> {
        let ak = self.required("accessKey")?;
        self.refuse_own_user(&ak, "cannot change the status of the current user")?;
        let status = self.arg("status");
        if status != "enabled" && status != "disabled" {
            return Err(self.backend().invalid_argument(match self.backend() {
                Backend::Minio => format!("Invalid status '{status}'"),
                Backend::Rustfs => format!("invalid account status: {status}"),
            }));
        }
        let st = &self.inner.state;
        let _g = st.lock();
        let mut u = st
            .user(&ak)?
            .ok_or_else(|| self.backend().no_such_user(&ak, Site::SetStatus))?;
        u.status = status;
        u.updated_at = now_rfc3339();
        st.put_user(&ak, &u)?;
        st.flush()?;
        Ok(ok_empty())
    }

    fn list_policies(&self) -> Result<Response, ApiError> {
        let ps: BTreeMap<String, Value> = self
            .inner
            .state
            .policies()?
            .into_iter()
            .map(|(n, p)| (n, p.document))
            .collect();
        Ok(json_response(200, json!(ps).to_string().into_bytes()))
    }

    fn info_policy(&self) -> Result<Response, ApiError> {
        let name = self.required("name")?;
        let p = self
            .inner
            .state
            .policy(&name)?
            .ok_or_else(|| self.backend().no_such_policy())?;
        let body = if self.arg("v") == "2" {
            json!({"PolicyName": name, "Policy": p.document, "CreateDate": p.created_at, "UpdateDate": p.updated_at})
        } else {
            p.document
        };
        Ok(json_response(200, body.to_string().into_bytes()))
    }

    fn add_policy(&self, body: &[u8]) -> Result<Response, ApiError> {
        let name = self.required("name")?;
        // RustFS's handler has no such check (`policies.rs` AddCannedPolicy).
        if name.contains(',') && self.backend() == Backend::Minio {
            return Err(ApiError::admin_invalid_argument(
                "Policy name may not contain comma",
            ));
        }
        if body.len() > 20 * 1024 {
            return Err(ApiError::new(
                400,
                "EntityTooLarge",
                "Your proposed upload exceeds the maximum allowed object size.",
            ));
        }
        let (_, document) = Policy::parse(body).map_err(|m| self.backend().malformed_policy(m))?;
        let st = &self.inner.state;
        let _g = st.lock();
        let now = now_rfc3339();
        let created_at = st
            .policy(&name)?
            .map(|p| p.created_at)
            .unwrap_or_else(|| now.clone());
        // Replaces the whole document, exactly as MinIO does.
        st.put_policy(
            &name,
            &PolicyRec {
                document,
                builtin: false,
                created_at,
                updated_at: now,
            },
        )?;
        st.flush()?;
        Ok(ok_empty())
    }

    fn remove_policy(&self) -> Result<Response, ApiError> {
        let name = self.required("name")?;
        let st = &self.inner.state;
        let _g = st.lock();
        let backend = self.backend();
        let Some(rec) = st.policy(&name)? else {
            return match backend.missing_policy_removal() {
                Some(e) => Err(e),
                None => Ok(ok_empty()),
            };
        };
        if rec.builtin {
            if let Some(e) = backend.builtin_removal() {
                return Err(e);
            }
        }
        // Both servers refuse while a user still has it (see `Backend::policy_in_use`).
        if st.users()?.iter().any(|(_, u)| u.policies.contains(&name)) {
            return Err(backend.policy_in_use());
        }
        st.remove_policy(&name)?;
        st.flush()?;
        Ok(ok_empty())
    }

    fn check_policies_exist(&self, names: &[String]) -> Result<(), ApiError> {
        for n in names {
            if self.inner.state.policy(n)?.is_none() {
                return Err(self.backend().no_such_policy());
            }
        }
        Ok(())
    }

    fn set_policy(&self) -> Result<Response, ApiError> {
        let target = self.required("userOrGroup")?;
        if self.arg("isGroup") == "true" {
            return Err(groups_not_supported());
        }
        let mut names: Vec<String> = self
            .arg("policyName")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        names.dedup();
        let st = &self.inner.state;
        let _g = st.lock();
        // MinIO looks the policies up first, RustFS the user.
        if self.backend() == Backend::Minio {
            self.check_policies_exist(&names)?;
        }
        let mut u = st
            .user(&target)?
            .ok_or_else(|| self.backend().no_such_user(&target, Site::Mapping))?;
        if self.backend() == Backend::Rustfs {
            self.check_policies_exist(&names)?;
        }
        u.policies = names;
        u.updated_at = now_rfc3339();
        st.put_user(&target, &u)?;
        st.flush()?;
        Ok(ok_empty())
    }

    async fn attach_detach(&self, body: bytes::Bytes, attach: bool) -> Result<Response, ApiError> {
        let req: AssocReq = self.body_json(body).await?;
        if !req.group.is_empty() {
            return Err(groups_not_supported());
        }
        if req.user.is_empty()
            || req.policies.is_empty()
            || req.policies.iter().any(String::is_empty)
        {
            return Err(self.backend().invalid_argument(
                "Invalid arguments specified: 'policies' and 'user' are required.",
            ));
        }
        let changed = {
            let st = &self.inner.state;
            let _g = st.lock();
            if attach {
                self.check_policies_exist(&req.policies)?;
            }
            let mut u = st
                .user(&req.user)?
                .ok_or_else(|| self.backend().no_such_user(&req.user, Site::Mapping))?;
            let mut changed = Vec::new();
            for p in &req.policies {
                let present = u.policies.contains(p);
                if attach && !present {
                    u.policies.push(p.clone());
                    changed.push(p.clone());
                } else if !attach && present {
                    u.policies.retain(|x| x != p);
                    changed.push(p.clone());
                }
            }
            if changed.is_empty() {
                if let Some(e) = self.backend().change_already_applied() {
                    return Err(e);
                }
            } else {
                u.updated_at = now_rfc3339();
                st.put_user(&req.user, &u)?;
                st.flush()?;
            }
            changed
        };
        let field = if attach {
            "policiesAttached"
        } else {
            "policiesDetached"
        };
        // An empty list is left out (RustFS's answer to a change already in effect).
        let mut answer = serde_json::Map::new();
        if !changed.is_empty() {
            answer.insert(field.into(), json!(changed));
        }
        answer.insert("updatedAt".into(), json!(now_rfc3339()));
        self.encrypted_json(&Value::Object(answer)).await
    }

    fn info(&self) -> Result<Response, ApiError> {
        let st = &self.inner.state;
        let buckets = st.buckets()?;
        let mut objects = 0usize;
        for (b, _) in &buckets {
            objects += st.objects(b)?.len();
        }
        let body = json!({
            "mode": "online",
            "region": self.inner.config.reported_region(),
            "deploymentID": "drivelab",
            "buckets": {"count": buckets.len()},
            "objects": {"count": objects},
            "servers": [{"state": "online", "endpoint": "drivelab", "version": "drivelab"}],
        });
        Ok(json_response(200, body.to_string().into_bytes()))
    }
}
