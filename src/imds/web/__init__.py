"""HTTP only: parse, call one service, serialise. No business rules, no SQL."""
