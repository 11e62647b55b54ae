"""Instance records: the wire formats, the rules of a write and the audit log."""
