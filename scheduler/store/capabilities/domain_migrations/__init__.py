"""The domain migration journal (schema v4) and typed source locators (v5)."""

from __future__ import annotations

from scheduler.store.capabilities.domain_migrations.operations import DomainMigrationOperations

__all__ = ["DomainMigrationOperations"]
