"""``ledger_entries.estimated_micro_usd``: the part of a row's cost priced from estimated tokens
(attempts whose backend reported no usage for a call its provider bills; docs/costs.md), so a
report can show how much of a tenant's cost rests on estimates.

A nullable column without a default: existing rows read ``NULL`` (nothing estimated, which is
what they booked) and nothing is rewritten (PostgreSQL: a catalog change; SQLite: ``ALTER TABLE
… ADD COLUMN``). Which attempts are estimated is in the ``attempts`` JSON (``"estimated":
true``), which needs no migration.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "ledger_entries",
        sa.Column(
            "estimated_micro_usd",
            sa.BigInteger(),
            nullable=True,
            comment="part of cost_micro_usd priced from estimated tokens; NULL: none estimated",
        ),
    )


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("estimated_micro_usd")
