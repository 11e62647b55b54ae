"""Package data for ``imds serve --demo``."""
