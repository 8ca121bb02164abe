"""cProfile of the hot paths: where one enqueue and one claim + settle spend CPU time.

    python -m benchmarks.profile_hot_paths [--quick] [--scale 0.1] [--json FILE]

Self time is grouped by module (SQLAlchemy, the sqlite3 driver, COMMIT/fsync, canonical JSON,
record mapping, validation, store logic). Built-in functions other than the driver's are
charged to their callers' groups, edge by edge, so the groups add up to the total. Prints
Markdown tables (the groups, then the top cumulative entries) per hot path.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from benchmarks.lab import scratch_context, size_parser
from scheduler.bench.context import LEASE_MS, Context
from scheduler.bench.report import markdown_table
from scheduler.bench.stores import PAST_MS, enqueue_request, fill_queue, open_bench_store, require, wall_ms

FuncKey = tuple[str, int, str]
COMMIT: Final = "COMMIT + fsync (sqlite3 commit)"
DRIVER: Final = "sqlite3 driver: execute / fetch"
SQLALCHEMY: Final = "SQLAlchemy execution overhead"
CANONICAL: Final = "canonical JSON (encode)"
MAPPING: Final = "record mapping (rows, records, stored JSON/authority)"
VALIDATION: Final = "argument validation + identity (contract)"
STORE: Final = "store logic (scheduler/store)"
OTHER: Final = "benchmark loop + other"
TOP: Final = 25
CYCLES: Final = 2_000
ENQUEUES: Final = 5_000
_FILE_GROUPS: Final = (
    ("/sqlalchemy/", SQLALCHEMY),
    ("/scheduler/contract/canonical.py", CANONICAL),
    ("/json/encoder.py", CANONICAL),
    ("/scheduler/store/plumbing/rows.py", MAPPING),
    ("/scheduler/store/records.py", MAPPING),
    ("/scheduler/contract/authority.py", MAPPING),
    ("/json/decoder.py", MAPPING),
    ("/json/__init__.py", MAPPING),
    ("/scheduler/contract/", VALIDATION),
    ("/scheduler/store/", STORE),
)


_MAPPING_FUNCTIONS: Final = frozenset(
    {
        "occurrence_record",
        "stored_authority",
        "_stored_json",
        "_optional_json",
        "_columns",
        "_as_dict",
        "_asdict",
    }
)
"""Record-mapping helpers in store modules (and ``namedtuple._asdict`` behind fast-path rows)."""


def group_of(key: FuncKey) -> str | None:
    """The group of a function; ``None`` for built-ins charged to their callers."""
    filename, _, name = key
    if filename == "~":
        if "sqlite3.Connection" in name and "commit" in name:
            return COMMIT
        if "sqlite3" in name:
            return DRIVER
        return None
    normalized = filename.replace("\\", "/")
    if name in _MAPPING_FUNCTIONS and ("/scheduler/store/" in normalized or "/collections/" in normalized):
        return MAPPING
    return next((group for marker, group in _FILE_GROUPS if marker in normalized), OTHER)


def _label(key: FuncKey) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    short = filename.replace("\\", "/")
    for marker in ("/site-packages/", "/scheduler/", "/lib/python"):
        if marker in short:
            short = short.split(marker, 1)[1]
            break
    return f"{short}:{line}({name})"


def _charge(stats: dict[FuncKey, Any], key: FuncKey, seen: frozenset[FuncKey]) -> dict[str, float]:
    """Where a built-in's self time goes: its callers' groups, in proportion to each call edge."""
    shares: dict[str, float] = defaultdict(float)
    for caller, edge in stats[key][4].items():
        group = group_of(caller)
        if group is None and caller in stats and caller not in seen:
            caller_total = stats[caller][2] or 1.0
            for name, part in _charge(stats, caller, seen | {caller}).items():
                shares[name] += edge[2] * part / caller_total
        else:
            shares[group or OTHER] += edge[2]
    return shares


def summarize(profile: cProfile.Profile, operations: int) -> dict[str, Any]:
    stats: dict[FuncKey, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    groups: dict[str, float] = defaultdict(float)
    for key, (_, _, self_time, _, _) in stats.items():
        group = group_of(key)
        if group is not None:
            groups[group] += self_time
        else:
            for name, share in _charge(stats, key, frozenset({key})).items():
                groups[name] += share
    total = sum(groups.values()) or 1.0
    executes = sum(
        nc
        for key, (_, nc, _, _, _) in stats.items()
        if key[0] == "~" and "sqlite3.Cursor" in key[2] and "execute" in key[2]
    )
    ranked = sorted(stats.items(), key=lambda item: item[1][3], reverse=True)
    return {
        "operations": operations,
        "seconds": round(total, 4),
        "us_per_operation": round(total / operations * 1e6, 1),
        "sqlite_executes_per_operation": round(executes / operations, 2),
        "groups": [
            {"group": name, "seconds": round(seconds, 4), "share": round(seconds / total, 4)}
            for name, seconds in sorted(groups.items(), key=lambda item: item[1], reverse=True)
        ],
        "top_cumulative": [
            {
                "function": _label(key),
                "calls": value[1],
                "cumulative_s": round(value[3], 4),
                "per_operation_us": round(value[3] / operations * 1e6, 1),
            }
            for key, value in ranked[:TOP]
        ],
    }


def _profiled(operation: Callable[[], None], operations: int) -> dict[str, Any]:
    # Process CPU time, not wall time: the commit's fsync wait is not the library's cost, and CPU
    # time is what the load of a shared machine disturbs least.
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        operation()
    finally:
        profile.disable()
    return summarize(profile, operations)


def _sized(ctx: Context, count: int) -> int:
    return max(20, round(count * ctx.config.scale * (0.5 if ctx.config.quick else 1.0)))


def profile_enqueues(ctx: Context) -> dict[str, Any]:
    count = _sized(ctx, ENQUEUES)
    store = open_bench_store(ctx.path("profile-enqueue.sqlite"))
    try:
        require(store, "enqueue_occurrence")
        base = wall_ms() - PAST_MS
        requests = [enqueue_request("profile", index, base) for index in range(count)]

        def run() -> None:
            for request in requests:
                store.enqueue_occurrence(**request)

        return _profiled(run, count)
    finally:
        store.close()


def profile_cycles(ctx: Context) -> dict[str, Any]:
    count = _sized(ctx, CYCLES)
    store = open_bench_store(ctx.path("profile-cycles.sqlite"))
    try:
        require(store, "claim_next", "settle")
        fill_queue(store, "profile", count)

        def run() -> None:
            for _ in range(count):
                occurrence = store.claim_next(owner_id="bench-profile", lease_ms=LEASE_MS)
                store.settle(
                    occurrence_id=occurrence.id,
                    owner_id="bench-profile",
                    fence=occurrence.fence,
                    outcome="succeeded",
                )

        return _profiled(run, count)
    finally:
        store.close()


def profile_one_commit_cycles(ctx: Context) -> dict[str, Any]:
    count = _sized(ctx, CYCLES)
    store = open_bench_store(ctx.path("profile-one-commit.sqlite"))
    try:
        require(store, "settle_and_claim")
        fill_queue(store, "profile", count + 1)
        held = store.claim_next(owner_id="bench-profile", lease_ms=LEASE_MS)

        def run() -> None:
            nonlocal held
            for _ in range(count):
                cycle = store.settle_and_claim(
                    occurrence_id=held.id,
                    owner_id="bench-profile",
                    fence=held.fence,
                    outcome="succeeded",
                    lease_ms=LEASE_MS,
                )
                held = cycle.claimed

        return _profiled(run, count)
    finally:
        store.close()


def profile_hot_paths(ctx: Context) -> dict[str, Any]:
    """Profiles of ``enqueue_occurrence`` and of ``claim_next`` + ``settle`` cycles."""
    task = ctx.progress.task("cProfile (CPU time): enqueue, claim_next + settle, settle_and_claim", 3)
    result: dict[str, Any] = {}
    profiles = (
        ("enqueue_occurrence", profile_enqueues),
        ("claim_next_settle", profile_cycles),
        ("settle_and_claim", profile_one_commit_cycles),
    )
    for name, measure in profiles:
        try:
            result[name] = measure(ctx)
        except Exception as error:
            result[name] = {"n/a": f"{type(error).__name__}: {error}"}
        task.advance()
    task.finish()
    return result


def profile_markdown(profile: dict[str, Any]) -> str:
    lines: list[str] = []
    for name, summary in profile.items():
        if "groups" not in summary:
            lines.append(f"- {name}: {summary}")
            continue
        lines.append(
            f"**{name}** — {summary['operations']} operations, {summary['us_per_operation']} µs each under "
            f"cProfile, {summary['sqlite_executes_per_operation']} sqlite3 executes each"
        )
        lines += [
            "",
            *markdown_table(
                ["self time by group", "seconds", "share"],
                [
                    [group["group"], f"{group['seconds']:.3f}", f"{group['share']:.1%}"]
                    for group in summary["groups"]
                ],
            ),
            "",
        ]
        lines += markdown_table(
            ["top cumulative", "calls", "cumulative s", "µs per operation"],
            [
                [
                    entry["function"],
                    str(entry["calls"]),
                    f"{entry['cumulative_s']:.3f}",
                    f"{entry['per_operation_us']}",
                ]
                for entry in summary["top_cumulative"]
            ],
        )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = size_parser(__doc__)
    parser.add_argument("--json", type=Path, default=None, help="also write the profiles as JSON")
    options = parser.parse_args()
    with scratch_context(options) as ctx:
        profile = profile_hot_paths(ctx)
    print(profile_markdown(profile))
    if options.json is not None:
        options.json.write_text(json.dumps(profile, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
