# Reads drivelab's junit.xml files with junitparser (a parser nobody here
# wrote), run by tests/report_junit.rs: every CI that reads JUnit must see the
# same suites, cases and failures the report claims, and failures carry calls.
import os

import pytest
from junitparser import Error, Failure, JUnitXml, TestSuite

FILES = [f for f in os.environ.get("JUNIT_FILES", "").split(os.pathsep) if f]
FAILING = os.environ.get("JUNIT_FAILING_FILE", "")


def suites(path):
    xml = JUnitXml.fromfile(path)
    # A <testsuites> root parses as JUnitXml; iterate its suites.
    return [s for s in xml] if not isinstance(xml, TestSuite) else [xml]


@pytest.mark.parametrize("path", FILES)
def test_parses_and_counts_agree(path):
    ss = suites(path)
    assert ss, f"{path}: no testsuite"
    for s in ss:
        cases = list(s)
        assert cases, f"{s.name}: no testcase"
        assert s.tests == len(cases), f"{s.name}: tests={s.tests} but {len(cases)} cases"
        failures = sum(1 for c in cases for r in c.result if isinstance(r, Failure))
        errors = sum(1 for c in cases for r in c.result if isinstance(r, Error))
        assert s.failures == failures and s.errors == errors, s.name
        names = [c.name for c in cases]
        assert "expectations" in names or errors, f"{s.name}: no expectations case"
        for c in cases:
            assert c.classname == f"drivelab.{s.name}", c.classname


def test_failures_carry_the_violating_calls():
    assert FAILING, "JUNIT_FAILING_FILE not set"
    failed = [(s.name, c.name, r) for s in suites(FAILING) for c in s for r in c.result if isinstance(r, Failure)]
    assert failed, "the mutant run's junit.xml has no failure"
    names = {c for _, c, _ in failed}
    assert "idempotent-replay" in names, names
    for _, case, r in failed:
        if case == "idempotent-replay":
            assert "violating calls" in r.text and "DriverGrantBucketAccess" in r.text, r.text
            assert "<secret-A>" in r.text and "<secret-B>" in r.text, "snapshot diff with rotation labels missing"
            assert r.message
