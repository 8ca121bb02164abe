"""Authority policies, budgets and reservations (schema v2).

Seed 002: ``setAuthorityPolicy``, ``getAuthorityPolicy``, ``ensureAuthorityPolicy``,
``getAuthorityReservation``, ``reserveAuthority``. Settlement of reservations happens in
``settle`` and in the expired-lease sweep (``claim_writes.py``).
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.engine import Row

from scheduler.contract.authority import (
    normalize_capability_list,
)
from scheduler.contract.canonical import canonical_json
from scheduler.contract.constants import (
    DEFAULT_AUTHORITY_MAX_RUNS,
    DEFAULT_AUTHORITY_MAX_UNITS,
    DEFAULT_AUTHORITY_WINDOW_MS,
    MAX_AUTHORITY_BUDGET,
    MAX_AUTHORITY_WINDOW_MS,
    MAX_SAFE_INTEGER,
    MIN_AUTHORITY_WINDOW_MS,
    RUNNING,
)
from scheduler.contract.errors import SchedulerKernelError, invalid_argument, kernel_error
from scheduler.contract.scalars import is_safe_int, normalize_boolean
from scheduler.contract.storable import (
    normalize_key,
    normalize_stored_authority,
    normalize_stored_capabilities,
    normalize_stored_principal,
)
from scheduler.schema import tables as t
from scheduler.store.capabilities.base import StoreBase
from scheduler.store.capabilities.jobs import not_found
from scheduler.store.plumbing.rows import data_corrupt, map_occurrence, read_stored_json
from scheduler.store.plumbing.statement_plans import Prepared
from scheduler.store.plumbing.tx import Tx
from scheduler.store.records import AuthorityPolicy, AuthorityReservation, Occurrence

POLICY_CONFLICT = "SCHEDULER_AUTHORITY_POLICY_CONFLICT"


def normalize_authority_budget_limit(
    value: object, field: str, *, minimum: int = 1, maximum: int = MAX_AUTHORITY_BUDGET
) -> int:
    """An ``int`` in ``minimum..maximum`` (seed: normalizeAuthorityBudgetLimit)."""
    if not is_safe_int(value) or value < minimum or value > maximum:
        raise invalid_argument(f"{field} must be an integer between {minimum} and {maximum}")
    return int(value)


def _normalize_window_ms(value: object) -> int:
    return normalize_authority_budget_limit(
        value, "windowMs", minimum=MIN_AUTHORITY_WINDOW_MS, maximum=MAX_AUTHORITY_WINDOW_MS
    )


def _normalize_policy_expected_revision(value: object) -> int | None:
    if value is None:
        return None
    if not is_safe_int(value) or value < 0:
        raise invalid_argument("expectedRevision must be an integer >= 0")
    return int(value)


def occurrence_not_found(occurrence_id: str) -> SchedulerKernelError:
    return not_found("occurrence", occurrence_id)


# --------------------------------------------------------------------------- rows


LOCK_OCCURRENCE: Final = Prepared(
    select(t.occurrences.c.occurrence_id)
    .where(t.occurrences.c.occurrence_id == bindparam("occurrence_id"))
    .with_for_update()
)
POLICY_LOCKS: Final = "authority_policy"


def lock_occurrence_row(tx: Tx, occurrence_id: str) -> None:
    """Hold the occurrence's row until the transaction ends: the row that decides every write
    on one occurrence (PostgreSQL ``FOR UPDATE``; SQLite's write transaction excludes others)."""
    tx.first(LOCK_OCCURRENCE, {"occurrence_id": occurrence_id})


def lock_policy(tx: Tx, principal: dict[str, str]) -> None:
    """Hold the principal's policy, present or not (its budget and revision) until the end."""
    tx.lock_keys(POLICY_LOCKS, [f"{principal['type']}\x1f{principal['id']}"])


def load_occurrence_row(tx: Tx, occurrence_id: str) -> Row[Any] | None:
    return tx.first(select(t.occurrences).where(t.occurrences.c.occurrence_id == occurrence_id))


def load_occurrence(tx: Tx, occurrence_id: str) -> Occurrence | None:
    return map_occurrence(load_occurrence_row(tx, occurrence_id))


def _stored_capabilities(encoded: str) -> list[str]:
    value = read_stored_json(encoded, "scheduler authority capabilities")
    try:
        return normalize_capability_list(value)
    except SchedulerKernelError as cause:
        raise data_corrupt("Stored scheduler authority capabilities are invalid", cause) from cause


def map_authority_policy(row: Row[Any] | None) -> AuthorityPolicy | None:
    """Seed: mapAuthorityPolicy."""
    if row is None:
        return None
    return AuthorityPolicy(
        principal={"type": row.principal_type, "id": row.principal_id},
        revision=row.revision,
        enabled=row.enabled == 1,
        capabilities=_stored_capabilities(row.capabilities_json),
        window_ms=row.window_ms,
        max_runs=row.max_runs,
        max_units=row.max_units,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def map_authority_reservation(row: Row[Any] | None) -> AuthorityReservation | None:
    """Seed: mapAuthorityReservation."""
    if row is None:
        return None
    return AuthorityReservation(
        occurrence_id=row.occurrence_id,
        job_id=row.job_id,
        principal={"type": row.principal_type, "id": row.principal_id},
        policy_revision=row.policy_revision,
        window_started_at=row.window_started_at,
        units=row.units,
        status=row.status,
        outcome=None
        if row.outcome_json is None
        else read_stored_json(row.outcome_json, "scheduler authority outcome"),
        created_at=row.created_at,
        settled_at=row.settled_at,
    )


def _policy_row(tx: Tx, principal: dict[str, str]) -> Row[Any] | None:
    p = t.authority_policies
    return tx.first(
        select(p).where(p.c.principal_type == principal["type"], p.c.principal_id == principal["id"])
    )


def load_authority_policy(tx: Tx, principal: dict[str, str]) -> AuthorityPolicy | None:
    return map_authority_policy(_policy_row(tx, principal))


def load_authority_reservation(tx: Tx, occurrence_id: str) -> AuthorityReservation | None:
    r = t.authority_reservations
    return map_authority_reservation(tx.first(select(r).where(r.c.occurrence_id == occurrence_id)))


# --------------------------------------------------------------------------- policies


def set_authority_policy_in(
    tx: Tx,
    principal: dict[str, str],
    values: dict[str, Any],
    expected_revision: int | None,
) -> AuthorityPolicy:
    """Create or replace a policy, bumping its revision (CAS when ``expected_revision`` is given)."""
    lock_policy(tx, principal)
    current = _policy_row(tx, principal)
    current_revision = 0 if current is None else int(current.revision)
    if expected_revision is not None and expected_revision != current_revision:
        raise kernel_error(
            POLICY_CONFLICT,
            "Scheduler authority policy revision does not match",
            {"expectedRevision": expected_revision, "actualRevision": current_revision},
        )
    p = t.authority_policies
    row_values = {**values, "revision": current_revision + 1, "updated_at": tx.now}
    if current is None:
        tx.execute(
            insert(p).values(
                principal_type=principal["type"],
                principal_id=principal["id"],
                created_at=tx.now,
                **row_values,
            )
        )
    else:
        tx.execute(
            update(p)
            .where(p.c.principal_type == principal["type"], p.c.principal_id == principal["id"])
            .values(**row_values)
        )
    policy = load_authority_policy(tx, principal)
    assert policy is not None
    return policy


def _policy_values(
    capabilities: list[str], window_ms: int, max_runs: int, max_units: int, enabled: bool
) -> dict[str, Any]:
    return {
        "enabled": 1 if enabled else 0,
        "capabilities_json": canonical_json(capabilities, "authorityPolicy.capabilities"),
        "window_ms": window_ms,
        "max_runs": max_runs,
        "max_units": max_units,
    }


# --------------------------------------------------------------------------- reservations


def _assert_same_reservation(
    reservation: AuthorityReservation, occurrence: Occurrence, policy_revision: int, units: int
) -> None:
    principal = occurrence.authority["principal"]
    if (
        reservation.job_id != occurrence.job_id
        or reservation.principal["type"] != principal["type"]
        or reservation.principal["id"] != principal["id"]
        or reservation.policy_revision != policy_revision
        or reservation.units != units
    ):
        raise kernel_error(
            "SCHEDULER_AUTHORITY_RESERVATION_MISMATCH",
            f"Scheduler authority reservation identity is mismatched: {occurrence.id}",
        )


def _usable_policy(tx: Tx, principal: dict[str, str], policy_revision: int) -> AuthorityPolicy:
    policy = load_authority_policy(tx, principal)
    label = f"{principal['type']}:{principal['id']}"
    if policy is None or not policy.enabled:
        raise kernel_error(
            "SCHEDULER_AUTHORITY_POLICY_REQUIRED",
            f"Scheduler authority policy is missing or disabled: {label}",
        )
    if policy.revision != policy_revision:
        raise kernel_error(
            "SCHEDULER_AUTHORITY_POLICY_STALE",
            f"Scheduler authority policy changed before reservation: {label}",
            {"expectedRevision": policy_revision, "actualRevision": policy.revision},
        )
    return policy


def _assert_capabilities(occurrence: Occurrence, policy: AuthorityPolicy) -> None:
    allowed = policy.capabilities
    denied = [
        capability
        for capability in occurrence.authority["requestedCapabilities"]
        if "*" not in allowed and capability not in allowed
    ]
    if denied:
        principal = occurrence.authority["principal"]
        raise kernel_error(
            "SCHEDULER_AUTHORITY_PERMISSION_DENIED",
            f"Scheduler authority capability was denied: {principal['type']}:{principal['id']}",
            {"denied": denied},
        )


def _window_usage(tx: Tx, key: dict[str, Any]) -> tuple[dict[str, int], bool]:
    """The usage row of one principal/revision/window (``{runs: 0, units: 0}`` if absent)."""
    u = t.authority_usage
    row = tx.first(select(u.c.runs, u.c.units).where(*(u.c[name] == value for name, value in key.items())))
    if row is None:
        return {"runs": 0, "units": 0}, False
    return {"runs": int(row.runs), "units": int(row.units)}, True


def _window_reservations(tx: Tx, key: dict[str, Any]) -> dict[str, int]:
    r = t.authority_reservations
    row = tx.first(
        select(func.count().label("runs"), func.coalesce(func.sum(r.c.units), 0).label("units")).where(
            *(r.c[name] == value for name, value in key.items())
        )
    )
    assert row is not None
    return {"runs": int(row.runs), "units": int(row.units)}


def _charge_budget(tx: Tx, policy: AuthorityPolicy, units: int) -> int:
    """Check and book one run of ``units`` in the current window; return the window start."""
    principal = policy.principal
    window_started_at = tx.now // policy.window_ms * policy.window_ms
    key = {
        "principal_type": principal["type"],
        "principal_id": principal["id"],
        "policy_revision": policy.revision,
        "window_started_at": window_started_at,
    }
    label = f"{principal['type']}:{principal['id']}"
    usage, exists = _window_usage(tx, key)
    reservations = _window_reservations(tx, key)
    if reservations["runs"] != usage["runs"] or reservations["units"] != usage["units"]:
        raise kernel_error(
            "SCHEDULER_AUTHORITY_BUDGET_STATE_INVALID",
            f"Scheduler authority usage does not match reservations: {label}",
            {"usage": usage, "reservations": reservations},
        )
    next_runs = usage["runs"] + 1
    next_units = usage["units"] + units
    if next_runs > policy.max_runs or next_units > policy.max_units:
        raise kernel_error(
            "SCHEDULER_AUTHORITY_BUDGET_EXHAUSTED",
            f"Scheduler authority budget is exhausted: {label}",
            {
                "windowStartedAt": window_started_at,
                "windowEndsAt": window_started_at + policy.window_ms,
                "usedRuns": usage["runs"],
                "usedUnits": usage["units"],
                "requestedUnits": units,
                "maxRuns": policy.max_runs,
                "maxUnits": policy.max_units,
            },
        )
    u = t.authority_usage
    counts = {"runs": next_runs, "units": next_units, "updated_at": tx.now}
    if exists:
        tx.execute(update(u).where(*(u.c[name] == value for name, value in key.items())).values(**counts))
    else:
        tx.execute(insert(u).values(**key, **counts))
    return window_started_at


def reserve_authority_in(
    tx: Tx, occurrence_id: str, policy_revision: int, units: int
) -> AuthorityReservation:
    """Reserve budget for a running occurrence (idempotent per occurrence; seed: reserveAuthority).

    The occurrence's row, then its principal's policy are locked before anything is decided, so
    concurrent reservations never overspend a window's budget."""
    lock_occurrence_row(tx, occurrence_id)
    occurrence = load_occurrence(tx, occurrence_id)
    if occurrence is None:
        raise occurrence_not_found(occurrence_id)
    if occurrence.status != RUNNING:
        raise kernel_error(
            "SCHEDULER_AUTHORITY_OCCURRENCE_NOT_RUNNING",
            f"Scheduler authority may only reserve a running occurrence: {occurrence_id}",
        )
    existing = load_authority_reservation(tx, occurrence_id)
    if existing is not None:
        _assert_same_reservation(existing, occurrence, policy_revision, units)
        replayed: AuthorityReservation = existing.replace(deduplicated=True)
        return replayed
    principal = occurrence.authority["principal"]
    lock_policy(tx, principal)
    policy = _usable_policy(tx, principal, policy_revision)
    _assert_capabilities(occurrence, policy)
    window_started_at = _charge_budget(tx, policy, units)
    tx.execute(
        insert(t.authority_reservations).values(
            occurrence_id=occurrence_id,
            job_id=occurrence.job_id,
            principal_type=principal["type"],
            principal_id=principal["id"],
            policy_revision=policy.revision,
            window_started_at=window_started_at,
            units=units,
            status="reserved",
            outcome_json=None,
            created_at=tx.now,
            settled_at=None,
        )
    )
    reservation = load_authority_reservation(tx, occurrence_id)
    assert reservation is not None
    created: AuthorityReservation = reservation.replace(deduplicated=False)
    return created


class AuthorityOperations(StoreBase):
    """Public authority methods of ``SchedulerStore``."""

    def set_authority_policy(
        self,
        principal: Any,
        *,
        capabilities: Any,
        window_ms: Any,
        max_runs: Any,
        max_units: Any,
        enabled: Any = True,
        expected_revision: Any = None,
    ) -> AuthorityPolicy:
        """Create or replace the policy of ``principal`` (``expected_revision=0`` = create only)."""
        actor = normalize_stored_principal(principal)
        allowed = normalize_stored_capabilities(capabilities)
        window = _normalize_window_ms(window_ms)
        runs = normalize_authority_budget_limit(max_runs, "maxRuns")
        units = normalize_authority_budget_limit(max_units, "maxUnits")
        active = normalize_boolean(enabled, "enabled")
        revision = _normalize_policy_expected_revision(expected_revision)
        values = _policy_values(allowed, window, runs, units, active)
        return self._write(lambda tx: set_authority_policy_in(tx, actor, values, revision))

    def get_authority_policy(self, principal: Any) -> AuthorityPolicy | None:
        """The policy of ``principal`` (``{"type", "id"}``), or ``None``."""
        self._assert_open()  # seed: a read checks the store before its arguments
        actor = normalize_stored_principal(principal)
        return self._read(lambda tx: load_authority_policy(tx, actor))

    def ensure_authority_policy(
        self,
        authority: Any,
        *,
        window_ms: Any = DEFAULT_AUTHORITY_WINDOW_MS,
        max_runs: Any = DEFAULT_AUTHORITY_MAX_RUNS,
        max_units: Any = DEFAULT_AUTHORITY_MAX_UNITS,
    ) -> AuthorityPolicy:
        """The principal's policy; if there is none, create one granting the envelope's capabilities.

        Seed: ensureAuthorityPolicy. Only the envelope is validated first; an existing policy is
        returned as it is, and the creation options (``window_ms`` 60000..2678400000, ``max_runs``
        and ``max_units`` 1..1000000; the envelope's ``requestedCapabilities``, 1..256 of them,
        no ``"*"``) are validated only when a policy is created, in ``set_authority_policy``'s
        order. Tolerates a concurrent creation (returns the policy another writer created).
        """
        normalized = normalize_stored_authority(authority)
        actor: dict[str, str] = normalized["principal"]
        current = self._read(lambda tx: load_authority_policy(tx, actor))
        if current is not None:
            return current
        capabilities = normalize_capability_list(normalized["requestedCapabilities"])
        window = _normalize_window_ms(window_ms)
        runs = normalize_authority_budget_limit(max_runs, "maxRuns")
        units = normalize_authority_budget_limit(max_units, "maxUnits")
        values = _policy_values(capabilities, window, runs, units, True)
        try:
            return self._write(lambda tx: set_authority_policy_in(tx, actor, values, 0))
        except SchedulerKernelError as error:
            if error.code != POLICY_CONFLICT:
                raise
            raced = self._read(lambda tx: load_authority_policy(tx, actor))
            if raced is not None:
                return raced
            raise

    def get_authority_reservation(self, occurrence_id: Any) -> AuthorityReservation | None:
        """The occurrence's reservation, or ``None``."""
        self._assert_open()  # seed: a read checks the store before its arguments
        identifier = normalize_key(occurrence_id, "occurrenceId")
        return self._read(lambda tx: load_authority_reservation(tx, identifier))

    def reserve_authority(
        self, *, occurrence_id: Any, policy_revision: Any, units: Any = 1
    ) -> AuthorityReservation:
        """Book ``units`` of the principal's budget for a running occurrence (``deduplicated`` on repeat)."""
        identifier = normalize_key(occurrence_id, "occurrenceId")
        revision = normalize_authority_budget_limit(
            policy_revision, "policyRevision", maximum=MAX_SAFE_INTEGER
        )
        requested = normalize_authority_budget_limit(units, "units")
        return self._write(lambda tx: reserve_authority_in(tx, identifier, revision, requested))
