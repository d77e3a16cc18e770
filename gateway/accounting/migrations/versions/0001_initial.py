"""The skeleton's ledger: ``ledger_entries`` and its two indexes.

Databases created before Alembic (by ``CREATE … IF NOT EXISTS``) are stamped at this revision.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("principal", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("requested_model", sa.String(), nullable=False),
        sa.Column("tier", sa.String()),
        sa.Column("deployment", sa.String()),
        sa.Column("rule", sa.String()),
        sa.Column("score", sa.Float()),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("app", sa.String()),
        sa.Column("tags", _JSON, nullable=False, comment="JSON array of strings"),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_micro_usd", sa.BigInteger()),
        sa.Column("baseline_micro_usd", sa.BigInteger()),
        sa.Column("price_known", sa.Boolean(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("ttft_ms", sa.Float()),
        sa.Column("queue_ms", sa.Float()),
        sa.Column(
            "attempts", _JSON, nullable=False, comment="JSON array of Attempt.to_dict() objects"
        ),
        sa.PrimaryKeyConstraint("request_id", name="pk_ledger_entries"),
    )
    op.create_index("ix_ledger_entries_created_at", "ledger_entries", ["created_at"])
    op.create_index(
        "ix_ledger_entries_tenant_created_at", "ledger_entries", ["tenant", "created_at"]
    )


def downgrade() -> None:
    op.drop_table("ledger_entries")
