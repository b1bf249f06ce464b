#!/usr/bin/env bash
# Explorer figures for issue 6 (schedules/min against the correct driver,
# median time to first detection of each COSI mutant over 10 explorer seeds):
# now measured by the bench binary (bench/src/explore.rs), also part of
# `make bench`. This wrapper is kept for old instructions; args pass through
# (e.g. --total-s 120 --per-run-s 10 --out reports/bench.json).
set -euo pipefail
cargo build --locked --release -p drivelab-bench
exec target/release/drivelab-bench explore "$@"
