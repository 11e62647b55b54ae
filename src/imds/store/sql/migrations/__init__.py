"""Alembic migrations (``imds db upgrade``)."""
