"""``ledger_daily.estimated`` and ``ledger_daily.estimated_micro_usd``: per rollup group, the
requests booked in part from estimated usage and the part of their cost priced from the
estimates (the sums of ``ledger_entries.estimated_micro_usd``), as the cost report shows them.

Both ``NOT NULL DEFAULT 0``: adding them rewrites no row (PostgreSQL 11+ keeps the default in
the catalog; SQLite's ``ADD COLUMN``). A rollup made before this revision reads 0 until its day
is rolled up again: the rollup job redoes yesterday and today within 5 minutes, and
``tiergate ledger rollup --day D`` any earlier day; until then ``tiergate ledger verify`` lists
the groups of such a day that hold estimated rows as rollup differences.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "ledger_daily",
        sa.Column(
            "estimated",
            sa.BigInteger(),
            nullable=False,
            server_default="0",
            comment="requests booked in part from estimated usage",
        ),
    )
    op.add_column(
        "ledger_daily",
        sa.Column(
            "estimated_micro_usd",
            sa.BigInteger(),
            nullable=False,
            server_default="0",
            comment="part of cost_micro_usd priced from estimated tokens",
        ),
    )


def downgrade() -> None:
    with op.batch_alter_table("ledger_daily") as batch:
        batch.drop_column("estimated_micro_usd")
        batch.drop_column("estimated")
