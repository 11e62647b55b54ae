"""Pull mode: records fetched from the upstream source of truth on a miss, behind a circuit breaker."""
