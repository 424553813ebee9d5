"""The PostgreSQL SQLSTATEs the store acts on (without importing psycopg, which a
SQLite-only install does not have)."""

from __future__ import annotations

__all__ = ["DEADLOCK_DETECTED", "SERIALIZATION_FAILURE", "STATEMENTS_LOST"]

SERIALIZATION_FAILURE = "40001"
"""The whole transaction can simply run again."""
DEADLOCK_DETECTED = "40P01"
"""The whole transaction can simply run again."""
STATEMENTS_LOST = "26000"
"""invalid_sql_statement_name: a statement `_pg_pipeline` holds prepared was not
(its cache is cleared, and the transaction can run again)."""
