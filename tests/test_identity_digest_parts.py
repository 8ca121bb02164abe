"""``identity_digest_parts``: the bytes around the job revision that a statement hashes itself
(PostgreSQL's ``enqueue`` statement) give the digest ``derive_occurrence_identity`` gives."""

from __future__ import annotations

import hashlib

import pytest

from scheduler.contract.identity import derive_occurrence_identity, identity_digest_parts


@pytest.mark.parametrize(
    ("job_id", "revision", "scheduled_for", "trigger_key"),
    [
        ("job-1", 1, 0, "t"),
        ("ünïcødé ✓ 𝄞", 42, 1_800_000_000_000, 'quote " back\\slash'),
        ("j", 9_007_199_254_740_991, 9_007_199_254_740_991, "line\u2028separator"),
    ],
)
def test_the_parts_around_the_revision_give_the_identitys_digest(
    job_id: str, revision: int, scheduled_for: int, trigger_key: str
) -> None:
    head, tail = identity_digest_parts(job_id, scheduled_for, trigger_key)
    digest = hashlib.sha256(head + str(revision).encode("ascii") + tail).hexdigest()
    identity = derive_occurrence_identity(
        job_id=job_id, job_revision=revision, scheduled_for=scheduled_for, trigger_key=trigger_key
    )
    assert identity.occurrence_id == f"occ_{digest}"
    assert identity.idempotency_key == f"scheduler:v1:{digest}"
