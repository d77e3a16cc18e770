"""Alembic migrations of the ledger's tables (run at connect by ``gateway.accounting.migrate``)."""
