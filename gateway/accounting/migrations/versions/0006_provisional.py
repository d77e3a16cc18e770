"""``ledger_entries.provisional`` and ``superseded_at``: the edge's 504 for a job a worker had
started is booked provisional, and the entry its run writes later replaces the row's bookkeeping
(attempts, tokens, cost) once, keeping what the client was told (docs/costs.md, "A job run more
than once"); ``superseded_at`` says when, indexed where set so the rollups find the days whose
rows changed after they were rolled up.

``provisional`` is ``NOT NULL DEFAULT false``: existing rows read false (final, as they were
booked). On PostgreSQL (11 and later) a constant default is a catalog change, no table rewrite;
on SQLite ``ALTER TABLE … ADD COLUMN`` with a constant default rewrites nothing either.
``superseded_at`` is nullable without a default. The partial index is empty when it is built.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_INDEX = "ix_ledger_entries_superseded_at"
_WHERE = sa.text("superseded_at IS NOT NULL")


def upgrade() -> None:
    op.add_column(
        "ledger_entries",
        sa.Column(
            "provisional",
            sa.Boolean(),
            nullable=False,
            server_default=sa.false(),
            comment=(
                "the edge's 504 for a started job: a run's entry may still replace its bookkeeping"
            ),
        ),
    )
    op.add_column(
        "ledger_entries",
        sa.Column(
            "superseded_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="when a run's entry replaced this provisional row's bookkeeping",
        ),
    )
    op.create_index(
        _INDEX, "ledger_entries", ["superseded_at"], sqlite_where=_WHERE, postgresql_where=_WHERE
    )


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="ledger_entries")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("superseded_at")
        batch.drop_column("provisional")
