"""SQL storage: one schema for SQLite and PostgreSQL (SQLAlchemy 2 Core + Alembic)."""
