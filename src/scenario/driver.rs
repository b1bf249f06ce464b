//! The `driver:` declaration: which driver a scenario drives and how the lab
//! starts it — linked in (`builtin:`), as a spawned program (`command:`) or as a
//! container image (`image:`) — plus the placeholders the lab fills in for it.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Mutant;
use serde::Deserialize;

/// Which driver the scenario drives, and how it is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverSpec {
    /// How the lab starts it.
    pub launch: DriverLaunch,
    /// Seeded bugs to switch on (builtin drivers only; the lab must catch them).
    pub mutants: Vec<Mutant>,
    /// `policy_layout:` — a correct design variant of the builtin cosi-s3
    /// (not a bug); `None` is the reference design.
    pub policy_layout: Option<cosi_s3::PolicyLayout>,
    /// Real time the lab waits for the socket to answer DriverGetInfo (and, for
    /// external drivers, the deadline of that first call).
    pub start_timeout: Duration,
    /// Deadline of every sidecar→driver call after start-up (real time: the
    /// driver is a real process); a call past it is cut as DEADLINE_EXCEEDED
    /// and retried with back-off, as the real sidecar's `--timeout` does.
    pub call_timeout: Duration,
    /// Set when `--driver` replaced the file's declaration: every replay line
    /// then repeats the driver, so a replay never falls back to the file's.
    pub from_flag: bool,
}

impl Default for DriverSpec {
    fn default() -> Self {
        DriverSpec {
            launch: DriverLaunch::Builtin(BuiltinDriver::CosiS3),
            mutants: Vec::new(),
            policy_layout: None,
            start_timeout: DEFAULT_START_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            from_flag: false,
        }
    }
}

/// How long the lab waits for a driver's socket unless `start_timeout:` says otherwise.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(20);

/// The sidecar's per-call deadline unless `call_timeout:` says otherwise: the
/// external-provisioner's `--timeout` default (10 s, cmd/csi-provisioner).
pub const DEFAULT_CALL_TIMEOUT: Duration = drivelab_fakes::cosi_sidecar::DEFAULT_CALL_TIMEOUT;

impl DriverSpec {
    /// The linked-in driver, if this is one.
    pub fn builtin(&self) -> Option<BuiltinDriver> {
        match &self.launch {
            DriverLaunch::Builtin(b) => Some(*b),
            _ => None,
        }
    }

    /// Whether this is a reference driver in its reference design: the only
    /// driver an expectation marked `reference_design: true` is judged on
    /// (any other — a design variant, a program, an image — may be correct
    /// and still be shaped differently).
    pub fn is_reference_design(&self) -> bool {
        matches!(self.launch, DriverLaunch::Builtin(_))
            && self
                .policy_layout
                .is_none_or(|l| l == cosi_s3::PolicyLayout::default())
    }

    /// The protocol the driver speaks on its socket.
    pub fn protocol(&self) -> DriverProtocol {
        match &self.launch {
            DriverLaunch::Builtin(BuiltinDriver::CosiS3) => DriverProtocol::Cosi,
            DriverLaunch::Builtin(BuiltinDriver::BoshCsi | BuiltinDriver::HostpathCsi) => {
                DriverProtocol::Csi
            }
            DriverLaunch::Command(e) | DriverLaunch::Image(e) => e.protocol,
        }
    }

    /// What a replay line must add to say which driver ran: `--driver '…'`
    /// (the declaration as a flow mapping, placeholders intact) when the
    /// driver came from the command line, nothing when the file declares it.
    pub fn replay_flag(&self) -> String {
        if !self.from_flag {
            return String::new();
        }
        format!(
            " --driver '{}'",
            super::write::driver_yaml(self).replace('\'', "'\\''")
        )
    }

    /// One line for consoles and errors (`builtin cosi-s3`, `command /x/y`, `image n:t`).
    pub fn describe(&self) -> String {
        match &self.launch {
            DriverLaunch::Builtin(b) => match self.policy_layout {
                Some(l) => format!("builtin {} (policy_layout {})", b.name(), l.name()),
                None => format!("builtin {}", b.name()),
            },
            DriverLaunch::Command(e) => {
                format!("command {}", e.program.first().cloned().unwrap_or_default())
            }
            DriverLaunch::Image(e) => {
                format!("image {}", e.program.first().cloned().unwrap_or_default())
            }
        }
    }
}

/// How the driver is started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverLaunch {
    /// A reference driver linked into drivelab (runs in-process on its own runtime).
    Builtin(BuiltinDriver),
    /// A program the lab spawns: `program` is `[path, args…]`.
    Command(ExternalDriver),
    /// A container image the lab starts: `program` is `[NAME[:TAG], args…]`
    /// (args become the container's command).
    Image(ExternalDriver),
}

/// A driver the lab does not link: its command line, environment and protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalDriver {
    /// `command:` (path first) or `image:` followed by `args:`; may hold placeholders.
    pub program: Vec<String>,
    /// Extra environment (placeholders allowed), applied over what the lab sets.
    pub env: BTreeMap<String, String>,
    /// What it speaks on its socket.
    pub protocol: DriverProtocol,
}

/// Reference drivers built into the binary.
#[derive(Copy, Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum BuiltinDriver {
    /// The reference COSI driver for S3 admin APIs.
    CosiS3,
    /// The reference CSI driver for BOSH dynamic disks.
    BoshCsi,
    /// The reference CSI driver with its own backend (directories on the host).
    HostpathCsi,
}

impl BuiltinDriver {
    /// As written in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            BuiltinDriver::CosiS3 => "cosi-s3",
            BuiltinDriver::BoshCsi => "bosh-csi",
            BuiltinDriver::HostpathCsi => "hostpath-csi",
        }
    }
}

/// The gRPC API a driver serves on its Unix socket.
#[derive(Copy, Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum DriverProtocol {
    /// COSI v1alpha1 (Identity + Provisioner); the fake provisioner sidecar drives it.
    #[default]
    Cosi,
    /// CSI (Identity + Controller + Node); driven by the BOSH/CSI slice.
    Csi,
}

impl DriverProtocol {
    /// As written in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            DriverProtocol::Cosi => "cosi",
            DriverProtocol::Csi => "csi",
        }
    }
}

/// Placeholders every external driver gets, whatever it speaks.
const COMMON_PLACEHOLDERS: &[(&str, &str)] = &[
    ("socket", "path of the Unix socket the driver must serve on"),
    ("endpoint", "the socket as a URL: unix://{socket}"),
    (
        "socket_dir",
        "directory of the socket (COSI: also holds the kubeconfig)",
    ),
];

/// Placeholders of a COSI driver, with what each becomes. For `image:`
/// drivers paths are the ones inside the container.
pub const COSI_PLACEHOLDERS: &[(&str, &str)] = &[
    ("kube_url", "Kubernetes API base URL, https://127.0.0.1:PORT"),
    (
        "kube_ca_file",
        "path of the CA certificate (PEM) the Kubernetes API's certificate is signed by (socket_dir/ca.crt)",
    ),
    (
        "kubeconfig",
        "path of a kubeconfig for the fake Kubernetes API (socket_dir/kubeconfig), with the driver's token",
    ),
    (
        "kube_token",
        "bearer token of the driver's service account (redacted in every output)",
    ),
    (
        "kube_token_file",
        "path of a file holding that token (socket_dir/token), as a pod's service-account token",
    ),
    ("s3_endpoint", "S3 base URL, http://127.0.0.1:PORT"),
    (
        "admin_url",
        "admin API base URL (the S3 server; routes under /rustfs/admin/v3/)",
    ),
    ("admin_access_key", "the admin access key id"),
    ("admin_key", "alias of {admin_access_key}"),
    (
        "admin_secret_key",
        "the admin secret key (redacted in every output)",
    ),
    (
        "admin_secret_name",
        "name of the Kubernetes Secret holding the admin keys",
    ),
    ("admin_secret_namespace", "namespace of that Secret"),
    ("region", "signing region of the S3 fake"),
    (
        "namespace",
        "namespace the driver keeps its state in (cosi-s3-system)",
    ),
];

/// Placeholders of a CSI driver. The lab starts one process per role — the
/// controller, then one per node — from the same declaration; a placeholder
/// of the other role is empty.
pub const CSI_PLACEHOLDERS: &[(&str, &str)] = &[
    ("csi_endpoint", "alias of {endpoint}"),
    ("mode", "the process's role: controller or node"),
    ("node_id", "node: this node's id (the BOSH instance id); empty for the controller"),
    ("node_name", "node: the Kubernetes node name; empty for the controller"),
    (
        "mounter_url",
        "node: the node's mount table, http://127.0.0.1:PORT; empty for the controller",
    ),
    (
        "max_volumes_per_node",
        "the attach limit the scenario deploys the plugins with (`max_volumes_per_node:`), 0 when none",
    ),
    ("director_url", "BOSH backend: the Director, http://127.0.0.1:PORT"),
    ("uaa_url", "BOSH backend: UAA (served by the Director fake)"),
    ("client_id", "BOSH backend: the UAA client id"),
    (
        "client_secret",
        "BOSH backend: the UAA client secret (redacted in every output)",
    ),
    (
        "block_api_url",
        "BOSH backend: the IaaS block API for changed-block metadata",
    ),
    (
        "block_api_credential",
        "BOSH backend: the block API's credential (redacted in every output)",
    ),
    (
        "task_timeout",
        "BOSH backend: the scenario's task_timeout, e.g. 2000ms (how long a call may wait on a Director task)",
    ),
    (
        "poll_interval",
        "BOSH backend: 2/3 of task_timeout, the interval the linked-in bosh-csi polls tasks at",
    ),
];

/// Every placeholder a driver speaking `protocol` may use.
pub fn placeholders(protocol: DriverProtocol) -> Vec<(&'static str, &'static str)> {
    let own = match protocol {
        DriverProtocol::Cosi => COSI_PLACEHOLDERS,
        DriverProtocol::Csi => CSI_PLACEHOLDERS,
    };
    COMMON_PLACEHOLDERS.iter().chain(own).copied().collect()
}

/// Every `{name}` in `s` that is not a placeholder of `protocol`.
pub fn unknown_placeholders(s: &str, protocol: DriverProtocol) -> Vec<String> {
    let known = placeholders(protocol);
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('}') else { break };
        let name = &after[..end];
        if !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !known.iter().any(|(p, _)| *p == name)
        {
            out.push(name.to_string());
        }
        rest = &after[end + 1..];
    }
    out
}

/// Replace every known `{name}` with its value from `values`.
pub fn expand(s: &str, values: &BTreeMap<&'static str, String>) -> String {
    let mut out = s.to_string();
    for (name, value) in values {
        out = out.replace(&format!("{{{name}}}"), value);
    }
    out
}

/// `driver:` as written (before validation).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDriver {
    #[serde(default)]
    builtin: Option<BuiltinDriver>,
    #[serde(default)]
    command: Option<Vec<String>>,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    args: Option<Vec<String>>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    protocol: Option<DriverProtocol>,
    #[serde(default)]
    start_timeout: Option<String>,
    #[serde(default)]
    call_timeout: Option<String>,
    #[serde(default)]
    mutants: Vec<Mutant>,
    #[serde(default)]
    policy_layout: Option<cosi_s3::PolicyLayout>,
}

/// A validation failure of a driver declaration: message and hint.
pub(super) type DriverError = (String, Option<&'static str>);

impl RawDriver {
    pub(super) fn resolve(self) -> Result<DriverSpec, DriverError> {
        let given = [
            self.builtin.is_some(),
            self.command.is_some(),
            self.image.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if given != 1 {
            return Err((
                "`driver` needs exactly one of `builtin`, `command` or `image`".into(),
                Some("builtin: cosi-s3 | command: [path, args…] | image: NAME[:TAG]"),
            ));
        }
        let start_timeout = match &self.start_timeout {
            None => DEFAULT_START_TIMEOUT,
            Some(s) => super::parse_duration(s)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    (
                        format!("start_timeout `{s}` is not a duration"),
                        Some("write e.g. 500ms, 30s, 2m"),
                    )
                })?,
        };
        let call_timeout = match &self.call_timeout {
            None => DEFAULT_CALL_TIMEOUT,
            Some(s) => super::parse_duration(s)
                .filter(|d| !d.is_zero() && *d <= MAX_CALL_TIMEOUT)
                .ok_or_else(|| {
                    (
                        format!("call_timeout `{s}` is not a duration between 1ms and 10m"),
                        Some("write e.g. 500ms, 10s, 2m (the real sidecar's default is 10s)"),
                    )
                })?,
        };
        let launch = if let Some(b) = self.builtin {
            if self.env.is_some() || self.args.is_some() || self.protocol.is_some() {
                return Err((
                    "`env`, `args` and `protocol` apply to `command` and `image` drivers, not `builtin`".into(),
                    None,
                ));
            }
            if let Some(m) = self.mutants.iter().find(|m| m.driver() != b) {
                return Err((
                    format!(
                        "mutant `{m}` is a bug of {}, but this scenario drives {}",
                        m.driver().name(),
                        b.name()
                    ),
                    Some("`drivelab list mutants` shows each driver's mutants"),
                ));
            }
            if self.policy_layout.is_some() && b != BuiltinDriver::CosiS3 {
                return Err((
                    format!("`policy_layout` is a design switch of cosi-s3, not of {}", b.name()),
                    Some("policy_layout: per-grant | per-grant-with-owner-marker, with `builtin: cosi-s3`"),
                ));
            }
            DriverLaunch::Builtin(b)
        } else {
            if self.policy_layout.is_some() {
                return Err((
                    "`policy_layout` switches a design of the linked-in cosi-s3; a program or image is configured by its own flags".into(),
                    Some("pass `--policy-layout …` in `command`/`args` instead"),
                ));
            }
            if !self.mutants.is_empty() {
                return Err((
                    "`mutants` are a builtin-only feature: the seeded bugs live in the linked-in reference driver".into(),
                    Some("remove `mutants`, or use `builtin: cosi-s3`"),
                ));
            }
            let mut program = match (&self.command, &self.image) {
                (Some(cmd), _) => {
                    if self.args.is_some() {
                        return Err((
                            "`args` is for `image`; put a command's arguments in the `command` list".into(),
                            None,
                        ));
                    }
                    if cmd.first().is_none_or(|p| p.trim().is_empty()) {
                        return Err((
                            "`command` is empty".into(),
                            Some("command: [path/to/driver, --flag, \"{socket}\"]"),
                        ));
                    }
                    cmd.clone()
                }
                (None, Some(image)) => {
                    if image.trim().is_empty() || image.contains(char::is_whitespace) {
                        return Err((
                            format!("`{image}` is not an image name"),
                            Some("image: NAME[:TAG], e.g. cosi-s3:dev"),
                        ));
                    }
                    vec![image.clone()]
                }
                (None, None) => unreachable!("one of them is given"),
            };
            program.extend(self.args.clone().unwrap_or_default());
            let env = self.env.clone().unwrap_or_default();
            for k in env.keys() {
                if k.is_empty() || k.contains('=') || k.contains('\0') {
                    return Err((format!("`{k}` is not an environment variable name"), None));
                }
            }
            let protocol = self.protocol.unwrap_or_default();
            for v in program.iter().chain(env.values()) {
                if let Some(p) = unknown_placeholders(v, protocol).first() {
                    let names: Vec<String> = placeholders(protocol)
                        .iter()
                        .map(|(n, _)| format!("{{{n}}}"))
                        .collect();
                    let other = match protocol {
                        DriverProtocol::Cosi => DriverProtocol::Csi,
                        DriverProtocol::Csi => DriverProtocol::Cosi,
                    };
                    let belongs = if unknown_placeholders(v, other).is_empty() {
                        format!(
                            " (`{{{p}}}` is a placeholder of {} drivers: set `protocol: {}`)",
                            other.name(),
                            other.name()
                        )
                    } else {
                        String::new()
                    };
                    return Err((
                        format!(
                            "unknown placeholder `{{{p}}}` in `{v}` for a {} driver{belongs}; known: {}",
                            protocol.name(),
                            names.join(" ")
                        ),
                        Some("`drivelab list placeholders` describes each"),
                    ));
                }
            }
            let ext = ExternalDriver {
                program,
                env,
                protocol,
            };
            if self.command.is_some() {
                DriverLaunch::Command(ext)
            } else {
                DriverLaunch::Image(ext)
            }
        };
        Ok(DriverSpec {
            launch,
            mutants: self.mutants,
            policy_layout: self.policy_layout,
            start_timeout,
            call_timeout,
            from_flag: false,
        })
    }
}

/// Longer deadlines only make a hung driver cost more real time.
const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Parse `--driver` (the same YAML as a scenario's `driver:` value, e.g.
/// `'command: [target/debug/cosi-s3, --endpoint, "unix://{socket}"]'` or `builtin: cosi-s3`).
pub fn parse_cli(text: &str) -> Result<DriverSpec, String> {
    let raw: RawDriver = super::from_yaml(text).map_err(|e| {
        format!(
            "--driver: {}",
            super::first_line(&e.without_snippet().to_string())
        )
    })?;
    let mut spec = raw.resolve().map_err(|(m, hint)| match hint {
        Some(h) => format!("--driver: {m} (hint: {h})"),
        None => format!("--driver: {m}"),
    })?;
    spec.from_flag = true;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_declarations() {
        let d = parse_cli("builtin: cosi-s3").unwrap();
        assert_eq!(d.builtin(), Some(BuiltinDriver::CosiS3));
        assert!(d.is_reference_design());
        let d =
            parse_cli("{builtin: cosi-s3, policy_layout: per-grant-with-owner-marker}").unwrap();
        assert_eq!(
            d.policy_layout,
            Some(cosi_s3::PolicyLayout::PerGrantWithOwnerMarker)
        );
        assert!(!d.is_reference_design());
        assert!(parse_cli("{builtin: cosi-s3, policy_layout: per-grant}")
            .unwrap()
            .is_reference_design());
        let d = parse_cli(
            r#"{command: [/bin/drv, --endpoint, "unix://{socket}"], env: {K: "{kube_url}"}, start_timeout: 3s}"#,
        )
        .unwrap();
        match &d.launch {
            DriverLaunch::Command(e) => {
                assert_eq!(e.program, ["/bin/drv", "--endpoint", "unix://{socket}"]);
                assert_eq!(e.env["K"], "{kube_url}");
                assert_eq!(e.protocol, DriverProtocol::Cosi);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(d.start_timeout, Duration::from_secs(3));
        assert_eq!(d.call_timeout, DEFAULT_CALL_TIMEOUT);
        let d = parse_cli("{command: [/bin/drv], call_timeout: 750ms}").unwrap();
        assert_eq!(d.call_timeout, Duration::from_millis(750));
        let d = parse_cli("{image: 'cosi-s3:dev', args: ['--endpoint', '{endpoint}']}").unwrap();
        assert!(
            matches!(&d.launch, DriverLaunch::Image(e) if e.program == ["cosi-s3:dev", "--endpoint", "{endpoint}"])
        );
    }

    #[test]
    fn bad_declarations_are_named() {
        for (text, needle) in [
            ("{}", "exactly one"),
            ("{builtin: cosi-s3, command: [x]}", "exactly one"),
            ("{command: []}", "empty"),
            ("{command: [x, '{sokcet}']}", "sokcet"),
            ("{command: [x], env: {A: '{nope}'}}", "nope"),
            ("{command: [x], mutants: [rotate-on-retry]}", "builtin-only"),
            ("{builtin: cosi-s3, env: {A: b}}", "not `builtin`"),
            (
                "{builtin: bosh-csi, policy_layout: per-grant}",
                "design switch of cosi-s3",
            ),
            ("{command: [x], policy_layout: per-grant}", "own flags"),
            ("{builtin: cosi-s3, policy_layout: two}", "unknown variant"),
            ("{command: [x], args: [y]}", "`args` is for `image`"),
            ("{image: 'a b'}", "not an image name"),
            ("{command: [x], start_timeout: soon}", "not a duration"),
            ("{command: [x], call_timeout: 0s}", "call_timeout `0s`"),
            ("{command: [x], call_timeout: 1h}", "between 1ms and 10m"),
            ("{builtin: nfs}", "unknown variant"),
            ("{command: [x], colour: red}", "unknown field"),
        ] {
            let e = parse_cli(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn placeholders_expand_and_unknown_ones_are_found() {
        let mut v = BTreeMap::new();
        v.insert("socket", "/s/cosi.sock".to_string());
        v.insert("kube_url", "http://127.0.0.1:1".to_string());
        assert_eq!(
            expand("unix://{socket} {kube_url} {other} {", &v),
            "unix:///s/cosi.sock http://127.0.0.1:1 {other} {"
        );
        assert_eq!(
            unknown_placeholders("{socket}{bad_one} {X} {}", DriverProtocol::Cosi),
            ["bad_one"]
        );
        assert!(unknown_placeholders("json {\"a\": 1}", DriverProtocol::Cosi).is_empty());
        // Each protocol has its own: a CSI driver has no S3 endpoint.
        assert_eq!(
            unknown_placeholders("{node_id} {s3_endpoint}", DriverProtocol::Csi),
            ["s3_endpoint"]
        );
        assert_eq!(
            unknown_placeholders("{node_id} {s3_endpoint}", DriverProtocol::Cosi),
            ["node_id"]
        );
    }
}
