"""``--route dhcp --dhcp-gone``: the DHCP port goes once the guest has its lease (the seed's upgrade case).

The guest was told (DHCP option 121) to reach 169.254.169.254 via the DHCP port's address. After
dnsmasq acknowledges the lease, the lab stops dnsmasq by PID and removes its port from br-int
and its namespace: nothing is left at that address. The agent was started with
``--metadata-next-hop`` for it, so its flows answer the guest's ARP; the rule's packet count is
the witness that they did (``answers``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from imds.errors import LabError
from imds.lab.datapath import DHCP_SERVER, Datapath
from imds.lab.run import sh, stop


@dataclass
class DhcpGone:
    """Retires the DHCP port of ``datapath`` once the lease is out; when it did, and what answered after."""

    datapath: Datapath
    started: float
    removed_after: float | None = None  # seconds from ``started`` (power-on)

    def poll(self) -> None:
        """Called while the guest boots: once dnsmasq logged DHCPACK, stop it and remove its port and namespace."""
        dp = self.datapath
        if self.removed_after is not None or dp.dnsmasq is None or dp.switch is None:
            return
        log = dp.out / "dnsmasq.log"
        if "DHCPACK" not in (log.read_text(errors="replace") if log.exists() else ""):
            return
        stop(dp.dnsmasq, timeout=10.0)
        names = dp.names
        dp.switch.vsctl("--if-exists", "del-port", names.bridge, names.dhcp_port)
        sh(*names.host.ip("link", "del", names.dhcp_port), check=False)
        sh("ip", "netns", "del", names.dhcp_netns, check=False)
        self.removed_after = round(time.time() - self.started, 1)

    def answers(self) -> int:
        """ARP requests for the DHCP port's address the agent's flows answered (the rule's ``n_packets``)."""
        switch = self.datapath.switch
        if switch is None:
            return 0
        try:
            text = switch.ofctl("dump-flows", self.datapath.names.bridge, f"arp,arp_tpa={DHCP_SERVER}")
        except LabError:
            return 0
        return sum(int(part.split("=", 1)[1].rstrip(",")) for part in text.split() if part.startswith("n_packets="))
