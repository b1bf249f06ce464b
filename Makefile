# drivelab — the two promises: `make e2e` runs the reference drivers through
# every scenario; `make test` runs every test. Both work on a fresh machine
# with a Rust toolchain and python3 (the Python client tests install their own).

CARGO ?= cargo
PYTHON ?= python3
REPORT_DIR ?= reports/e2e

.PHONY: e2e test test-rust py-deps build validate mutants sweep clean-reports

build:
	$(CARGO) build --locked --bins

e2e: build
	$(CARGO) run --locked --quiet -- run scenarios/ --report-dir $(REPORT_DIR)

# Every seeded bug in the reference driver must be killed by some scenario.
mutants: build
	$(CARGO) run --locked --quiet -- mutate scenarios/

# The correct driver under 200 seeds (interleavings, fault placements).
SEEDS ?= 200
sweep: build
	$(CARGO) run --locked --quiet -- run --seeds $(SEEDS) scenarios/

validate: build
	$(CARGO) run --locked --quiet -- validate scenarios/

# Client tests use boto3 and minio-py against the fakes; install them first.
py-deps:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt

test: py-deps test-rust mutants

test-rust:
	$(CARGO) test --locked --workspace --no-fail-fast

clean-reports:
	rm -rf reports/e2e
