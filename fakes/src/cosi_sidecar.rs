//! Fake COSI provisioner sidecar (in progress).
