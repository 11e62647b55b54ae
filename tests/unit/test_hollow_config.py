"""hollow-metadataservice's configuration names work unchanged: through ``imds config show`` and ``imds serve``.

A hollow deployment's environment (its docker-compose quickstart files, plus the lookup and
template settings its README documents) resolves to the imds settings of the same meaning;
imds's own names win; a value imds cannot honour exits 2 naming the imds equivalent.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from imds.cli import cli
from imds.config import ALIASED, HOLLOW, SERVE, hollow_table, load
from imds.config.hollow import go_duration
from imds.errors import ConfigError

DOCS = Path(__file__).parents[2] / "docs" / "hollow.md"

# hollow's quickstart.yml + quickstart-auth.yml (its docker-compose files), with lookup and templates.
# Its CockroachDB (METADATASERVICE_CRDB_URI) is refused (test_cockroachdb_settings_are_refused): imds gets IMDS_DB.
DEPLOYMENT = {
    "IMDS_DB": "postgresql://imds:pw@db.example:5432/imds?sslmode=disable",
    "METADATASERVICE_OIDC_ENABLED": "true",
    "METADATASERVICE_OIDC_AUDIENCE": "http://127.0.0.1:8000",
    "METADATASERVICE_OIDC_ISSUER": "http://hydra:4444/",
    "METADATASERVICE_OIDC_JWKSURI": "http://hydra:4444/.well-known/jwks.json",
    "METADATASERVICE_OIDC_CLAIMS_ROLES": "scp",
    "METADATASERVICE_LISTEN": "0.0.0.0:8000",
    "METADATASERVICE_LOOKUP_ENABLED": "true",
    "METADATASERVICE_LOOKUP_SERVICE_URL": "https://lookup.example/api/v1/",
    "METADATASERVICE_LOOKUP_OIDC_ISSUER": "https://auth.example/",
    "METADATASERVICE_LOOKUP_OIDC_CLIENTID": "metadataservice",
    "METADATASERVICE_LOOKUP_OIDC_CLIENTSECRET": "s3cret",
    "METADATASERVICE_LOOKUP_OIDC_AUDIENCE": "https://lookup.example",
    "METADATASERVICE_GIN_TRUSTEDPROXIES": "10.0.0.1,10.1.0.0/16",
    "METADATASERVICE_METADATA_PHONE_HOME_URL": "https://{{.facility}}.example/phone-home",
    "METADATASERVICE_SHUTDOWN_GRACE_PERIOD": "1m30s",
    "METADATASERVICE_LOGGING_DEBUG": "true",
    "METADATASERVICE_LOGGING_PRETTY": "true",
    "METADATASERVICE_CRDB_CONNECTIONS_MAX_OPEN": "50",
    "METADATASERVICE_TRACING_PROVIDER": "jaeger",
}


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CliRunner:
    """A runner whose environment holds no IMDS_* or METADATASERVICE_* variable of the machine's."""
    for name in list(os.environ):
        if name.startswith(("IMDS_", "METADATASERVICE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    return CliRunner()


def show(runner: CliRunner, env: dict[str, str], *args: str) -> dict[str, tuple[str, str]]:
    """``imds config show -o json``: option name to (value, source); fails the test if it did not exit 0."""
    result = runner.invoke(cli, ["config", "show", "-o", "json", *args], env=env)
    assert result.exit_code == 0, result.output
    return {row["name"]: (row["value"], row["source"]) for row in json.loads(result.output)}


def refused(result: Result, *named: str) -> None:
    """The command exited 2 with a message naming each of ``named``."""
    assert result.exit_code == 2, result.output
    for text in named:
        assert text in result.output


def test_docs_table_is_the_modules():
    """docs/hollow.md's table is exactly hollow_table(): every hollow name, its fate and imds name."""
    text = DOCS.read_text()
    start = text.index("| hollow flag | viper key |")
    end = text.find("\n\n", start)
    assert text[start : end if end != -1 else None].rstrip("\n") == hollow_table()
    assert len(hollow_table().splitlines()) == len(HOLLOW) + 2


def test_every_name_has_one_row_and_a_known_fate():
    """One row per viper key; every honour row names an imds option; the hollow names the brief cites are there."""
    keys = [name.key for name in HOLLOW]
    assert len(keys) == len(set(keys))
    options = {option.name for option in SERVE.table}
    assert all(name.fate in {"honour", "ignore", "refuse"} for name in HOLLOW)
    assert all(name.imds in options | {"config"} for name in HOLLOW)
    envs = {name.env for name in HOLLOW}
    assert {"METADATASERVICE_LOOKUP_ENABLED", "METADATASERVICE_LOOKUP_SERVICE_URL", "METADATASERVICE_LOOKUP_BASEURL",
            "METADATASERVICE_CRDB_URI", "METADATASERVICE_TRACING_ENABLED", "METADATASERVICE_LOGGING_DEBUG"} <= envs


def test_deployment_environment_resolves_to_imds_settings(runner: CliRunner):
    """A hollow deployment's variables give the imds settings of the same meaning, from the source ``hollow``."""
    rows = show(runner, DEPLOYMENT)
    assert rows["db"] == ("postgresql://imds:***@db.example:5432/imds?sslmode=disable", "env")
    expected = {
        "oidc_audience": "http://127.0.0.1:8000",
        "oidc_issuer": "http://hydra:4444/",
        "oidc_jwks_url": "http://hydra:4444/.well-known/jwks.json",
        "oidc_roles_claim": "scp",
        "listen": "0.0.0.0:8000",
        "lookup_url": "https://lookup.example/api/v1/",
        "lookup_oidc_issuer": "https://auth.example/",
        "lookup_client_id": "metadataservice",
        "lookup_client_secret": "********",
        "lookup_audience": "https://lookup.example",
        "lookup_scope": "metadata:read:metadata,metadata:read:userdata",
        "trusted_proxy": "10.0.0.1,10.1.0.0/16",
        "phone_home_url": "https://{{.facility}}.example/phone-home",
        "shutdown_timeout": "90.0",
        "log_level": "debug",
    }
    assert {name: rows[name] for name in expected} == {name: (value, "hollow") for name, value in expected.items()}
    settings = load(environ=DEPLOYMENT)
    assert settings.lookup.lookup_client_secret == "s3cret"
    assert settings.store.db == DEPLOYMENT["IMDS_DB"]
    assert [str(net) for net in settings.callers.trusted_proxy] == ["10.0.0.1/32", "10.1.0.0/16"]
    assert settings.http.listen == (("0.0.0.0", 8000),)  # noqa: S104 - hollow's default address, not a bind


def test_ignored_names_are_noted():
    """Ignored names (log format, pool size, tracing details) come back as notes naming them."""
    notes = SERVE.aliases_of({}, DEPLOYMENT).notes
    for var in ("METADATASERVICE_LOGGING_PRETTY", "METADATASERVICE_CRDB_CONNECTIONS_MAX_OPEN",
                "METADATASERVICE_TRACING_PROVIDER"):
        assert any(var in note for note in notes), notes


def test_imds_names_beat_hollow_names(runner: CliRunner, tmp_path: Path):
    """IMDS_* beats METADATASERVICE_*, which beats the config file; an imds flag beats a hollow flag."""
    config = tmp_path / "imds.toml"
    config.write_text('oidc_issuer = "https://file.example/"\nlookup_client_id = "from-file"\n')
    env = {**DEPLOYMENT, "IMDS_LOOKUP_URL": "https://imds.example/", "IMDS_LOG_LEVEL": "warning",
           "IMDS_CONFIG": str(config)}
    rows = show(runner, env)
    assert rows["lookup_url"] == ("https://imds.example/", "env")
    assert rows["log_level"] == ("warning", "env")
    assert rows["oidc_issuer"] == ("http://hydra:4444/", "hollow")
    assert rows["lookup_client_id"] == ("metadataservice", "hollow")
    rows = show(runner, {}, "--lookup-url", "https://flag.example/", "--lookup-enabled",
                "--lookup-service-url", "https://hollow.example/")
    assert rows["lookup_url"] == ("https://flag.example/", "flag")


def test_hollow_flags_parse(runner: CliRunner):
    """The hollow flag spellings are accepted (pflag style) and land on the imds options."""
    rows = show(runner, {"METADATASERVICE_LOOKUP_SERVICE_URL": "https://env.example/"},
                "--lookup-enabled", "--oidc-aud", "aud", "--oidc-jwksuri", "https://jwks/",
                "--gin-trusted-proxies", "10.0.0.1,10.0.0.2", "--gin-trusted-proxies", "10.0.0.3",
                "--shutdown-grace-period", "250ms", "--lookup-oidc-scopes", "a,b", "--db-enabled=true",
                "--debug", "--pretty", "--db", "postgres://u:pw@h/db")
    assert rows["lookup_url"] == ("https://env.example/", "hollow")  # the URL is the variable's
    assert rows["oidc_audience"] == ("aud", "flag")
    assert rows["oidc_jwks_url"] == ("https://jwks/", "flag")
    assert rows["trusted_proxy"] == ("10.0.0.1,10.0.0.2,10.0.0.3", "flag")
    assert rows["shutdown_timeout"] == ("0.25", "flag")
    assert rows["lookup_scope"] == ("a,b", "flag")
    assert rows["log_level"] == ("debug", "flag")
    assert rows["db"] == ("postgresql://u:***@h/db", "flag")  # as imds serve uses it (libpq's alias resolved)
    shown = runner.invoke(cli, ["serve", "--help"]).output
    assert "--lookup-url" in shown
    assert [name.flag for name in ALIASED if re.search(rf"{re.escape(name.flag or '')}(?![-\w])", shown)] == []


@pytest.mark.parametrize(("args", "env", "named"), [
    (["--db-enabled=false"], {}, ("--db-enabled / METADATASERVICE_CRDB_ENABLED", "--db memory://")),
    ([], {"METADATASERVICE_CRDB_ENABLED": "false"}, ("METADATASERVICE_CRDB_ENABLED", "IMDS_DB=memory://")),
    ([], {"METADATASERVICE_TRACING_ENABLED": "true"}, ("METADATASERVICE_TRACING_ENABLED", "/metrics")),
    (["--tracing"], {}, ("--tracing", "OpenTelemetry")),
    ([], {"METADATASERVICE_OIDC_ENABLED": "false"}, ("METADATASERVICE_OIDC_ENABLED", "IMDS_ADMIN_TOKEN")),
    (["--lookup-enabled=true"], {}, ("--lookup-enabled", "METADATASERVICE_LOOKUP_SERVICE_URL", "--lookup-url")),
    (["--config", "hollow.yml"], {}, ("hollow's YAML", "TOML")),
    ([], {"METADATASERVICE_SHUTDOWN_GRACE_PERIOD": "soon"}, ("METADATASERVICE_SHUTDOWN_GRACE_PERIOD", "Go duration")),
])
def test_refused_values_exit_2_naming_the_imds_equivalent(
    runner: CliRunner, args: list[str], env: dict[str, str], named: tuple[str, ...],
):
    """Both ``imds serve`` and ``imds config show`` refuse, before serving anything."""
    refused(runner.invoke(cli, ["serve", *args], env=env), *named)
    refused(runner.invoke(cli, ["config", "show", *args], env=env), *named)


def test_oidc_off_with_an_imds_admin_credential_starts(runner: CliRunner):
    """The hollow quickstart (no admin auth) resolves once imds has an admin token of its own."""
    env = {"METADATASERVICE_OIDC_ENABLED": "false", "IMDS_ADMIN_TOKEN": "t",
           "IMDS_DB": "postgresql://root@db.example:5432/defaultdb?sslmode=disable"}
    assert show(runner, env)["admin_token"] == ("********", "env")


def test_lookup_url_without_lookup_enabled_is_dropped(runner: CliRunner):
    """As in hollow, a lookup URL does nothing until lookup.enabled is true; the old baseurl name works."""
    rows = show(runner, {"METADATASERVICE_LOOKUP_SERVICE_URL": "https://lookup.example/"})
    assert rows["lookup_url"] == ("-", "default")
    rows = show(runner, {"METADATASERVICE_LOOKUP_BASEURL": "https://old.example/",
                         "METADATASERVICE_LOOKUP_ENABLED": "1"})
    assert rows["lookup_url"] == ("https://old.example/", "hollow")


@pytest.mark.parametrize(("args", "env", "named"), [
    ([], {"METADATASERVICE_CRDB_URI": "postgresql://root@crdb:26257/defaultdb?sslmode=disable"},
     "METADATASERVICE_CRDB_URI"),
    ([], {"METADATASERVICE_CRDB_URI": "host=crdb user=root"}, "METADATASERVICE_CRDB_URI"),
    ([], {"METADATASERVICE_CRDB_HOST": "crdb:26257", "METADATASERVICE_CRDB_USER": "root"}, "METADATASERVICE_CRDB_"),
    ([], {"METADATASERVICE_CRDB_PASSWORD": "p@ss"}, "METADATASERVICE_CRDB_PASSWORD"),
    ([], {"METADATASERVICE_CRDB_PARAMS": "sslmode=disable"}, "METADATASERVICE_CRDB_PARAMS"),
    (["--db-uri", "postgres://u:pw@h/db"], {}, "--db-uri / METADATASERVICE_DB_URI"),
    ([], {"METADATASERVICE_CRDB_URI": "postgresql://root@crdb/db", "IMDS_DB": "postgresql://imds@db/imds"},
     "METADATASERVICE_CRDB_URI"),
])
def test_cockroachdb_settings_are_refused(runner: CliRunner, args: list[str], env: dict[str, str], named: str):
    """Hollow CockroachDB settings stop serve, db upgrade and config show, naming LISTEN/NOTIFY and the way off."""
    commands = (["serve"], ["config", "show"]) if args else (["serve"], ["db", "upgrade"], ["config", "show"])
    for command in commands:  # hollow's flags are serve's (and config show's); its variables every command's
        result = runner.invoke(cli, [*command, *args], env=env)
        refused(result, named, "LISTEN/NOTIFY", "imds import --from-hollow", "--db / IMDS_DB")
        assert "p@ss" not in result.output
        assert "Traceback" not in result.output


def test_cockroachdb_pool_sizes_stay_ignored(runner: CliRunner):
    """The pool sizes of crdbx are harmless to drop: noted, not refused."""
    notes = SERVE.aliases_of({}, {"METADATASERVICE_CRDB_CONNECTIONS_MAX_OPEN": "50"}).notes
    assert any("METADATASERVICE_CRDB_CONNECTIONS_MAX_OPEN ignored" in note for note in notes), notes


@pytest.mark.parametrize(("text", "seconds"), [("10s", 10), ("1m30s", 90), ("250ms", 0.25), ("1h", 3600),
                                                ("1.5s", 1.5), ("7", 7)])
def test_go_durations(text: str, seconds: float):
    """Go durations, as hollow's --shutdown-grace-period takes them, in seconds."""
    assert go_duration(HOLLOW[0], text) == pytest.approx(seconds)


def test_a_bad_go_duration_names_the_variable():
    """A value that is no Go duration is refused naming hollow's variable."""
    with pytest.raises(ConfigError, match="METADATASERVICE_SHUTDOWN_GRACE_PERIOD"):
        load(environ={"METADATASERVICE_SHUTDOWN_GRACE_PERIOD": "10 s"})


def test_lists_split_as_viper_and_pflag_split_them(runner: CliRunner):
    """A variable's list splits on spaces (viper), a flag's on commas (pflag); either lands as one imds list."""
    rows = show(runner, {"METADATASERVICE_GIN_TRUSTEDPROXIES": "10.0.0.1 10.0.0.2",
                         "METADATASERVICE_LOOKUP_OIDC_SCOPES": "read:a read:b"})
    assert rows["trusted_proxy"] == ("10.0.0.1,10.0.0.2", "hollow")
    assert rows["lookup_scope"] == ("read:a,read:b", "hollow")


def test_hollow_default_scopes_stay_below_imds_scopes(runner: CliRunner):
    """The hollow default lookup scopes apply only where neither imds nor hollow names any scope."""
    env = {"METADATASERVICE_LOOKUP_SERVICE_URL": "https://lookup.example/", "IMDS_LOOKUP_SCOPES": "mine"}
    rows = show(runner, env, "--lookup-enabled")
    assert rows["lookup_scope"] == ("mine", "env")
    assert rows["lookup_url"] == ("https://lookup.example/", "hollow")
