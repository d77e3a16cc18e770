"""``ledger_entries.cost_nano_usd``, ``baseline_nano_usd`` and ``price_source``, and the
``budget_alerts`` table (one row per budget, window and threshold crossed: the webhook fired
once, its status recorded; nothing existing changes). A row's cost
kept to the nano-dollar (a 13-token request on a $0.03/Mtok model costs $0.00000039, which
micro-dollars round to 0) and where its prices came from (config, the litellm map's version, a
GPU rate's id and window), so every row can be audited.

Nullable columns without a default: existing rows read ``NULL``, which means their cost is
``cost_micro_usd`` x 1000 exactly (what they booked) and their source was not recorded; nothing
is rewritten (PostgreSQL: a catalog change; SQLite: ``ALTER TABLE … ADD COLUMN``).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "ledger_entries",
        sa.Column(
            "cost_nano_usd",
            sa.BigInteger(),
            nullable=True,
            comment="NULL before 0008: cost_micro_usd x 1000",
        ),
    )
    op.add_column(
        "ledger_entries",
        sa.Column(
            "baseline_nano_usd",
            sa.BigInteger(),
            nullable=True,
            comment="NULL before 0008: baseline_micro_usd x 1000",
        ),
    )
    op.add_column(
        "ledger_entries",
        sa.Column(
            "price_source",
            sa.String(),
            nullable=True,
            comment="where the prices came from; NULL before 0008",
        ),
    )

    op.create_table(
        "budget_alerts",
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("budget", sa.String(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "threshold", sa.Float(), nullable=False, comment="fraction of the limit (alert_at)"
        ),
        sa.Column("spent_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("limit_micro_usd", sa.BigInteger(), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "status", sa.String(), nullable=False, comment="sending, sent, failed or no webhook"
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.String(), comment="the last attempt's error, when it failed"),
        sa.PrimaryKeyConstraint(
            "tenant", "budget", "window_start", "threshold", name="pk_budget_alerts"
        ),
    )


def downgrade() -> None:
    op.drop_table("budget_alerts")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("price_source")
        batch.drop_column("baseline_nano_usd")
        batch.drop_column("cost_nano_usd")
