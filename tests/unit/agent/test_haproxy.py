"""haproxy config rendering, checked by the real ``haproxy -c``."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess

import pytest

import haproxy_user
from imds import log
from imds.agent.haproxy import (
    LOG_FORMAT,
    LOG_LENGTH,
    SIGNING_KEY_ENV,
    Backend,
    Frontend,
    Process,
    Upstream,
    UpstreamTls,
    render,
    safe_token,
)
from imds.agent.haproxyctl import Haproxy
from imds.agent.requestlog import RequestLog
from imds.errors import ConfigError, HaproxyFailed
from imds.services.identity.tokens import FORWARDING_HEADERS, TOKEN_PATH_PATTERN

UPSTREAM = Upstream.parse("http://127.0.0.1:8000")
FRONT = Frontend(("240.0.0.1", "fd00:a9fe::1"))
VM_A = Backend("tap-a", ("240.0.0.2", "fd00:a9fe::2"), "uuid-a", "tenant-a")
VM_B = Backend("tap-b", ("240.0.0.3", "fd00:a9fe::3"), "uuid-b")
SECRET = b"a-long-shared-secret"


@pytest.fixture
def haproxy(tmp_path):
    binary = shutil.which("haproxy", path="/usr/sbin:/usr/bin:/sbin")
    if binary is None:
        pytest.fail("haproxy is not installed: scripts/test installs it")
    return Haproxy(binary, tmp_path, SECRET)


def test_rendered_config_passes_haproxy_check(haproxy):
    """The config for two VMs (IPv4 + IPv6 listeners, tenant or not) is valid to haproxy itself."""
    haproxy.check(render(FRONT, [VM_A, VM_B], UPSTREAM))


def test_each_vm_port_has_its_own_connection_counter():
    """A stick table keyed by the VM's acl (not its address); connections over the cap are rejected at accept."""
    text = render(Frontend(("240.0.0.1",), max_connections_per_source=7), [VM_B, VM_A], UPSTREAM)
    assert "    stick-table type string len 16 size 3 expire 60s store conn_cur\n" in text
    assert "    tcp-request connection track-sc0 str(vm0) if vm0\n" in text
    assert "    tcp-request connection track-sc0 str(vm1) if vm1\n" in text
    assert "    tcp-request connection track-sc0 str(unknown)\n" in text
    assert "    tcp-request connection reject if { sc0_conn_cur gt 7 }\n" in text
    assert text.index("track-sc0 str(unknown)") > text.index("track-sc0 str(vm1)")  # the first that applies wins


def test_each_vm_has_an_acl_on_its_meta_addresses_and_signed_headers():
    """One acl/use_backend per VM on its Meta IPs; its backend sets id, signature and tenant."""
    text = render(FRONT, [VM_B, VM_A], UPSTREAM)
    assert "    acl vm0 src 240.0.0.2 fd00:a9fe::2\n    acl vm1 src 240.0.0.3 fd00:a9fe::3\n" in text
    assert "    use_backend vm0 if vm0\n    use_backend vm1 if vm1\n" in text
    backend_a = text.split("backend vm0\n", 1)[1].split("\n\n", 1)[0]
    assert "http-request set-header X-Instance-ID uuid-a" in backend_a
    stamp = "    http-request set-var(txn.imds_ts) date\n"
    assert stamp + "    http-request set-header X-Instance-ID-Timestamp %[var(txn.imds_ts)]\n" in backend_a
    # The signed message is imds.signing.stamped_message: "<date>\n<id>\n<tenant>", the date taken once.
    signature = ("    http-request set-header X-Instance-ID-Signature "
                 '%[var(txn.imds_ts),concat("\\nuuid-a\\ntenant-a"),hmac(sha256,proc.imds_key),hex,lower]\n')
    assert signature in backend_a
    assert "http-request set-header X-Tenant-ID tenant-a" in backend_a
    assert "server imds 127.0.0.1:8000" in backend_a
    backend_b = text.split("backend vm1\n", 1)[1]
    assert "http-request del-header X-Tenant-ID" in backend_b
    assert 'concat("\\nuuid-b\\n"),hmac(sha256,proc.imds_key)' in backend_b
    assert "default_backend unknown" in text
    assert "http-request return status 404" in text


def test_each_backend_drops_every_forwarding_header_the_vm_sent():
    """X-Forwarded-For and the rest of the rule's list (and any X-Forwarded-*) never reach serve from a VM."""
    text = render(FRONT, [VM_A, VM_B], UPSTREAM)
    backends = text.split("\nbackend vm")[1:]
    assert len(backends) == 2
    for backend in backends:
        for name in FORWARDING_HEADERS:
            assert f"    http-request del-header {name}\n" in backend
        assert "    http-request del-header x-forwarded- -m beg\n" in backend


def test_a_token_put_carrying_a_forwarding_header_is_refused_in_the_vms_backend():
    """First in each VM's backend: PUT to serve's token path (decoded) with any listed header name → serve's 403."""
    text = render(FRONT, [VM_A], UPSTREAM)
    backend = text.split("backend vm0\n", 1)[1].split("\n\n", 1)[0]
    refuse = next(line for line in backend.splitlines() if "http-request return status 403" in line)
    assert refuse.startswith('    http-request return status 403 content-type "text/plain; charset=utf-8" '
                             'string "403 - Forbidden" if METH_PUT ')
    # \z, not $: a path ending in a (decoded) newline is not the token path, as on serve.
    assert f"{{ path,url_dec -m reg '^{TOKEN_PATH_PATTERN}\\z' }}" in refuse
    names = refuse.split("{ req.hdr_names -m reg -i (^|,)(", 1)[1].split(")(,|$) }", 1)[0]
    assert names.split("|") == [*FORWARDING_HEADERS, "x-forwarded-[^,]*"]
    # Before the VM's forwarding headers are dropped, after the vars the request log names it by.
    assert backend.index("set-var(txn.imds_id)") < backend.index(refuse) < backend.index("del-header x-forwarded-for")
    assert "http-request return status 403" not in text.split("frontend metadata\n", 1)[1].split("\n\n", 1)[0]


def test_rendering_is_deterministic_and_secret_free(haproxy, tmp_path):
    """Same VMs in any order give the same text; neither the secret nor its base64 is ever on disk."""
    text = render(FRONT, [VM_A, VM_B], UPSTREAM)
    assert text == render(FRONT, [VM_B, VM_A], UPSTREAM)
    assert f"    set-var proc.imds_key env({SIGNING_KEY_ENV})\n" in text.split("\ndefaults\n", 1)[0]
    haproxy.check(text)
    written = b"".join(path.read_bytes() for path in tmp_path.iterdir() if path.is_file())
    assert text.encode() in written
    for needle in (SECRET, base64.b64encode(SECRET)):
        assert needle not in written


def test_the_config_refuses_to_load_without_the_signing_key(haproxy, tmp_path):
    """Started by hand, without the agent's environment, haproxy stops instead of sending empty signatures."""
    config = tmp_path / "bare.cfg"
    config.write_text(render(FRONT, [VM_A], UPSTREAM))
    env = {key: value for key, value in os.environ.items() if key != SIGNING_KEY_ENV}
    bare = subprocess.run([haproxy.binary, "-c", "-f", str(config)], capture_output=True, text=True, env=env,
                          check=False, timeout=30)
    assert bare.returncode != 0
    assert f"{SIGNING_KEY_ENV} is not set" in bare.stdout + bare.stderr


def test_namespace_and_ipv6_upstream(haproxy):
    """Listeners can bind inside the metadata namespace; an IPv6 upstream is bracketed."""
    text = render(Frontend(("240.0.0.1",), namespace="meta"), [VM_A], Upstream.parse("http://[::1]:8000"))
    assert "bind 240.0.0.1:80 namespace meta" in text
    assert "server imds [::1]:8000" in text


def test_haproxy_refusal_is_reported(haproxy):
    """A config haproxy rejects raises HaproxyFailed with haproxy's message."""
    with pytest.raises(HaproxyFailed, match="refused"):
        haproxy.check("frontend x\n    bind 240.0.0.1:80\n    use_backend nowhere\n")


@pytest.mark.parametrize("url", ["ftp://x", "http://", "http://h:8000/path", "http://h:99999"])
def test_bad_upstream_urls(url):
    """--upstream must be an http(s) URL with a host, no path, a valid port."""
    with pytest.raises(ConfigError, match="--upstream"):
        Upstream.parse(url)


def test_tokens_that_could_break_the_config_are_refused():
    """Ids with spaces, quotes or newlines never reach the config."""
    assert safe_token("6f1b1a2e-0d4c-4c1e-9a7e-3d2f1b0c9a8e")
    for bad in ("a b", 'a"b', "a\nb", "", "-x", "a#b"):
        assert not safe_token(bad)


def test_a_change_watch_gets_the_watch_maximum_on_top_of_the_server_timeout(haproxy):
    """Ordinary requests keep ``timeout server``; any wait_for_change read gets --watch-max-timeout more."""
    text = render(Frontend(("240.0.0.1",), watch_max_timeout=120, server_timeout=30), [VM_A], UPSTREAM)
    assert "    timeout server 30s\n" in text
    assert "    http-request set-timeout server 150s if { url_param(wait_for_change) -m found }\n" in text
    haproxy.check(text)


def test_run_by_the_agent_haproxy_drops_to_its_user_chroots_and_logs_each_request(haproxy, tmp_path):
    """``Process``: user and group, an empty chroot, a log to the agent's descriptor; haproxy -c accepts it."""
    user = haproxy_user.ensure()
    root = tmp_path / "empty"
    root.mkdir()
    requests = RequestLog(log.get("test"))
    try:
        fd = requests.haproxy_end
        text = render(FRONT, [VM_A, VM_B], UPSTREAM, Process(user, str(root), fd))
        Haproxy(haproxy.binary, tmp_path, SECRET, log_fd=fd).check(text)
    finally:
        requests.stop()
    head = text.split("\ndefaults\n", 1)[0]
    for line in (f"    user {user}", f"    group {user}", f"    chroot {root}",
                 f"    log fd@{fd} len {LOG_LENGTH} format raw local0 info"):
        assert line + "\n" in head
    frontend = text.split("frontend metadata\n", 1)[1].split("\n\n", 1)[0]
    assert f"    log-format '{LOG_FORMAT}'\n" in frontend
    assert "    http-request set-var(txn.imds_path) path\n" in frontend  # the path: never the query string
    backend_a = text.split("backend vm0\n", 1)[1].split("\n\n", 1)[0]
    for name, value in (("imds_id", "uuid-a"), ("imds_tenant", "tenant-a"), ("imds_port", "tap-a")):
        assert f"    http-request set-var(txn.{name}) str({value})\n" in backend_a
    assert "set-var(txn.imds_tenant)" not in text.split("backend vm1\n", 1)[1]
    # Fields the agent reads back: the format names each one once.
    assert [name for name, _ in (pair.split(":", 1) for pair in LOG_FORMAT[1:-1].split(",") if ":" in pair)] == [
        '"port"', '"instance_id"', '"tenant"', '"source"', '"method"', '"path"', '"status"', '"bytes"',
        '"request_ms"', '"connect_ms"', '"response_ms"', '"total_ms"', '"termination"', '"tls_error"']


def test_without_a_process_nothing_is_logged_and_no_user_is_named():
    """A config run by hand or in a test (``process`` None) has no user, chroot or request log."""
    text = render(FRONT, [VM_A], UPSTREAM)
    for word in ("    user ", "    chroot ", "log-format", "    log "):
        assert word not in text


def test_a_host_key_signs_with_the_host_at_the_end_and_says_which_host():
    r"""With ``Frontend.host`` each backend sets X-Instance-Host and signs "<date>\n<id>\n<tenant>\n<host>"."""
    text = render(Frontend(("240.0.0.1",), host="compute-7"), [VM_A, VM_B], UPSTREAM)
    backend_a = text.split("backend vm0\n", 1)[1].split("\n\n", 1)[0]
    assert "    http-request set-header X-Instance-Host compute-7\n" in backend_a
    assert 'concat("\\nuuid-a\\ntenant-a\\ncompute-7"),hmac(sha256,proc.imds_key)' in backend_a
    assert 'concat("\\nuuid-b\\n\\ncompute-7")' in text.split("backend vm1\n", 1)[1]
    shared = render(FRONT, [VM_A], UPSTREAM)
    assert "    http-request del-header X-Instance-Host\n" in shared  # a VM cannot name a host either


@pytest.mark.parametrize(
    ("url", "tls", "server"),
    [
        ("https://imds.internal:8443", UpstreamTls(),
         ("server imds imds.internal:8443 ssl verify required ca-file @system-ca verifyhost imds.internal "
          "sni str(imds.internal)")),
        ("https://imds.internal", UpstreamTls(ca_file="/etc/imds/ca.pem", certificate="/etc/imds/client.pem"),
         ("server imds imds.internal:443 ssl verify required ca-file /etc/imds/ca.pem verifyhost imds.internal "
          "sni str(imds.internal) crt /etc/imds/client.pem")),
        ("https://imds.internal:8443", UpstreamTls(insecure=True),
         "server imds imds.internal:8443 ssl verify none sni str(imds.internal)"),
        ("https://10.0.0.2:8443", UpstreamTls(ca_file="/etc/imds/ca.pem"),
         "server imds 10.0.0.2:8443 ssl verify required ca-file /etc/imds/ca.pem"),
    ],
)
def test_an_https_upstream_is_verified_against_its_ca_and_name(url, tls, server):
    """The private CA (else the system's), the name haproxy verifies and sends as SNI, the client certificate."""
    parsed = Upstream.parse(url)
    upstream = Upstream(parsed.host, parsed.port, tls=True, verify=tls)
    assert f"    {server}\n" in render(FRONT, [VM_A], upstream) + "\n"
