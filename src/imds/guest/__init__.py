"""``imds guest``: tools that run inside the instance, on the system python alone.

Everything under ``imds.guest`` imports the standard library only (a test checks every
import against ``sys.stdlib_module_names``), so the package can ship in an image without
imds's server dependencies: copy ``imds/__init__.py``, ``imds/tarball.py`` (the archive
rules, shared with the service; a stdlib-only leaf) and ``imds/guest/`` onto the image's
``sys.path``, or build one ``.pyz`` file with ``zipapp`` (see docs/guest.md).

Entry points: ``python3 -m imds.guest udev|ganeti install …`` and, where imds is
installed, ``imds guest …`` (the click command hands its arguments to the same argparse main).

Modules: ``sources`` (config drive, metadata URL) → ``devices`` (the ``devices`` document)
→ ``sysfs`` (what this machine has) → ``match`` → ``rules`` (udev text) → ``apply``
(atomic write, udevadm). ``testing`` builds fake sysfs/dev trees for tests.
``ganeti install``: ``ganeti`` (the steps, exit statuses) → ``ganeti_http`` (the service's
``/ganeti/latest`` paths, events) and ``ganeti_files`` (environment, the image), ``unpack``
(a package onto the target, all or nothing, under ``imds.tarball``'s rules).
"""
