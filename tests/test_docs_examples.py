"""The self-contained Python examples of the docs run as written (a file path moved to ``tmp_path``).

README's tour and the first examples of docs/quickstart.md and docs/async.md are what a new user
pastes first; each runs in a fresh interpreter, so an undefined name or a changed signature fails
here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_PATH = "/var/lib/app/kernel-v1.sqlite"


def first_python_block(document: Path) -> str:
    found = re.search(r"```python\n(.*?)```", document.read_text(encoding="utf-8"), re.S)
    assert found is not None, f"no python block in {document}"
    return found.group(1)


@pytest.mark.parametrize("document", ["README.md", "docs/async.md", "docs/quickstart.md"])
def test_first_python_example_runs(document: str, tmp_path: Path) -> None:
    code = first_python_block(REPO / document)
    assert EXAMPLE_PATH in code
    script = tmp_path / "example.py"
    database = tmp_path / "app" / "kernel-v1.sqlite"
    script.write_text(code.replace(EXAMPLE_PATH, str(database)), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
