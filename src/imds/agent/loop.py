"""The agent: resync OVS and haproxy from OVSDB on start, on every change, and after switch restarts.

``Agent.resync`` is the whole job and is idempotent: read a snapshot, make sure the
metadata bridge, its patch ports and tap-meta exist, give every VM port its Meta addresses
(kept in ``other_config``), install both bridges' rules atomically when they changed, and
render haproxy's config (reloaded only when the text changed). ``Agent.run`` calls it when
``ovsdb-client monitor`` reports a change, and every ``check_interval`` counts the agent's
rules on both bridges: a restarted ovs-vswitchd has none, so they are put back (and
tap-meta moved back into its namespace).

haproxy runs unprivileged (``imds.agent.haproxyproc``: its workers as ``--haproxy-user``,
chrooted to an empty directory) and its request log comes back through
``imds.agent.requestlog`` into the agent's own log.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from imds import log
from imds.agent import flows
from imds.agent.allocate import Meta, Pool, allocate
from imds.agent.command import run
from imds.agent.haproxy import Backend, Frontend, render, safe_token
from imds.agent.haproxyctl import Haproxy
from imds.agent.haproxyproc import process_of, upstream_of
from imds.agent.metaport import MetaPort
from imds.agent.ovsdb import Ovsdb, Snapshot, VmPort
from imds.agent.requestlog import RequestLog
from imds.config import AgentSettings
from imds.errors import AgentError, OvsCommandFailed
from imds.signing import SigningKey

PATCH_INT = "imds-int-patch"  # on the integration bridge
PATCH_META = "imds-meta-patch"  # on the metadata bridge
WIRING_TIMEOUT = 20.0
DEBOUNCE = 0.05


@dataclass
class Served:
    """One VM port with its Meta addresses: what the rules and haproxy are rendered from."""

    port: VmPort
    meta: Meta


@dataclass
class _Applied:
    """What was last installed, so unchanged state is not re-applied."""

    flows: dict[str, str] = field(default_factory=dict)  # bridge → bundle text
    counts: dict[str, int] = field(default_factory=dict)  # bridge → number of rules
    ofports: set[int] = field(default_factory=set)  # VM ports with rules (their learned rules are ours)


class Agent:
    """One host's agent. ``resync()`` once, or ``run()`` until SIGTERM."""

    def __init__(self, settings: AgentSettings, key: SigningKey) -> None:
        self.settings = settings
        self.key = key
        self.pool = Pool.parse(settings.provider_cidr, settings.provider_cidr6, settings.provider_base_mac)
        self.ovsdb = Ovsdb(settings.ovsdb)
        self.log = log.get("agent")
        gw = self.pool.gateway
        inport = settings.mode == "inport"
        self.meta_port = MetaPort(
            settings.meta_port,
            settings.meta_netns,
            f"{gw.ip}/{self.pool.cidr.prefixlen}",
            None if inport else f"{gw.ip6}/{self.pool.cidr6.prefixlen}",
            (f"{flows.INPORT_BASE}/16",) if inport else (),
            table=settings.inport_route_table,
        )
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.upstream = upstream_of(settings)
        self.haproxy: Haproxy | None = None
        self.requests: RequestLog | None = None
        if not inport:
            self.requests = RequestLog(self.log, enabled=settings.log_level in ("debug", "info"))
            self.process = process_of(settings, self.requests.haproxy_end)
            self.haproxy = Haproxy(settings.haproxy_bin, Path(settings.state_dir), key.secret,
                                   log_fd=self.requests.haproxy_end)
        self.applied = _Applied()

    # -- the metadata bridge, patch ports and tap-meta -------------------------------------------

    def _wire(self, snap: Snapshot) -> Snapshot:
        """Create what is missing of br-meta, the patch pair and tap-meta; the snapshot once they have ofports."""
        s = self.settings
        if s.integration_bridge not in snap.bridges:
            raise AgentError(f"integration bridge {s.integration_bridge} does not exist (see --integration-bridge)")
        datapath = snap.bridges[s.integration_bridge][0]
        self.ovsdb.vsctl(
            "--may-exist", "add-br", s.metadata_bridge, "--", "set", "Bridge", s.metadata_bridge,
            f"datapath_type={datapath}" if datapath else "datapath_type=system", "fail_mode=secure",
            "--", "--may-exist", "add-port", s.integration_bridge, PATCH_INT,
            "--", "set", "Interface", PATCH_INT, "type=patch", f"options:peer={PATCH_META}",
            "--", "--may-exist", "add-port", s.metadata_bridge, PATCH_META,
            "--", "set", "Interface", PATCH_META, "type=patch", f"options:peer={PATCH_INT}",
            "--", "--may-exist", "add-port", s.metadata_bridge, s.meta_port,
            "--", "set", "Interface", s.meta_port, "type=internal", f'mac="{self.pool.gateway.mac}"',
        )
        deadline = time.monotonic() + WIRING_TIMEOUT
        while True:
            snap = self.ovsdb.snapshot()
            ofports = [snap.interfaces[n].ofport if n in snap.interfaces else -1 for n in self._own_ports()]
            if min(ofports) > 0 and (self.meta_port.present() or _exists_root(s.meta_port)):
                return snap
            if time.monotonic() > deadline:
                raise AgentError(f"ovs-vswitchd gave {', '.join(self._own_ports())} no port numbers (is it running?)")
            time.sleep(0.1)

    def _own_ports(self) -> tuple[str, str, str]:
        return (PATCH_INT, PATCH_META, self.settings.meta_port)

    def _wired(self, snap: Snapshot) -> bool:
        return self.settings.metadata_bridge in snap.bridges and all(
            n in snap.interfaces and snap.interfaces[n].ofport > 0 for n in self._own_ports()
        )

    # -- one full pass -----------------------------------------------------------------------------

    def resync(self, *, force: bool = False) -> list[Served]:
        """Bring OVS and haproxy in line with OVSDB; ``force`` re-places tap-meta and re-installs every rule."""
        snap = self.ovsdb.snapshot()
        if force or not self._wired(snap):
            snap = self._wire(snap)
            self.meta_port.ensure()
        served = self._allocate(snap)
        wiring = flows.Wiring(
            int_patch=snap.interfaces[PATCH_INT].ofport,
            meta_patch=snap.interfaces[PATCH_META].ofport,
            tap=snap.interfaces[self.settings.meta_port].ofport,
            vlan=self.settings.provider_vlan_id,
            gateway=self.pool.gateway,
            mode="inport" if self.settings.mode == "inport" else "haproxy",
            next_hops=self.settings.metadata_next_hop,
        )
        ports = [flows.PortFlows(s.port.ofport, s.port.mac, s.meta) for s in served]
        self._install(self.settings.integration_bridge, flows.integration_flows(wiring, ports), force=force)
        self._install(self.settings.metadata_bridge, flows.metadata_flows(wiring, ports), force=force)
        self._forget({s.port.ofport for s in served})
        if self.haproxy is not None:
            self._render_haproxy(served)
        return served

    def _allocate(self, snap: Snapshot) -> list[Served]:
        """Meta addresses for every VM port; new or changed ones are written back to ``other_config``."""
        ports = {p.name: p for p in snap.vm_ports(self.settings.integration_bridge)}
        stored = {name: self.pool.offset_of(p.other_config.get("provider_ip")) for name, p in ports.items()}
        served: list[Served] = []
        writes: list[str] = []
        for name, outcome in allocate(self.pool, stored).items():
            port = ports[name]
            if isinstance(outcome, AgentError):
                self.log.error("agent.pool_exhausted", port=name, vm_uuid=port.vm_uuid, error=outcome.message)
                continue
            wanted = {"provider_ip": str(outcome.ip), "provider_mac": outcome.mac, "provider_ip6": str(outcome.ip6)}
            if any(port.other_config.get(k) != v for k, v in wanted.items()):
                writes += ["--", "set", "Interface", name, *(f"other_config:{k}={v}" for k, v in wanted.items())]
                self.log.info("agent.allocated", port=name, vm_uuid=port.vm_uuid, tag=port.tag, **wanted)
            served.append(Served(port, outcome))
        if writes:
            self.ovsdb.vsctl(*writes[1:])
        return served

    def _install(self, bridge: str, rules: list[str], *, force: bool) -> None:
        """Replace the agent's rules on ``bridge`` in one atomic bundle, unless nothing changed."""
        text = flows.bundle(rules)
        if not force and self.applied.flows.get(bridge) == text:
            return
        run("ovs-ofctl", "--bundle", "add-flows", self._switch(bridge), "-", stdin=text)
        self.applied.flows[bridge] = text
        self.applied.counts[bridge] = len(rules)
        self.log.info("agent.flows_installed", bridge=bridge, rules=len(rules))

    def _switch(self, bridge: str) -> str:
        """What ovs-ofctl connects to: the bridge's management socket, else the bridge name.

        The socket beside the OVSDB socket is used when there is one, so an OVS run from another
        directory than ``OVS_RUNDIR`` (a test, a container) is reached without that variable.
        """
        remote = self.settings.ovsdb
        if remote.startswith("unix:"):
            mgmt = Path(remote.removeprefix("unix:")).parent / f"{bridge}.mgmt"
            if mgmt.exists():
                return f"unix:{mgmt}"
        return bridge

    def _forget(self, ofports: set[int]) -> None:
        """Drop what was learned for ports that are gone (their static rules went with the bundle)."""
        for ofport in sorted(self.applied.ofports - ofports):
            run("ovs-ofctl", "del-flows", self._switch(self.settings.integration_bridge), flows.forget_port(ofport))
        self.applied.ofports = ofports

    def _render_haproxy(self, served: list[Served]) -> None:
        assert self.haproxy is not None  # noqa: S101 - only called in haproxy mode
        backends = []
        for item in served:
            port = item.port
            tenant = port.tenant if port.tenant and safe_token(port.tenant) else None
            if not safe_token(port.vm_uuid):
                self.log.error("agent.bad_vm_uuid", port=port.name, reason="characters haproxy cannot carry")
                continue
            backends.append(Backend(port.name, (str(item.meta.ip), str(item.meta.ip6)), port.vm_uuid, tenant))
        gw = self.pool.gateway
        frontend = Frontend((str(gw.ip), str(gw.ip6)), namespace=self.settings.meta_netns,
                            max_connections_per_source=self.settings.max_connections_per_source,
                            watch_max_timeout=self.settings.watch_max_timeout, host=self.key.host)
        if self.haproxy.apply(render(frontend, backends, self.upstream, self.process)):
            self.log.info("agent.haproxy_applied", backends=len(backends))

    # -- watching ----------------------------------------------------------------------------------

    def flows_intact(self) -> bool:
        """Whether both bridges still hold as many agent rules as were installed."""
        for bridge, expected in self.applied.counts.items():
            ours = f"cookie={flows.COOKIE:#x}/{flows.COOKIE_MASK:#x}"
            text = run("ovs-ofctl", "--no-stats", "dump-flows", self._switch(bridge), ours)
            found = sum(1 for line in text.splitlines() if "cookie=" in line)
            if found != expected:
                self.log.warning("agent.flows_missing", bridge=bridge, expected=expected, found=found)
                return False
        return True

    def run(self) -> None:
        """Resync on start, on each OVSDB change, and whenever the rules have gone; until interrupted."""
        monitor: subprocess.Popen[bytes] | None = None
        selector = selectors.DefaultSelector()
        next_check = 0.0
        dirty, force = True, True
        if self.requests is not None:
            self.requests.start()
        try:
            while True:
                if monitor is None or monitor.poll() is not None:
                    monitor = self._start_monitor(selector, monitor)
                    dirty = True
                if dirty or force:
                    dirty, force = self._attempt(force=force)
                timeout = max(0.0, next_check - time.monotonic())
                if any(selector.select(timeout)):
                    read, ended = _drain(selector)
                    dirty = dirty or read
                    if ended:
                        monitor.wait(timeout=10)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + self.settings.check_interval
                    force = force or not self._check()
        finally:
            self._shutdown(monitor)

    def _shutdown(self, monitor: subprocess.Popen[bytes] | None) -> None:
        """Stop what ``run`` started: the monitor, haproxy, the request log; in-port mode's routing."""
        if monitor is not None:
            monitor.terminate()
            monitor.wait(timeout=10)
        if self.haproxy is not None:
            self.haproxy.stop()
        if self.requests is not None:
            self.requests.stop()
        self.meta_port.teardown()  # in-port mode's rules and table: nothing of ours stays in the routing

    def _attempt(self, *, force: bool) -> tuple[bool, bool]:
        """One resync; on failure log it and keep (dirty, force) so the next tick retries."""
        try:
            served = self.resync(force=force)
        except AgentError as exc:
            self.log.error("agent.resync_failed", error=exc.message)  # noqa: TRY400 - expected, no traceback
            time.sleep(min(1.0, self.settings.check_interval))
            return True, force
        self.log.debug("agent.resynced", ports=len(served))
        return False, False

    def _check(self) -> bool:
        """Whether everything is still in place: haproxy running, both bridges' rules present."""
        if self.haproxy is not None and self.haproxy.current is not None and not self.haproxy.running:
            self.log.warning("agent.haproxy_died", log=self.haproxy.tail())
            return False
        try:
            return self.flows_intact()
        except OvsCommandFailed as exc:
            self.log.warning("agent.switch_unreachable", error=exc.message)
            return False

    def _start_monitor(
        self, selector: selectors.BaseSelector, old: subprocess.Popen[bytes] | None
    ) -> subprocess.Popen[bytes]:
        if old is not None:
            selector.unregister(old.stdout)  # type: ignore[arg-type]
            self.log.warning("agent.monitor_restarted", exit=old.returncode)
            time.sleep(0.5)
        monitor = self.ovsdb.monitor()
        selector.register(monitor.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        return monitor


def _drain(selector: selectors.BaseSelector) -> tuple[bool, bool]:
    """Read whatever the monitor printed (changes arrive in bursts): (something read, monitor ended)."""
    read = False
    while events := selector.select(DEBOUNCE):
        for key, _ in events:
            if not os.read(key.fd, 65536):  # end of file: the monitor exited; run() restarts it
                return read, True
            read = True
    return read, False


def _exists_root(name: str) -> bool:
    try:
        run("ip", "link", "show", "dev", name)
    except OvsCommandFailed:
        return False
    return True
