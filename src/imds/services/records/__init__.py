"""Instance records: the wire formats, the rules of a write, bulk import/export and the audit log."""
