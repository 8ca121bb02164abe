"""The recorded fixtures of the original implementation, as stored in ``tests/fixtures/``.

Paths, the recording's clock values, writable copies of the reference databases, and the decoder
of the ``$js`` tags (``tests/fixtures/README.md`` §2). Nothing here reads outside the repository.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Final

FIXTURES: Final = Path(__file__).resolve().parent / "fixtures"
REFERENCE_DBS: Final = FIXTURES / "reference-dbs"
VECTORS: Final = FIXTURES / "vectors"
TRACES: Final = FIXTURES / "traces"

T0: Final = 1_767_225_600_000
"""2026-01-01T00:00:00Z: the reference databases and the start of every trace."""
UPGRADE_NOW: Final = 1_767_312_000_000
"""2026-01-02T00:00:00Z: the clock while the v6 store upgraded each ``vN.sqlite``."""
VERSIONS: Final = range(1, 7)


class Undefined:
    """JavaScript ``undefined`` (README §2): distinct from an absent key and from ``null``."""

    def __repr__(self) -> str:
        return "undefined"


UNDEFINED: Final = Undefined()

_NUMBERS: Final = {"-0": -0.0, "NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def decode(value: Any) -> Any:
    """A fixture value with every ``{"$js": …}`` tag turned into the Python value it stands for."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    if "$js" not in value:
        return {key: decode(item) for key, item in value.items()}
    tag = value["$js"]
    if tag in _NUMBERS:
        return _NUMBERS[tag]
    if tag == "undefined":
        return UNDEFINED
    if tag == "float":
        return float(value["repr"])
    if tag == "repeat":
        return value["string"] * value["count"]
    if tag == "cycle":
        cyclic: dict[str, Any] = {"a": 1}
        cyclic["self"] = cyclic
        return cyclic
    if tag == "function":
        returned = decode(value["returns"])
        return lambda: returned
    raise ValueError(f"unknown $js tag {tag!r}")


def document(value: Any) -> Any:
    """A wire document as Python passes it: ``undefined`` members are absent, ``undefined`` is None."""
    if value is UNDEFINED:
        return None
    if isinstance(value, dict):
        return {key: document(item) for key, item in value.items() if item is not UNDEFINED}
    if isinstance(value, list):
        return [document(item) for item in value]
    return value


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def reference_dump(version: int, *, upgraded: bool = False) -> dict[str, Any]:
    """``vN.json`` (as shipped) or ``vN.upgraded.json`` (after the v6 store opened it)."""
    suffix = ".upgraded.json" if upgraded else ".json"
    dumped: dict[str, Any] = load_json(REFERENCE_DBS / f"v{version}{suffix}")
    return dumped


def copy_reference(directory: Path, version: int | str, name: str | None = None) -> Path:
    """A private, writable (0600) copy of ``vN.sqlite`` in ``directory``: never open the original."""
    source = REFERENCE_DBS / (f"v{version}.sqlite" if isinstance(version, int) else version)
    target = directory / (name or source.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(0o600)
    return target
