"""placeholder replaced by the PostgreSQL fixture."""
