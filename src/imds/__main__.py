"""``python -m imds`` runs the command-line interface."""

from imds.cli import main

main()
