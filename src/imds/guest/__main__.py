"""``python3 -m imds.guest udev …``: the guest tools on the system python alone."""

from imds.guest.cli import main

raise SystemExit(main(prog="python3 -m imds.guest"))
