"""``imds serve``'s options: one row per setting (``OPTIONS``), grouped by concern.

The CLI builds ``imds serve``'s flags from this table; ``imds.config.settings`` holds the groups
(one frozen dataclass per ``group``, fields named as the rows) and ``imds.config.checks`` the
checks that need several options.
"""

from __future__ import annotations

from imds.config.option import Option, Rows, directories, flavors, listen, networks, redact_url, template

# Ganeti's OS search path (its configure default, constants.OS_SEARCH_PATH of Ganeti 3.0), in order
GANETI_OS_SEARCH_PATH = ("/srv/ganeti/os", "/usr/local/lib/ganeti/os", "/usr/lib/ganeti/os", "/usr/share/ganeti/os")

_http, _store, _callers, _templates = map(Rows, ("http", "store", "callers", "templates"))
_admin, _ec2, _lookup, _limits = map(Rows, ("admin", "ec2", "lookup", "limits"))
_logging, _ganeti, _channel, _gce = map(Rows, ("logging", "ganeti", "channel", "gce"))

OPTIONS: tuple[Option, ...] = (
    _http("listen", "list", ("127.0.0.1:8000", "[::1]:8000"),
        "HOST:PORT to listen on (repeatable; [v6]:PORT for IPv6; env: comma-separated; "
        "the default's [::1] is skipped on a host without IPv6 loopback).", parse=listen),
    _http("admin_listen", "list", (),
        "HOST:PORT for the admin API alone (repeatable; [v6]:PORT). When set, the --listen addresses "
        "serve instances only and answer admin paths 404.", parse=listen),
    _store("data_dir", "path", None,
        "Directory for the embedded database and generated keys "
        "(default: $XDG_DATA_HOME/imds or ~/.local/share/imds)."),
    _store("db", "str", None,
        "Database URL: sqlite:///PATH, postgresql://USER:PASS@HOST:PORT/DB (several servers: "
        "HOST1:PORT1,HOST2:PORT2 or ?host=H1,H2&port=P1,P2; imds uses the read-write one) or memory:// "
        "(default: an SQLite file in the data directory).", redact=redact_url),
    _store("migrate", "bool", True,  # noqa: FBT003 - a table row, not a call site
        "Apply database migrations at startup."),
    _callers("trusted_proxy", "list", (),
        "CIDR of a proxy whose X-Forwarded-For is believed (repeatable; default: none).",
        env="IMDS_TRUSTED_PROXIES", parse=networks),
    _callers("proxy_shared_secret_file", "path", None,
        "File holding the one secret every trusted proxy signs X-Instance-ID with (weaker than host keys: "
        "see --proxy-fleet-secret-file; unset: such signatures are refused)."),
    _callers("proxy_previous_secret_file", "path", None,
        "The previous proxy secret, still accepted during a rotation (remove it when every proxy has the new one)."),
    _callers("proxy_fleet_secret_file", "path", None,
        "File holding the fleet secret each host's signing key is derived from (imds host-key; a host-signed "
        "X-Instance-ID is refused without it)."),
    _callers("proxy_previous_fleet_secret_file", "path", None,
        "The previous fleet secret: host keys derived from it are still accepted during a rotation."),
    _callers("proxy_signature_window", "int", 30,
        "Seconds X-Instance-ID-Timestamp may be from this server's clock (an older, replayed signature is refused)."),
    _callers("accept_unstamped_signatures", "bool", False,  # noqa: FBT003 - a table row, not a call site
        "Also accept the legacy signature of the id alone, without X-Instance-ID-Timestamp (a Neutron-style proxy; "
        "replayable until the secret rotates, see docs/hypervisor.md)."),
    _templates("api_url", "str", None,
        "Template for the api_url field, e.g. https://{{.facility}}.example/{{.id}}.", parse=template),
    _templates("phone_home_url", "str", None, "Template for the phone_home_url field.", parse=template),
    _templates("user_state_url", "str", None, "Template for the user_state_url field.", parse=template),
    _admin("admin_token", "str", None,
        "Static bearer token with every admin scope (prefer the env var: flags show in ps).", secret=True),
    _admin("admin_tokens_file", "path", None, "JSON file of admin tokens with their scopes (see docs/admin-auth.md)."),
    _admin("oidc_issuer", "str", None, "OIDC issuer whose JWTs the admin API accepts."),
    _admin("oidc_jwks_url", "str", None, "JWKS URL (default: discovered from the issuer's openid-configuration)."),
    _admin("oidc_audience", "str", None, "Audience the JWTs must carry."),
    _admin("oidc_roles_claim", "str", "scope", "JWT claim holding the scopes (a list, or a space-separated string)."),
    _admin("oidc_username_claim", "str", "sub", "JWT claim logged as the subject of each admin write."),
    _ec2("imdsv2", "str", "optional", "EC2 IMDSv2 tokens: optional (tokenless GETs allowed) or required."),
    _ec2("token_hop_limit", "int", 0,
        "IP TTL / hop limit of every response on the listeners (AWS's PUT hop limit; 0: system default)."),
    _ec2("imdsv2_key_file", "path", None,
        "HMAC key for IMDSv2 tokens (default: imdsv2.key in the data directory; replicas must share it)."),
    _ec2("identity_key", "path", None,
        "RSA private key (PEM) signing EC2 identity documents (default: generated into the data directory)."),
    _ec2("identity_cert", "path", None, "Certificate (PEM) for --identity-key (default: self-signed)."),
    _lookup("lookup_url", "str", None,
        "Upstream source of truth (hollow's lookup contract); unknown callers are fetched from it."),
    _lookup("lookup_token", "str", None,
        "Static bearer token for the upstream (prefer the env var: flags show in ps).", secret=True),
    _lookup("lookup_oidc_issuer", "str", None,
        "OIDC issuer whose token endpoint grants upstream access tokens (client credentials)."),
    _lookup("lookup_client_id", "str", None, "OAuth2 client id for the upstream."),
    _lookup("lookup_client_secret", "str", None,
        "OAuth2 client secret for the upstream (prefer the env var: flags show in ps).", secret=True),
    _lookup("lookup_scope", "list", (),
        "OAuth2 scope to request (repeatable; env: comma-separated).", env="IMDS_LOOKUP_SCOPES"),
    _lookup("lookup_audience", "str", None, "OAuth2 audience to request."),
    _lookup("lookup_timeout", "float", 2.0, "Seconds one upstream call may take."),
    _lookup("lookup_negative_ttl", "float", 30.0, "Seconds an upstream 404 is remembered."),
    _lookup("lookup_refresh_after", "float", 0.0,
        "Refresh records fetched by lookup in the background after this many seconds (0: off)."),
    _lookup("lookup_cache_ttl", "float", 300.0,
        "Seconds a by-IP answer that does not list the asking address is reused."),
    _lookup("lookup_concurrency", "int", 16, "Most upstream calls in flight at once."),
    _lookup("lookup_breaker_failures", "int", 5, "Consecutive upstream failures that open the circuit breaker."),
    _lookup("lookup_breaker_reset", "float", 10.0,
        "Seconds the breaker first stays open (doubling on each reopening, jittered, at most 120)."),
    _limits("max_body_bytes", "int", 1024 * 1024, "Largest admin request body accepted, in bytes."),
    _limits("max_addresses", "int", 4096, "Most entries in one write's ipAddresses list."),
    _limits("max_document_depth", "int", 64, "Deepest nesting of objects and lists accepted in a metadata document."),
    _limits("max_document_keys", "int", 20000,
        "Most object keys (counted over every level) accepted in a metadata document."),
    _limits("strict_records", "bool", False,  # noqa: FBT003 - a table row, not a call site
        "Refuse what hollow accepts: host bits in a CIDR, a metadata id not the record id, no ipAddresses."),
    _limits("allow_wide_prefixes", "bool", False,  # noqa: FBT003 - a table row, not a call site
        "Accept instance addresses with a prefix shorter than /8 (IPv4) or /16 (IPv6), 0.0.0.0/0 and ::/0 "
        "included (each such write warns); off: refused."),
    _admin("metrics_public", "bool", False,  # noqa: FBT003 - a table row, not a call site
        "Serve /metrics without a token (hollow-compatible scraping); off: it needs a metrics or read scope."),
    _store("demo", "bool", False,  # noqa: FBT003 - a table row, not a call site
        "Load a demo instance bound to 127.0.0.1 and ::1 at startup (written only where the stored one differs)."),
    _logging.log_level_row(),
    _logging("log_instance_reads", "bool", False,  # noqa: FBT003 - a table row, not a call site
        "Log every instance read (off by default)."),
    _store("feed_poll_interval", "float", 1.0, "Seconds between polls of the change feed written by other replicas."),
    _store("render_cache_bytes", "int", 1 << 30,  # ~43 KB per instance crawled by cloud-init: ~24,000 instances
        "Approximate bytes of parsed documents and rendered replies kept for recently read instances."),
    _store("render_ahead", "bool", True,  # noqa: FBT003 - a table row, not a call site
        "Build each instance's first renderings (EC2 tree, signatures, ETag) and the answers to every path of its "
        "EC2 tree before its first read, while no request is being answered and the render cache is under half full."),
    _http("shutdown_timeout", "float", 10.0, "Seconds to let in-flight requests finish on shutdown."),
    # Ganeti OS installation (services/ganeti/records.py)
    _ganeti("private_key_file", "path", None,
        "Fernet keys (one per line; the first encrypts, all decrypt) encrypting private OS parameters at rest."),
    _ganeti("os_definitions_dir", "path", None,
        "Directory of Ganeti OS definitions (DIR/<os>/create, export, import, rename, verify, parameters.list, "
        "ganeti_api_version); when given, the only one, and a broken definition stops the start."),
    _ganeti("ganeti_os_search_path", "list", GANETI_OS_SEARCH_PATH,
        "Directory searched for Ganeti OS definitions when --os-definitions-dir is not given (repeatable, in order; "
        "env: comma-separated; default: Ganeti's search path). The first directory holding an OS name wins; missing "
        "directories and broken definitions are skipped with a warning, as a Ganeti node does.", parse=directories),
    _ganeti("os_param_max_bytes", "int", 4096, "Largest OS parameter value accepted, in bytes (UTF-8)."),
    _ganeti("os_package_max_bytes", "int", 64 * 1024 * 1024,
        "Largest personalization package fetched for /ganeti/.../os/package, in bytes (held in memory, "
        "never on disk)."),
    _ganeti("os_package_timeout", "float", 30.0, "Seconds a personalization package fetch may take."),
    _ganeti("ganeti_os_image_dir", "list", (),
        "Directory under which an os-image node path may be served as /ganeti/.../os/image (repeatable; "
        "env: comma-separated; default: none, node paths are refused).", parse=directories),
    _ganeti("ganeti_os_package_dir", "list", (),
        "Directory under which an os-package or os-install-package node path (Ganeti's, as ganeti-metad serves "
        "them) may be served as /ganeti/.../os/package and os/os-install-package (repeatable; env: comma-separated; "
        "default: none, os-package node paths are refused and os-install-package is the loaded OS definition).",
        parse=directories),
    _ganeti("os_image_max_bytes", "int", 16 << 30,
        "Largest OS image streamed for /ganeti/.../os/image, in bytes (never held whole); an image found larger "
        "mid-stream is cut by aborting the connection, never ended as a short 200."),
    _ganeti("fetch_allow", "list", (),
        "Network (CIDR) that a URL from a record (os-image, package.url) may reach although not public: loopback, "
        "private, link-local… (repeatable; env: comma-separated; default: none, public addresses only; the metadata "
        "addresses and this server's own listeners never).", parse=networks),
    _ganeti("ganeti_metad_socket", "path", None,
        "Unix socket taking ganeti-metad's place: Ganeti's node daemon pushes instances here (Luxi, mode 0600)."),
    # The instance<->host channel and change watch (README: "The instance↔host channel").
    _channel("event_rate", "float", 1.0,
        "Events (and phone-homes) an instance may post per second, on average, per replica."),
    _channel("event_burst", "int", 10, "Events an instance may post at once before --event-rate applies."),
    _channel("event_max_bytes", "int", 4096, "Largest event body an instance may post, in bytes."),
    _channel("event_retain", "int", 1000, "Events kept per instance; older ones are dropped."),
    _channel("message_max_bytes", "int", 65536, "Largest message the host may queue for an instance, in bytes."),
    _channel("message_max_queued", "int", 100, "Messages that may wait for one instance; one more is refused (409)."),
    _channel("watch_max_timeout", "int", 300,
        "Largest timeout_sec a wait_for_change request may ask for (and the default)."),
    # Anti-SSRF policy per flavor and database fault bounds (services/identity/instance_auth.py, store/sql/engine.py)
    _callers("instance_auth", "list", (),
        "Flavors whose paths need 'Metadata: true', a Metadata-Flavor header or an IMDSv2 token "
        "(json, openstack, nocloud, ganeti or all; repeatable; env: comma-separated; default: none).", parse=flavors),
    _store("db_connect_timeout", "float", 5.0,
        "Seconds to wait for a connection to one database server before answering 503 (each server of a "
        "--db list has its own; a connect_timeout in the URL replaces it)."),
    _store("db_statement_timeout", "float", 5.0,
        "Seconds one database statement (or SQLite's write lock) may take before answering 503."),
    # Server and listener limits (docs/server.md).
    _http("server", "str", "front",
        "HTTP server: front (imds's own on uvloop + httptools: reads without the ASGI hand-off, every limit "
        "below), granian, or uvicorn (no header read timeout)."),
    _http("workers", "int", 1, "Server processes sharing the listeners (each loads the catalog; not with memory://)."),
    _http("max_header_bytes", "int", 16384,
        "Largest request line plus headers, in bytes (larger: 431 or the connection is closed)."),
    _http("max_headers", "int", 100, "Most header lines in one request (more: 431)."),
    _http("header_timeout", "float", 10.0,
        "Seconds a connection may take to send a request's headers, idle keep-alive included."),
    _http("body_timeout", "float", 10.0, "Seconds the server waits for each part of a request body."),
    _http("keepalive_timeout", "float", 5.0,
        "Seconds an idle keep-alive connection is kept (front, uvicorn; granian closes it after --header-timeout)."),
    _http("max_connections", "int", 4096,
        "Most open connections per listener and worker; more wait in the kernel's backlog."),
    _http("max_connections_per_source", "int", 32,
        "Open connections one caller address may hold, all listeners and workers together; the excess is "
        "shut down within 0.1 s (0: off; trusted proxies are exempt; docs/server.md)."),
    _callers("rate_limit", "float", 50.0,
        "Instance requests per second per caller address (token bucket; 0: off; over: 429)."),
    _callers("rate_burst", "int", 200,
        "Instance requests a caller address may make at once before --rate-limit applies."),
    _callers("max_requests_per_source", "int", 32,
        "Instance requests one caller address may have in flight at once (0: off; over: 429)."),
    # GCE identity tokens (services/identity/idtoken.py)
    _gce("identity_issuer", "str", None,
        "iss of GCE identity tokens, and the base URL of their key set (default: the first --listen as a URL)."),
    _gce("identity_key_file", "path", None,
        "Private key (PEM; EC P-256 signs ES256, RSA RS256) signing GCE identity tokens "
        "(default: idtoken-key.pem generated into the data directory)."),
    _gce("identity_previous_key_file", "path", None,
        "The previous identity token key, still published in /.well-known/jwks.json during a rotation."),
)


SERVERS = ("front", "granian", "uvicorn")
MIN_HEADER_BYTES = 8192  # granian's (hyper's) smallest read buffer
IMDSV2_MODES = ("optional", "required")
