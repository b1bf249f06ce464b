//! Fake S3 data plane and MinIO/RustFS admin API (in progress).
