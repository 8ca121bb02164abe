"""A stray file of a few bytes where the database should be is refused, never overwritten.

A file of 1..99 bytes of text, or the start of an SQLite header, is not a database: every way in
(``open_store``, ``open_async_store``, the CLI's ``init``/``upgrade``/``verify``/``info``, read and
write commands, and ``alembic upgrade head``) answers exactly as it does for a larger foreign file
(``SCHEDULER_SCHEMA_CORRUPT`` where the database is opened), and the file keeps its bytes and its
mode, with no sidecar created beside it. SQLite itself takes a 1-byte file for an empty database
(its unix VFS reports that size as 0), so before the store checked the header it created a new
database over such a file. An empty (0-byte) file stays a new database.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from cli_support import invoke
from cli_support import isolated_environment as isolated_environment

from scheduler import SchedulerKernelError, open_store
from scheduler.aio import open_async_store
from scheduler.schema import schema_fingerprint
from scheduler.schema.ddl import SCHEMA_FINGERPRINTS

REPO = Path(__file__).resolve().parents[3]
HEADER = b"SQLite format 3\x00\x10\x00\x01\x01\x00\x40\x20\x20" + bytes(80)
STRAY = {
    "one byte": b"x",
    "a word": b"hello\n",
    "99 bytes of text": (b"not a database, just notes. " * 4)[:99],
    "the magic string alone": HEADER[:16],
    "a partial header": HEADER[:60],
    "99 header bytes": HEADER[:99],
}
FOREIGN = bytes(range(256)) * 16  # a larger file that is not a database
MODE = 0o644

CLI_COMMANDS: list[tuple[str, ...]] = [
    ("init",),
    ("upgrade",),
    ("upgrade", "--dry-run"),
    ("upgrade", "--sql"),
    ("verify",),
    ("info",),
    ("dead-letters",),
    ("jobs", "list"),
    ("stats",),
    ("occurrences", "list"),
    ("prune", "--older-than", "1d"),
    ("requeue", "occ_x"),
    ("cancel", "occ_x"),
]


def place(directory: Path, content: bytes) -> Path:
    directory.mkdir(mode=0o700)
    path = directory / "kernel.sqlite"
    path.write_bytes(content)
    os.chmod(path, MODE)
    return path


def assert_untouched(path: Path, content: bytes) -> None:
    assert path.read_bytes() == content
    assert stat.S_IMODE(os.stat(path).st_mode) == MODE
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no sidecar


def open_code(path: Path) -> str:
    with pytest.raises(SchedulerKernelError) as refused:
        open_store(path).close()
    return refused.value.code


def async_open_code(path: Path) -> str:
    async def opened() -> None:
        store = await open_async_store(path)
        await store.close()

    with pytest.raises(SchedulerKernelError) as refused:
        asyncio.run(opened())
    return refused.value.code


def cli_outcome(path: Path, arguments: tuple[str, ...]) -> tuple[int, Any]:
    """Exit code and what the command reports: its error code, or verify's findings."""
    result = invoke("--db", str(path), *arguments, "--json")
    try:
        body = json.loads(result.stdout)
    except ValueError:
        return result.exit_code, result.output
    if "error" in body:
        return result.exit_code, body["error"]["code"]
    findings = [(finding["check"], finding["code"]) for finding in body.get("findings", [])]
    return result.exit_code, (findings, body.get("userVersion", "-"))


def alembic_outcome(path: Path) -> str:
    config = Config(str(REPO / "alembic.ini"), stdout=io.StringIO())
    config.cmd_opts = argparse.Namespace(x=[f"url=sqlite:///{path}"])
    config.attributes["configure_logger"] = False
    with pytest.raises(CommandError) as refused:
        command.upgrade(config, "head")
    return str(refused.value).split(":", 1)[0]


def cli_command(arguments: tuple[str, ...]) -> Callable[[Path], Any]:
    return lambda path: cli_outcome(path, arguments)


WAYS_IN: dict[str, Callable[[Path], Any]] = {
    "open_store": open_code,
    "open_async_store": async_open_code,
    "alembic upgrade head": alembic_outcome,
    **{f"scheduler {' '.join(arguments)}": cli_command(arguments) for arguments in CLI_COMMANDS},
}
SCHEMA_CORRUPT = "SCHEDULER_SCHEMA_CORRUPT"
OPENING = {  # what the ways in that open the database answer (the others as SQLite's readers)
    "open_store": SCHEMA_CORRUPT,
    "open_async_store": SCHEMA_CORRUPT,
    "alembic upgrade head": SCHEMA_CORRUPT,
    "scheduler init": (1, SCHEMA_CORRUPT),
    "scheduler upgrade": (1, SCHEMA_CORRUPT),
    "scheduler prune --older-than 1d": (1, SCHEMA_CORRUPT),
}


@pytest.mark.parametrize("way", list(WAYS_IN))
@pytest.mark.parametrize("name", list(STRAY))
def test_a_stray_file_is_refused_like_a_foreign_file_and_left_untouched(
    tmp_path: Path, name: str, way: str
) -> None:
    answer = WAYS_IN[way]
    foreign = place(tmp_path / "foreign", FOREIGN)
    stray = place(tmp_path / "stray", STRAY[name])
    expected = answer(foreign)
    assert_untouched(foreign, FOREIGN)
    assert answer(stray) == expected
    assert_untouched(stray, STRAY[name])
    assert expected == OPENING.get(way, expected)
    if way.startswith("scheduler"):
        assert expected[0] == 1


def test_an_empty_file_stays_a_new_database(tmp_path: Path) -> None:
    for n, opener in enumerate((open_store, None)):
        path = place(tmp_path / f"empty{n}", b"")
        if opener is None:

            async def opened(target: Path = path) -> None:
                await (await open_async_store(target)).close()

            asyncio.run(opened())
        else:
            opener(path).close()
        with open_store(path) as store:
            assert schema_fingerprint(store.connection) == SCHEMA_FINGERPRINTS[6]
            store.connection.rollback()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    cli = place(tmp_path / "cli", b"")
    assert invoke("--db", str(cli), "init").exit_code == 0
    with open_store(cli) as store:
        assert store.schema_info().schema_version == 6
