"""imds: an instance metadata service for clouds and bare-metal fleets.

Importing this package has no side effects; ``imds.cli:main`` is the entry point.
"""

__version__ = "0.1.0"
