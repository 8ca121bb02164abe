"""The shop's Alembic environment: a plain one, plus where the scheduler's tables live.

The scheduler-specific lines tell the mounted revisions their schema (API §8:
``config.attributes["scheduler.schema"]``; the shared-file layout needs none, ``main``) and keep
autogenerate from proposing to drop the scheduler's tables (``scheduler.alembic_filters``).
"""

from alembic import context
from shop.models import Base
from shop.settings import Settings

import scheduler

settings = Settings.from_environment()
config = context.config
if settings.scheduler_schema is not None:
    config.attributes.setdefault("scheduler.schema", settings.scheduler_schema)


def run_migrations_offline() -> None:
    context.configure(url=settings.database_url, target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = settings.engine()
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=Base.metadata,
                **scheduler.alembic_filters(connection, schema=settings.scheduler_schema),
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
