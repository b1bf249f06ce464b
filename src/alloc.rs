//! The binaries' allocator. A lab run is millions of small, short-lived
//! allocations (JSON values, headers, history events) on a few threads;
//! glibc's malloc and free were a fifth of the fakes' CPU (docs/bench.md).

/// mimalloc (v2): declare it as `#[global_allocator]` in a binary. v2, not
/// v3: v3 commits its arenas eagerly (the option that turns it off is read
/// before `main` runs), and a 2,000-grant run then peaked 15% higher. v2
/// peaks as glibc does there; the 1000-node fleet peaks 13% higher than on
/// glibc, and runs a fifth faster.
pub type Allocator = mimalloc::MiMalloc;
