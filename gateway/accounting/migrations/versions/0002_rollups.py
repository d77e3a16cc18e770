"""Daily rollups (tenant x model x tier x tag) and the GPU true-up.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger_daily",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column(
            "deployment", sa.String(), nullable=False, comment="'' when no deployment answered"
        ),
        sa.Column("tier", sa.String(), nullable=False, comment="'' when the request had no tier"),
        sa.Column("tag", sa.String(), nullable=False, comment="'' for untagged requests"),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("baseline_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("savings_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("unknown_price", sa.BigInteger(), nullable=False),
        sa.Column("unknown_baseline", sa.BigInteger(), nullable=False),
        sa.Column("rolled_up_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "day", "tenant", "deployment", "tier", "tag", name="pk_ledger_daily"
        ),
    )
    op.create_table(
        "gpu_trueup",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("deployment", sa.String(), nullable=False),
        sa.Column(
            "tenant", sa.String(), nullable=False, comment="'' holds a day with no tokens (idle)"
        ),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("booked_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("allocated_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("pool_paid_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("paid_hours", sa.Float(), nullable=False),
        sa.Column("rolled_up_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("day", "deployment", "tenant", name="pk_gpu_trueup"),
    )


def downgrade() -> None:
    op.drop_table("gpu_trueup")
    op.drop_table("ledger_daily")
