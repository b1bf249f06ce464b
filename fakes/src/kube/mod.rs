//! Fake Kubernetes API subset (in progress).
