"""``ledger_dead_letters``: ledger events SQL refused (a NUL byte PostgreSQL cannot store, a
number out of range), set aside by the sink so that one bad event never stops the others from
being booked (``gateway.accounting.dead_letters``). A new table: nothing existing changes.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger_dead_letters",
        sa.Column(
            "stream_id", sa.String(), nullable=False, comment="the event's id in the ledger stream"
        ),
        sa.Column(
            "request_id", sa.String(), comment="the event's request id, when it could be read"
        ),
        sa.Column("tenant", sa.String(), comment="the event's tenant, when it could be read"),
        sa.Column("reason", sa.String(), nullable=False, comment="why it was set aside"),
        sa.Column(
            "event",
            sa.Text(),
            nullable=False,
            comment="the event as it was in the stream (JSON; characters SQL cannot store escaped)",
        ),
        sa.Column("set_aside_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("stream_id", name="pk_ledger_dead_letters"),
    )
    op.create_index("ix_ledger_dead_letters_set_aside_at", "ledger_dead_letters", ["set_aside_at"])


def downgrade() -> None:
    op.drop_index("ix_ledger_dead_letters_set_aside_at", table_name="ledger_dead_letters")
    op.drop_table("ledger_dead_letters")
