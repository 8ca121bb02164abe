"""The recorded fixtures in ``tests/fixtures`` are intact, and the suite's own readers read them right."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from dump import diff, dump
from recorded import FIXTURES, VERSIONS, copy_reference, reference_dump


def test_every_fixture_file_matches_its_recorded_checksum() -> None:
    listed = {}
    for line in (FIXTURES / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name] = digest
    present = {
        str(path.relative_to(FIXTURES))
        for path in FIXTURES.rglob("*")
        if path.is_file() and path.name not in ("SHA256SUMS", "RECORDING.md")
    }
    assert present == set(listed)
    changed = [name for name, digest in listed.items() if _sha256(FIXTURES / name) != digest]
    assert changed == []


@pytest.mark.parametrize("version", VERSIONS)
def test_the_dumper_reads_each_reference_database_exactly_as_recorded(version: int, tmp_path: Path) -> None:
    assert diff(reference_dump(version), dump(copy_reference(tmp_path, version))) == []


def test_the_dumper_sees_a_changed_value_a_reordering_and_a_type_change(tmp_path: Path) -> None:
    recorded = reference_dump(6)
    actual = dump(copy_reference(tmp_path, 6))
    actual["tables"]["jobs"][0]["revision"] += 1
    actual["tables"]["events"].reverse()
    actual["tables"]["occurrences"][0]["attempt"] = str(actual["tables"]["occurrences"][0]["attempt"])
    actual["fingerprint"] = "0" * 64
    problems = diff(recorded, actual)
    assert [problem.split(":")[0] for problem in problems] == [
        "fingerprint",
        "table events row 0",
        "table jobs row 0",
        "table occurrences row 0",
    ]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
