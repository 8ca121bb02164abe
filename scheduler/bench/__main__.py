"""``python -m scheduler.bench``: the benchmark command on its own."""

from __future__ import annotations

import typer

from scheduler.bench import register


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)
    app()


if __name__ == "__main__":
    main()
