"""Revisions v1 .. v6 of the scheduler schema (Alembic version location; branch ``scheduler``)."""
