"""``imds lab``: real guests booted through the real datapath.

A Debian guest image built from Debian packages (``image``), a private userspace Open vSwitch
with the guest's tap plugged the way Nova/os-vif plugs a port, dnsmasq in a namespace on the
same VLAN, ``imds agent`` with its haproxy, an ``imds serve`` holding the guest's record
(``datapath``, ``server``), and QEMU with its serial console in a file (``qemu``). The console
is the witness (``console``); ``boot`` ties them together and writes ``result.json``.
Everything a run starts or creates is undone by PID or by the name it chose (``run.Cleanup``).
"""
