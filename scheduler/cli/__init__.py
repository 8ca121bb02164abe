"""The ``scheduler`` operator command line (Typer + rich).

``--db`` names a SQLite file or a PostgreSQL database (``postgresql+psycopg://``; ``--schema``,
before the command or after it, picks the scheduler's schema there, default ``scheduler``). A SQLite
file shared with an application (the scheduler's tables beside its own, ``exclusive=False``) is
detected and opened as such; ``--shared`` says so where nothing can be detected yet. Ids: every
command that takes an id accepts a unique prefix; tables show short ids (``scheduler.cli.ids``). Read
commands open the database read-only and never create or upgrade it; ``init``, ``upgrade``,
``adjudication decide``, ``demo``, ``worker``, ``requeue``, ``cancel``, ``pause``, ``resume``,
``prune`` and ``tasks cancel|retry`` write; ``dashboard`` serves the web dashboard. Every read
command takes ``--json``.
Exit codes: 0 ok, 1 failure (verification failed, not found, refused), 2 usage error.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from scheduler import bench
from scheduler.cli import dashboard_cmd, demo_cmd, operator, ops, reads, schema_cmds, tasks_cmd, worker_cmd
from scheduler.cli.common import DbOption, SchemaOption, SharedOption, configure_logging, set_root_db

app = typer.Typer(
    name="scheduler",
    help="Run workers and operate a scheduler database: create, upgrade, verify, inspect, requeue, cancel, "
    "prune.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def root(
    db: DbOption = None,
    schema: SchemaOption = None,
    shared: SharedOption = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logs on stderr.")] = False,
) -> None:
    """Global options; ``--db``, ``--schema`` and ``--shared`` here apply to every command (a
    command's own ``--db``/``--schema`` wins; ``--shared`` anywhere counts)."""
    set_root_db(db, schema, shared)
    configure_logging(verbose)


app.command("init")(schema_cmds.init_command)
app.command("upgrade")(schema_cmds.upgrade_command)
app.command("verify")(schema_cmds.verify_command)
app.command("info")(schema_cmds.info_command)
app.add_typer(reads.jobs_app, name="jobs")
app.add_typer(reads.occurrences_app, name="occurrences")
app.command("history")(reads.history_command)
app.command("dead-letters")(reads.dead_letters_command)
app.add_typer(operator.adjudication_app, name="adjudication")
app.add_typer(operator.migrations_app, name="migrations")
app.add_typer(operator.controls_app, name="controls")
app.command("demo")(demo_cmd.demo_command)
app.command("worker")(worker_cmd.worker_command)
app.add_typer(tasks_cmd.tasks_app, name="tasks")
app.command("requeue")(ops.requeue_command)
app.command("cancel")(ops.cancel_command)
app.command("pause")(ops.pause_command)
app.command("resume")(ops.resume_command)
app.command("prune")(ops.prune_command)
app.command("stats")(ops.stats_command)
app.command("dashboard")(dashboard_cmd.dashboard_command)
bench.register(app)


def _escape_unencodable_output() -> None:
    """Print text the terminal's encoding cannot hold as ``\\uXXXX`` escapes instead of failing.

    Stored strings may hold lone surrogates (canonical JSON keeps them, as JavaScript does); UTF-8
    cannot encode them, so a strict stdout raised and the C locale's ``surrogateescape`` wrote raw
    bytes that are not UTF-8. Escaped, a table shows them and ``--json`` stays valid JSON that decodes
    back to the stored value (the escape is JSON's own)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main() -> None:
    """Console-script entry point (``scheduler``)."""
    _escape_unencodable_output()
    app()


__all__ = ["app", "main"]
