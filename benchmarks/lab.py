"""What the SQLite lab scripts share: the bench's sizes on the command line and a scratch context.

The scripts measure with the pieces of ``scheduler bench`` (its configuration, stores and
scenarios) in a temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scheduler.bench.context import Context, NullProgress, make_config


def size_parser(description: str | None) -> argparse.ArgumentParser:
    """A parser (the script's docstring as its help) with ``--quick``, ``--scale`` and ``--dir``,
    as ``scheduler bench`` has them."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the bench's --quick sizes")
    parser.add_argument("--scale", type=float, default=None, help="multiply every count (default 1)")
    parser.add_argument("--dir", type=Path, default=None, help="where the scratch databases go")
    return parser


@contextmanager
def scratch_context(options: argparse.Namespace) -> Iterator[Context]:
    """A bench :class:`Context` on a temporary directory (removed afterwards), sized by the options."""
    directory = Path(tempfile.mkdtemp(prefix="scheduler-lab-", dir=options.dir))
    try:
        yield Context(make_config(quick=options.quick, scale=options.scale), directory, NullProgress())
    finally:
        shutil.rmtree(directory, ignore_errors=True)
