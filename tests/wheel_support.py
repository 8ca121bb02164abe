"""An installed wheel of this project in a fresh virtual environment (tests/test_alembic_branch.py).

The wheel is built with ``pip wheel --no-deps`` from a copy of the sources (the work tree stays
untouched) and installed NON-editable with ``pip install --no-deps`` into a new venv. The
dependencies (SQLAlchemy, Alembic, psycopg …) are not downloaded again: a ``.pth`` file puts the
test run's own site-packages after the venv's, which holds no ``scheduler`` package of its own
(the test run's is an editable install whose path hook a ``.pth``-added directory never runs), so
``import scheduler`` in the venv is the wheel's. :meth:`InstalledWheel.check` proves it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@dataclass(frozen=True)
class InstalledWheel:
    venv: Path
    wheel: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(
        self, *args: str, cwd: Path, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("SHOP_", "SCHEDULER_DATABASE"))
        }
        environment.pop("PYTHONPATH", None)
        environment.update(env or {})
        return subprocess.run(
            [str(self.python), *args], cwd=cwd, env=environment, capture_output=True, text=True, check=False
        )

    def alembic(self, app: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return self.run("-m", "alembic", "-c", str(app / "alembic.ini"), *args, cwd=app, env=env)

    def check(self) -> str:
        """The installed ``scheduler`` package's directory (inside the venv, never the work tree)."""
        shown = self.run("-c", "import scheduler; print(scheduler.alembic_version_location())", cwd=self.venv)
        assert shown.returncode == 0, shown.stderr
        location = shown.stdout.strip()
        assert location.startswith(str(self.venv)), location
        assert (Path(location) / "v1.py").is_file()
        queries = self.run(
            "-c", "from scheduler.backends.postgresql import queries; print(len(queries.SQL))", cwd=self.venv
        )
        assert queries.returncode == 0 and int(queries.stdout) >= 5, queries.stderr  # queries.sql shipped
        return location


def _pip_environment() -> dict[str, str]:
    """This process's environment without PYTHONPATH: a checkout on it (with its editable install's
    ``*.egg-info``) would make pip take the wheel's distribution as installed already."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def build_wheel(workdir: Path) -> Path:
    source = workdir / "src"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "scheduler", source / "scheduler", ignore=shutil.ignore_patterns("__pycache__"))
    out = workdir / "wheel"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
        env=_pip_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("scheduler_kernel-*.whl")
    return wheel


def install_wheel(workdir: Path) -> InstalledWheel:
    wheel = build_wheel(workdir)
    venv = workdir / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        env=_pip_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "test-run-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return InstalledWheel(venv, wheel)


def copy_example(name: str, destination: Path) -> Path:
    target = destination / name
    shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.sqlite*"))
    return target
