"""``ledger_entries.idempotency_key``: the client's key on the row of the request that ran under
it, so that a repeat is recognised from SQL after Redis lost the key; indexed with the tenant
where set (a partial index: most rows have no key).

Adding a nullable column changes no existing row (PostgreSQL: no table rewrite; SQLite: ``ALTER
TABLE … ADD COLUMN``). Building the index reads the whole table once, on PostgreSQL while
holding writes back; the sink's events wait in the Redis stream meanwhile.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_INDEX = "ix_ledger_entries_tenant_idempotency_key"
_WHERE = sa.text("idempotency_key IS NOT NULL")


def upgrade() -> None:
    op.add_column(
        "ledger_entries",
        sa.Column(
            "idempotency_key",
            sa.String(),
            nullable=True,
            comment="the client's idempotency-key, on the row of the request that ran under it",
        ),
    )
    op.create_index(
        _INDEX,
        "ledger_entries",
        ["tenant", "idempotency_key"],
        sqlite_where=_WHERE,
        postgresql_where=_WHERE,
    )


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="ledger_entries")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("idempotency_key")
