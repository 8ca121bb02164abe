"""Where the shop's tables and the scheduler's live, per layout (docs/embedding.md).

=============  ==========================================  =========================================
SHOP_LAYOUT    the shop's tables                            the scheduler's tables
=============  ==========================================  =========================================
dedicated      SHOP_DATABASE (SQLite)                       SHOP_KERNEL, a file of its own
shared         SHOP_DATABASE (SQLite)                       the same file, beside the shop's
attached       SHOP_DATABASE (SQLite)                       SHOP_KERNEL, ATTACHed as SHOP_SCHEMA
postgresql     SHOP_DATABASE (a postgresql:// URL)          the schema SHOP_SCHEMA (``scheduler``)
=============  ==========================================  =========================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine

import scheduler

LAYOUTS = ("dedicated", "shared", "attached", "postgresql")


@dataclass(frozen=True)
class Settings:
    layout: str
    database: str
    kernel: str | None = None
    schema: str | None = None
    journal_mode: str = "wal"

    @classmethod
    def from_environment(cls) -> Settings:
        layout = os.environ.get("SHOP_LAYOUT", "shared")
        if layout not in LAYOUTS:
            raise SystemExit(f"SHOP_LAYOUT must be one of {LAYOUTS}")
        schema = os.environ.get("SHOP_SCHEMA") or {"attached": "kernel", "postgresql": "scheduler"}.get(
            layout
        )
        return cls(
            layout=layout,
            database=os.environ["SHOP_DATABASE"],
            kernel=os.environ.get("SHOP_KERNEL"),
            schema=schema,
            journal_mode=os.environ.get("SHOP_JOURNAL_MODE", "wal"),
        )

    @property
    def database_url(self) -> str:
        return self.database if "://" in self.database else f"sqlite:///{self.database}"

    @property
    def scheduler_schema(self) -> str | None:
        """What the mounted scheduler revisions get as ``config.attributes["scheduler.schema"]``."""
        return self.schema if self.layout in ("attached", "postgresql") else None

    def engine(self) -> Engine:
        """The shop's engine: SQLite through ``scheduler.sqlite_engine`` (writers begin IMMEDIATE)."""
        if self.layout == "postgresql":
            return create_engine(self.database_url)
        attach = (
            {self.schema: self.kernel} if self.layout == "attached" and self.schema and self.kernel else None
        )
        return scheduler.sqlite_engine(
            self.database, attach=attach, journal_mode=self.journal_mode, busy_timeout_ms=30_000
        )

    def store_options(self) -> dict[str, Any]:
        """``open_store`` arguments for a worker process of this layout."""
        if self.layout == "dedicated":
            return {"target": self.kernel}
        if self.layout == "shared":
            return {"target": self.database, "exclusive": False}
        if self.layout == "attached":
            return {"target": self.kernel}  # a worker opens the scheduler's own file
        return {"target": self.database_url, "schema": self.schema}
