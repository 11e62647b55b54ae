"""Ganeti OS installation: OS records, definitions, the package, private and secret parameters."""
