"""``ledger_entries.endpoint``: the API a request called (``chat``, ``completions``,
``responses``, ``embeddings``), so reports can tell embedding traffic, priced per input token,
from chat. Not null with a server default of ``chat``: every existing row was a chat request
(PostgreSQL: a catalog change, the default is not written into old rows; SQLite:
``ALTER TABLE … ADD COLUMN … DEFAULT``).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "ledger_entries",
        sa.Column(
            "endpoint",
            sa.String(),
            nullable=False,
            server_default="chat",
            comment="the API called: chat, completions, responses, embeddings",
        ),
    )


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("endpoint")
