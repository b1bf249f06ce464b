# drivelab — the two promises: `make e2e` runs the reference drivers through
# every scenario; `make test` runs every test. Both work on a fresh machine
# with a Rust toolchain and python3 (the Python client tests install their own).

CARGO ?= cargo
PYTHON ?= python3
REPORT_DIR ?= reports/e2e

# fuzz-smoke: FUZZ_SECONDS of libFuzzer per target (not part of `make test`:
# 5 targets x 60 s plus the fuzz build is over its budget; the committed corpus
# and regressions are replayed by `make test` through fuzz_replay tests).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= scenario s3_http admin_http madmin kube_http director_http cpi_json

.PHONY: fuzz-smoke e2e test test-rust test-containers image py-deps browser-deps faketime-deps build validate mutants sweep clean-reports bench bench-check bench-explore bench-scale bench-grants

# One feature set for every build: `cargo build --bins` of the root package
# alone resolves features apart from `cargo test --workspace` (dev-dependencies
# unify into the latter), so running through `cargo run` after the tests rebuilt
# ~40 crates (~3 min of CI). `make test` adds --tests so its build is the test
# build; every target below runs the binary it built, never `cargo run`.
BUILD_SCOPE ?= --workspace
DRIVELAB := target/debug/drivelab
build:
	$(CARGO) build --locked $(BUILD_SCOPE) --bins

# Regenerates the committed golden report (reports/e2e): stale files go first.
e2e: build
	rm -rf $(REPORT_DIR)
	$(DRIVELAB) run scenarios/ --report-dir $(REPORT_DIR)
	rm -rf $(SPAWNED_REPORT_DIR)
	$(DRIVELAB) run scenarios/cosi/ --report-dir $(SPAWNED_REPORT_DIR) \
	  --driver '{command: [target/debug/cosi-s3, --endpoint, "{endpoint}"]}'

# The same suite against the reference driver as a spawned binary (it finds the
# fake Kubernetes API through the KUBECONFIG the lab sets). Not committed.
SPAWNED_REPORT_DIR ?= reports/spawned

# Every seeded bug in the reference driver must be killed by some scenario;
# then the single-fault sweep on the lifecycle bases: the correct drivers pass
# every single fault, and the sweep finds each order-of-commit mutant by itself.
SWEEP_FOUND_DIR ?= target/sweep-found
SWEEP_MUTANTS ?= bucket-before-checkpoint policy-after-forget
# The CSI base has 508 single faults (~5 min in a debug build): make mutants
# takes the first 200 in call order; `CSI_SWEEP_BUDGET=600 make mutants` for all.
CSI_SWEEP_BUDGET ?= 200
mutants: build
	$(DRIVELAB) mutate scenarios/
	$(DRIVELAB) sweep-faults scenarios/explore/cosi-lifecycle.yaml --out-dir $(SWEEP_FOUND_DIR)
	$(DRIVELAB) sweep-faults scenarios/explore/csi-lifecycle.yaml --budget $(CSI_SWEEP_BUDGET) --out-dir $(SWEEP_FOUND_DIR)
	for m in $(SWEEP_MUTANTS); do \
	  $(DRIVELAB) sweep-faults scenarios/explore/cosi-lifecycle.yaml \
	    --mutant $$m --stop-at-first --expect-found --out-dir $(SWEEP_FOUND_DIR) || exit 1; \
	done

# The correct driver under 200 seeds (interleavings, fault placements).
SEEDS ?= 200
sweep: build
	$(DRIVELAB) run --seeds $(SEEDS) scenarios/

validate: build
	$(DRIVELAB) validate scenarios/

# Client tests use boto3 and minio-py against the fakes; install them first.
py-deps:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt

# The report's HTML is checked in headless Chromium (Debian's package).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "chromium is missing: sudo apt-get install chromium (or DRIVELAB_SKIP_BROWSER=1)"; fi; }

# CI time: `make test` sweeps the first 60 faults of the CSI base (about 30 s);
# `make mutants` alone takes 200, `CSI_SWEEP_BUDGET=600 make mutants` all of them.
test: CSI_SWEEP_BUDGET = 60
test: BUILD_SCOPE = --workspace --tests
test: py-deps browser-deps faketime-deps test-rust mutants test-containers

# External CSI drivers' wall clocks follow the lab's virtual clock through
# libfaketime (Debian's faketime); without it a token lifetime the lab lets
# pass does not pass for a spawned driver.
faketime-deps:
	@[ -n "$$(ls /usr/lib/*/faketime/libfaketimeMT.so.1 /usr/lib/faketime/libfaketimeMT.so.1 2>/dev/null)" ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime; \
	  else echo "libfaketime is missing: sudo apt-get install faketime"; fi; }

# image: drivers and the lab in a container. Needs a Docker engine (builds its
# FROM scratch images locally, pulls nothing); says SKIPPED plainly without one.
# --workspace: the features test-rust built with (without it the root package's
# dev-dependency features alone rebuilt ~40 crates: 2m46s of CI).
test-containers:
	$(CARGO) test --locked --workspace --test external -- --ignored --nocapture container

# drivelab:dev and drivelab-cosi-s3:dev, FROM scratch: the debug binary and the shared objects it loads.
image:
	scripts/build-image.sh

test-rust:
	$(CARGO) test --locked --workspace --no-fail-fast

clean-reports:
	rm -rf reports/e2e

# Benchmarks (release build; see docs/bench.md). `bench` prints the table and
# writes reports/bench.json; `bench-check` re-measures ratios only (never
# absolute times) against the committed reports/bench.json.
BENCH := target/release/drivelab-bench
bench:
	$(CARGO) build --locked --release -p drivelab-bench
	$(BENCH) --out reports/bench.json
	$(BENCH) scale --out reports/bench.json
	$(BENCH) grants --out reports/bench.json

# The dynamic-disks RFC's scale question at full size (bench/scale/: 100 and
# 1000 nodes, workers 1/4/16): wall time, peak RSS and the pool's figures,
# merged into reports/bench.json (also the last part of `make bench`).
bench-scale:
	$(CARGO) build --locked --release -p drivelab-bench
	$(BENCH) scale --out reports/bench.json

# Issue 20's 10⁵-grant target at its own size (one claim + 10⁵ grants): wall
# time and peak RSS, the child killed past half the machine's memory or 20
# minutes; merged into reports/bench.json (also the last part of `make bench`).
bench-grants:
	$(CARGO) build --locked --release -p drivelab-bench
	$(BENCH) grants --out reports/bench.json

# Explorer figures (issue 6): schedules/min and median time to first detection per mutant.
# (also part of `make bench`; this target re-measures them alone and merges
# them into reports/bench.json).
bench-explore:
	$(CARGO) build --locked --release -p drivelab-bench
	$(BENCH) explore --out reports/bench.json

bench-check:
	$(CARGO) build --locked --release -p drivelab-bench
	$(BENCH) check --against reports/bench.json

# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets stable rustc take them.
# New inputs go to fuzz/corpus-work (ignored); fuzz/corpus is the committed seed set.
fuzz-smoke:
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz
	cd fuzz && for t in $(FUZZ_TARGETS); do \
	  mkdir -p corpus-work/$$t && \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run -s none -O $$t corpus-work/$$t corpus/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 || exit 1; \
	done
