"""Import and export: reading a source item by item, many upserts at once, reading records out."""
