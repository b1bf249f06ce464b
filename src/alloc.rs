//! The binaries' allocator. A lab run is millions of small, short-lived
//! allocations (JSON values, headers, history events) on a few threads;
//! glibc's malloc and free were a fifth of the fakes' CPU (docs/bench.md).

/// mimalloc (v2): declare it as `#[global_allocator]` in a binary. v2, not
/// v3: v3 commits its arenas eagerly (the option that turns it off is read
/// before `main` runs), and a 2,000-grant run then peaked 15% higher. v2
/// peaks as glibc does there; the 1000-node fleet peaks 13% higher than on
/// glibc, and runs a fifth faster.
pub type Allocator = mimalloc::MiMalloc;

/// Have this thread's mimalloc heap collect what other threads freed of its
/// memory and give free pages back to the OS now. mimalloc returns a page
/// only once the thread that allocated it has taken back every block other
/// threads freed, which an idle thread never does: memory a run's fakes
/// built on the runtime's worker and the lab freed stayed resident. Costs
/// a walk of this thread's heap; a no-op under another allocator.
pub fn collect() {
    // The mimalloc crate does not expose it; the C library it builds and
    // links (libmimalloc-sys) defines it.
    extern "C" {
        fn mi_collect(force: bool);
    }
    // SAFETY: mi_collect takes no pointers; it is safe on any thread at any time.
    unsafe { mi_collect(true) }
}
