"""Alembic environment: always handed a live connection by ``gateway.accounting.migrate``."""

from __future__ import annotations

from alembic import context

from gateway.accounting.migrate import VERSION_TABLE
from gateway.accounting.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
    transactional_ddl=True,
)
with context.begin_transaction():
    context.run_migrations()
