"""Added latency of each host datapath against direct access, same run: imds proxy, OVS + haproxy.

Starts a private userspace Open vSwitch (the test harness in ``tests/ovs_harness.py``) in a
network namespace of its own, which plays the host: ``imds serve --demo`` (in-memory, the demo
instance bound to 127.0.0.1) on its loopback, one VM network namespace plugged into the
integration bridge, and ``imds agent`` in front of the server. No other userspace switch on
the machine (a lab boot, a test) can get in the way. Then wrk loads the same document three
ways for the same duration and connection count:

- direct: from the host to ``imds serve`` on 127.0.0.1;
- via ``imds proxy --map``: from the host to the proxy on 127.0.0.2 (caller 127.0.0.1 mapped
  to the demo instance), which signs the id and forwards over its keep-alive pool;
- via OVS: from inside the VM to ``http://169.254.169.254/metadata`` (br-int rewrite, patch,
  br-meta, tap-meta, haproxy, and back through the learned rules).

The VM is plugged as the demo instance and haproxy signs that id; ``imds serve`` trusts
127.0.0.1 as a proxy with the same secret, so the VM is identified by the signed header
(signature checked on every request) and both paths answer with the same bytes (checked
first). Prints requests/s and latency percentiles with the via/direct ratios and writes them
to ``bench/results-datapath.md``. Run on demand (never in CI), as root::

    .venv/bin/python bench/datapath_ovs.py --duration 10 --connections 8 [--label TEXT] [--tls]

``--tls``: both host paths reach serve through a TLS front that requires client certificates
(``tests/tls_front.py``: the shipped ``deploy/tls/haproxy.cfg``), each with the private CA and
a client certificate (the direct path stays plain: it is the reference). ``--label`` names the
run in the results (e.g. which tree: ``PYTHONPATH=/tmp/base/src`` measures another one).

Every process is stopped by PID and every namespace/bridge removed; only the namespaces the
run made are targeted.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from benchlib import free_port, run_wrk

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from ovs_harness import AgentProcess, Ovs, Vm, ovs_daemons, vms, wait_for  # noqa: E402 - after the path above
from tls_front import Pki, tls_front  # noqa: E402

IMDS = Path(sys.executable).with_name("imds")
RESULTS = ROOT / "bench" / "results-datapath.md"
DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"  # src/imds/demo/metadata.json


def main() -> None:
    """Run the measurements and print/write the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--label", default="", help="Said in the results' heading (e.g. before/after, a commit).")
    parser.add_argument("--tls", action="store_true", help="The host paths reach serve through a mutual-TLS front.")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="imds-bench-"))
    secret = work / "secret"
    secret.write_bytes(b"bench-secret")
    try:
        # Everything in the switch's own namespace (its loopback is the "host"): no other userspace
        # switch on the machine can get in the way, and nothing touches the machine's own network.
        with ovs_daemons(work, own_netns=True) as ovs:
            netns = str(ovs.netns)
            inside = ("ip", "netns", "exec", netns)
            with _serving(inside, secret) as port:
                direct_url = f"http://127.0.0.1:{port}/metadata"
                direct = (direct_url, _get(inside, direct_url))
                with _upstream(work, port, netns, tls=args.tls) as upstream:
                    results = _measure(ovs, work, secret, upstream, direct, args=args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _report(results, args)


def _measure(  # noqa: PLR0913 - the run's parts, each made by main
    ovs: Ovs, work: Path, secret: Path, upstream: tuple[str, list[str]], direct: tuple[str, bytes], *,
    args: argparse.Namespace,
) -> dict[str, dict[str, float]]:
    """The three paths, loaded the same way; the VM's answer checked against the direct one first."""
    inside = ("ip", "netns", "exec", str(ovs.netns))
    url, tls_flags = upstream
    direct_url, direct_body = direct
    t = ovs.tag
    bridge = f"bi{t}"
    ovs.add_bridge(bridge)
    agent = AgentProcess(ovs, [
        "--ovsdb", f"unix:{ovs.db_sock}", "--integration-bridge", bridge, "--metadata-bridge", f"bm{t}",
        "--meta-port", f"tm{t}", "--upstream", url, *tls_flags,
        "--shared-secret-file", str(secret), "--state-dir", str(work / "state"),
    ], work / "agent.log")
    vm = Vm(ovs, bridge, f"vbench{t}", DEMO_ID, "02:00:00:00:be:01", "10.9.0.5/24")
    try:
        with vms(vm):
            agent.start()
            wait_for(lambda: vm.get("http://169.254.169.254/metadata", timeout=3)[0] == 200,
                     what="the VM served", timeout=60, explain=agent.output)
            status, body = vm.get("http://169.254.169.254/metadata")
            if (status, body.encode()) != (200, direct_body):
                sys.exit("the two paths answer different bytes; not comparable")
            results = {"direct (host → imds serve)": run_wrk(direct_url, args.duration, args.connections,
                                                              prefix=inside)}
            with _proxy(inside, url, secret, tls_flags, work) as proxy_url:
                results["via imds proxy --map (loopback)"] = run_wrk(proxy_url, args.duration, args.connections,
                                                                     prefix=inside)
            results["via OVS flows + haproxy (VM → 169.254.169.254)"] = run_wrk(
                "http://169.254.169.254/metadata", args.duration, args.connections,
                prefix=("ip", "netns", "exec", vm.name))
    finally:
        agent.stop()
    return results


@contextmanager
def _serving(inside: tuple[str, ...], secret: Path) -> Iterator[int]:
    """``imds serve --demo`` on the namespace's loopback, trusting 127.0.0.1 with ``secret``; its port."""
    port = free_port()
    serve = subprocess.Popen(
        [*inside, str(IMDS), "serve", "--demo", "--db", "memory://", "--listen", f"127.0.0.1:{port}",
         "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file", str(secret),
         "--rate-limit", "0", "--max-requests-per-source", "0"],  # wrk from one source: no 429s
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _get(inside, f"http://127.0.0.1:{port}/metadata", check=False), what="imds serve",
                 timeout=60)
        yield port
    finally:
        serve.terminate()
        serve.wait(timeout=10)


def _get(inside: tuple[str, ...], url: str, *, check: bool = True) -> bytes:
    """The body of a 200 GET from inside the namespace (b"" when ``check`` is off and it failed)."""
    done = subprocess.run([*inside, "curl", "-sf", "--max-time", "5", url], capture_output=True, check=False,
                          timeout=30)
    if done.returncode != 0 and check:
        sys.exit(f"GET {url} failed: {done.stderr.decode(errors='replace')}")
    return done.stdout if done.returncode == 0 else b""


@contextmanager
def _upstream(work: Path, port: int, netns: str, *, tls: bool) -> Iterator[tuple[str, list[str]]]:
    """(the URL the host paths use for serve, their TLS flags): serve itself, or a mutual-TLS front before it."""
    if not tls:
        yield f"http://127.0.0.1:{port}", []
        return
    pki = Pki(work / "pki", "bench")
    client = pki.issue("bench-host")
    with tls_front(work, pki.issue("localhost", server=True), pki.ca, f"http://127.0.0.1:{port}",
                   netns=netns) as front:
        yield front, ["--upstream-ca-file", str(pki.ca), "--upstream-cert-file", str(client.pem)]


@contextmanager
def _proxy(inside: tuple[str, ...], upstream: str, secret: Path, tls_flags: list[str], work: Path) -> Iterator[str]:
    """``imds proxy --map`` on 127.0.0.2 mapping the caller 127.0.0.1 to the demo instance."""
    mapping = work / "map"
    mapping.write_text(f"127.0.0.1 {DEMO_ID}\n")
    port = free_port()
    process = subprocess.Popen(
        [*inside, str(IMDS), "proxy", "--listen", f"127.0.0.2:{port}", "--upstream", upstream, *tls_flags,
         "--shared-secret-file", str(secret), "--map", str(mapping)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.2:{port}/metadata"
    try:
        wait_for(lambda: _get(inside, url, check=False), what="imds proxy", timeout=60)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def _report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    label = f" ({args.label})" if args.label else ""
    tls = ", host paths over mutual TLS" if args.tls else ""
    lines = [
        f"## {when}{label}: GET /metadata, wrk -t1 -c{args.connections} -d{args.duration}s{tls}",
        "",
        "| path | req/s | p50 ms | p99 ms | non-2xx |",
        "|---|---|---|---|---|",
    ]
    direct = next(iter(results.values()))
    for name, row in results.items():
        cells = f"{row['rps']:.0f} | {row['p50']:.2f} | {row['p99']:.2f} | {row['non2xx']:.0f}"
        lines.append(f"| {name} | {cells} |")
    lines.append("")
    for name, row in list(results.items())[1:]:
        lines.append(f"- {name} / direct: throughput {row['rps'] / direct['rps']:.2f}, p50 latency "
                     f"{row['p50'] / direct['p50']:.2f}x (+{row['p50'] - direct['p50']:.2f} ms)")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    previous = RESULTS.read_text() if RESULTS.exists() else "# Datapath benchmark results\n\n"
    RESULTS.write_text(previous + text + "\n")


if __name__ == "__main__":
    main()
