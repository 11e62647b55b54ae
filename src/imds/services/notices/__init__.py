"""Lifecycle notices the host sends to its guests: the rules of the record, its clock and its wire format."""
