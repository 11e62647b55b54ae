"""The in-memory catalog the instance path reads: entries, the address index, change watch, readiness."""
