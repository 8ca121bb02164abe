"""The domain migration journal of the recorded reference databases (v4, v5), read after
``open_store`` upgraded a copy, and continued: the same plan deduplicated (its source locators
backfilled on v4), retired, and the prepared migration applied and its rollback begun.

SQLite only: the reference databases are SQLite files. API §5 Domain migration journal (v4, v5).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from migration_fixtures import uuid_for
from recorded import UPGRADE_NOW, VECTORS, copy_reference

from scheduler import open_store

VERIFIED_ID = "scheduler-domain-migration-96fcd82cc38db5e15a60e05863e67d536f54261c9c5fc7c02bfd3138ee1f31e4"
PREPARED_ID = "scheduler-domain-migration-63768a81d35abdf482ebc20fd692ad9032c889b9b837c7c66a420283458d0e86"
REFERENCE_PLAN_CASE = 1  # domain_migration_plans.json: "same plan as the reference databases v5/v6"


def _reference_plan() -> dict[str, Any]:
    cases = json.loads((VECTORS / "domain_migration_plans.json").read_text())
    result: dict[str, Any] = cases[REFERENCE_PLAN_CASE]["input"]
    return result


@pytest.mark.parametrize("version", [4, 5])
def test_reference_database_migrations_read_and_continue(version: int, tmp_path: Path) -> None:
    path = copy_reference(tmp_path, version)
    now = {"v": UPGRADE_NOW}
    uuids = iter(uuid_for(k) for k in range(100, 200))
    with open_store(path, clock=lambda: now["v"], uuid_factory=lambda: next(uuids)) as store:
        verified = store.get_domain_migration(VERIFIED_ID)
        prepared = store.get_domain_migration(PREPARED_ID)
        assert (verified.state, prepared.state) == ("verified", "prepared")
        assert [m.id for m in store.list_domain_migrations()] == [PREPARED_ID, VERIFIED_ID]
        locators = {e.domain: e.source_locator for e in verified.entries}
        if version == 5:
            assert locators == {
                "agenda": {
                    "schemaVersion": 1,
                    "type": "agenda-store",
                    "directory": "/home/alice/.chainlesschain/agenda",
                },
                "cowork-cron": {
                    "schemaVersion": 1,
                    "type": "cowork-workspace",
                    "workspace": "/srv/cowork/alpha",
                },
            }
        else:
            assert locators == {"agenda": None, "cowork-cron": None}
        now["v"] += 1000
        again = store.prepare_domain_migration(_reference_plan())  # the same plan: dedupe, backfill in v4
        assert again.id == VERIFIED_ID and again.deduplicated is True
        assert again.updated_at == (verified.updated_at if version == 5 else now["v"])
        assert {e.domain: e.source_locator is not None for e in again.entries} == {
            "agenda": True,
            "cowork-cron": version == 5,  # the v5 file got it from a later bind
        }
        cowork = next(e for e in again.entries if e.domain == "cowork-cron")
        bound = store.bind_domain_migration_source_locator(
            migration_id=VERIFIED_ID,
            entry_id=cowork.entry_id,
            source_locator={"schemaVersion": 1, "type": "cowork-workspace", "workspace": "/srv/cowork/alpha"},
            expected_source_digest=cowork.source_digest,
            expected_target_job_id=cowork.target_job_id,
        )
        assert bound.deduplicated is (version == 5)
        now["v"] += 1000
        retiring = store.begin_domain_migration_retirement(VERIFIED_ID)
        for entry in retiring.entries:
            store.confirm_domain_migration_entry_retired(
                migration_id=VERIFIED_ID,
                entry_id=entry.entry_id,
                retirement_token=entry.retirement_token,
                source=0,
            )
        assert store.get_domain_migration(VERIFIED_ID).state == "retired"
        assert store.get_job("agenda-migrated-42").enabled is True
        before = store.get_job("routine-weekly-report")
        applied = store.apply_domain_migration(PREPARED_ID)
        assert applied.entries[0].target_action == "updated"
        assert applied.entries[0].target_before == before.definition()
        rolled = store.begin_domain_migration_rollback(PREPARED_ID)
        assert rolled.entries[0].state == "rollback_target_disabled"
        restored = store.get_job("routine-weekly-report")
        assert restored.definition() == before.definition() and restored.revision == before.revision + 2
