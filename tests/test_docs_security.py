"""docs/security.md's examples do what the page says: every TOML block is a configuration Chalk
loads; the console's is refused while its tokens are the page's and starts with tokens of
one's own, reads then behind the token; the broker's URL asks for TLS with the CA named and
is printed without its password; the database's asks for a verified certificate; the Spark
block turns on authentication and encryption; the token command makes a token Chalk takes;
the scrape configuration sends a bearer token."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pika
import pytest
import yaml
from sqlalchemy import make_url
from test_docs import code_blocks

from listener_router import ConfigError, load_settings
from listener_router._urls import shown_url
from listener_router.watch import Watch
from listener_router.watch._guard import check_tokens

PAGE = Path(__file__).resolve().parents[1] / "docs" / "security.md"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _settings(tmp_path: Path, marker: str, env: dict[str, str] | None = None):
    (block,) = [b for b in code_blocks(PAGE, "toml") if marker in b]
    config = tmp_path / "chalk.toml"
    config.write_text(block)
    return load_settings(config, env=env or {})


def test_every_configuration_on_the_page_loads(tmp_path: Path) -> None:
    blocks = code_blocks(PAGE, "toml")
    assert len(blocks) == 4
    for n, block in enumerate(blocks):
        (tmp_path / f"{n}.toml").write_text(block)
        load_settings(tmp_path / f"{n}.toml", env={})


def test_the_console_example_is_refused_as_it_is_and_starts_with_tokens_of_ones_own(
        tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[http]")
    with pytest.raises(ConfigError) as refused:
        Watch.build(settings)
    assert "an example from the docs" in str(refused.value)
    assert "secrets.token_urlsafe(24)" in str(refused.value)
    made = [subprocess.run([sys.executable, "-c", _token_command()], capture_output=True,
                           text=True, check=True).stdout.strip() for _ in range(2)]
    settings = _settings(tmp_path, "[http]", env={"CHALK_HTTP_TOKEN": made[0],
                                                  "CHALK_HTTP_READ_TOKEN": made[1]})
    watch = Watch.build(settings)
    assert watch is not None and watch.access.reads_locked
    assert watch.access.reads_with(made[1]) and watch.access.reads_with(made[0])
    assert "chalk.example.org" in watch.allowed_hosts


def _token_command() -> str:
    (block,) = [b for b in code_blocks(PAGE, "bash") if "token_urlsafe" in b]
    command = block.strip()
    assert command.startswith("python -c '") and command.endswith("'")
    return command[len("python -c '"):-1]


def test_the_token_command_makes_a_token_chalk_takes() -> None:
    token = subprocess.run([sys.executable, "-c", _token_command()], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert len(token) >= 32
    check_tokens(listen_host="0.0.0.0", token=token, read_token=None, public=False)


def test_the_broker_url_asks_for_tls_and_is_printed_without_its_password(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "[broker]")
    assert settings.queue_type == "quorum" and settings.max_dead_letter_bytes == 1 << 30
    if not CA_BUNDLE.exists():
        pytest.skip(f"{CA_BUNDLE} is missing: the example's CA is read when the URL is")
    # the page's CA file is on the broker's machines; this one's bundle stands in for it
    url = settings.broker_url.replace("/etc/chalk/rabbit-ca.pem", str(CA_BUNDLE))
    params = pika.URLParameters(url)
    assert params.ssl_options is not None and params.port == 5671
    assert params.ssl_options.server_hostname == "rabbit.example.org"
    assert params.ssl_options.context.verify_mode == 2    # CERT_REQUIRED
    assert shown_url(settings.broker_url) == "amqps://rabbit.example.org:5671"


def test_the_database_url_asks_for_a_verified_certificate(tmp_path: Path) -> None:
    url = make_url(_settings(tmp_path, "[blackboard]").blackboard_url)
    assert url.drivername == "postgresql+psycopg" and url.password is None
    assert url.query["sslmode"] == "verify-full" and url.query["sslrootcert"]


def test_the_spark_example_turns_on_authentication_and_encryption(tmp_path: Path) -> None:
    conf = _settings(tmp_path, "[spark.conf]").spark_conf
    assert conf["spark.authenticate"] == "true" and conf["spark.authenticate.secret"]
    assert conf["spark.network.crypto.enabled"] == "true"
    assert conf["spark.driver.bindAddress"] == "0.0.0.0"


def test_the_scrape_configuration_sends_the_read_token() -> None:
    (block,) = code_blocks(PAGE, "yaml")
    (job,) = yaml.safe_load(block)["scrape_configs"]
    assert job["authorization"]["credentials_file"]
    assert job["static_configs"][0]["targets"] == ["chalk.example.org:9187"]
