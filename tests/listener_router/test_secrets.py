"""No secret in any output: a real ``chalk run`` with a broker URL and a database URL that
both carry a password, taken through a broker outage and a database outage, while its page,
its panels, ``/metrics`` and the ``chalk`` commands are read; every byte of all of that is
searched for the two passwords and the console's token."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import secrets
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from _services import (
    add_broker_user,
    delete_broker_user,
    start_broker_app,
    start_postgres,
    stop_broker_app,
    stop_postgres,
)
from listener_router_helpers import (
    free_port,
    start_service,
    stop_service,
    wait_for_log,
    wait_until,
    write_config,
    write_test_workflows,
)
from sqlalchemy import make_url

from blackboard import SqlStore, StorageError, safe_url
from listener_router import load_settings, push_records
from listener_router._urls import shown_url
from listener_router.cli import main
from listener_router.watch._pages import PANELS

pytestmark = [pytest.mark.slow, pytest.mark.chaos, pytest.mark.broker, pytest.mark.postgres]

TOKEN = secrets.token_urlsafe(24)


class Seen:
    """Everything the run printed or served, by where it came from."""

    def __init__(self, base: str):
        self.base = base
        self.outputs: list[tuple[str, str]] = []

    def get(self, path: str) -> str:
        request = urllib.request.Request(self.base + path,
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
        self.outputs.append((f"GET /{path}", text))
        return text

    def everything(self, label: str) -> None:
        """The page, each panel, the metrics."""
        self.get("")
        for name in PANELS:
            self.get(f"panel/{name}")
        self.get("metrics")
        self.outputs[-1] = (f"{label}: {self.outputs[-1][0]}", self.outputs[-1][1])

    def chalk(self, config: Path, *args: str) -> str:
        """``chalk ARGS --config CONFIG`` in this process: what it prints and logs."""
        out, err, logged = io.StringIO(), io.StringIO(), io.StringIO()
        handler = logging.StreamHandler(logged)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                main([*args, "--config", str(config)])
        finally:
            root.removeHandler(handler)
        text = out.getvalue() + err.getvalue() + logged.getvalue()
        self.outputs.append((f"chalk {' '.join(args)}", text))
        return text


def test_no_password_or_token_in_any_output_through_a_broker_and_a_database_outage(
        tmp_path, broker, broker_url, pg_url, qname):
    amqp_password = "amqp-" + secrets.token_urlsafe(18)
    pg_password = "pg-" + secrets.token_urlsafe(18)
    user = f"chalk-sec-{uuid.uuid4().hex[:8]}"
    add_broker_user(user, amqp_password)
    plain = make_url(broker_url.replace("amqp://", "postgresql://", 1))
    secret_broker = f"amqp://{user}:{amqp_password}@{plain.host}:{plain.port}/%2F"
    secret_db = make_url(pg_url).set(password=pg_password).render_as_string(hide_password=False)
    assert pg_password in secret_db

    folder = write_test_workflows(tmp_path / "workflows")
    queue, out = qname("in"), qname("out")
    port = free_port()
    config = write_config(
        tmp_path / "chalk.toml", db=secret_db, broker=secret_broker, workflows=folder,
        engine={"runner": "local"}, http={"listen": f"127.0.0.1:{port}", "token": TOKEN},
        node={"name": "secret-1"}, events={"committed": True, "dead_lettered": True},
        dead_letters={"move_every": 1},
        listeners=[{"name": "t", "queue": queue, "workflow": "Fragile", "max_retries": 0,
                    "batch_size": 20, "max_wait_ms": 50}],
        routers=[{"queue": out, "attributes": ["count"]}])
    log = tmp_path / "service.log"
    seen = Seen(f"http://127.0.0.1:{port}/")
    service = start_service(config, log)
    try:
        wait_for_log(log, "metrics and dashboard on")
        settings = load_settings(config, env={})
        seen.get("panel/events")        # the page's event stream follows from now on
        push_records(settings, queue, [{"id": f"s-{i}", "attributes": {}} for i in range(5)])
        push_records(settings, queue, [{"id": "s-bad", "attributes": {"fail": True}}])
        wait_until(lambda: "s-bad" in seen.get("panel/dead_letters"), 120,
                   "the dead letter on the page")
        seen.everything("running")
        seen.chalk(config, "status")
        seen.chalk(config, "status", "--json")
        seen.chalk(config, "dlq", "list")
        seen.chalk(config, "dlq", "show", "--json")
        seen.chalk(config, "jobs", "--json")

        # the broker goes away: the link, the page's event stream and the commands say so
        stop_broker_app()
        try:
            wait_for_log(log, "unavailable", timeout=60)
            wait_until(lambda: "cannot reach the broker" in seen.get("panel/events"), 60,
                       "the events panel to say the broker cannot be reached", every=1)
            seen.everything("broker down")
            assert "cannot reach the broker" in seen.chalk(config, "events", "--follow",
                                                           "--count", "1")
            seen.chalk(config, "status")
        finally:
            start_broker_app(broker_url)
        wait_for_log(log, "connected to broker", count=2, timeout=120)

        # the database goes away with messages waiting: they are held, the reasons say why
        stop_postgres()
        try:
            for i in range(3):
                broker.publish(queue, json.dumps({"id": f"s-held-{i}"}), message_id=f"held-{i}")
            wait_for_log(log, "unavailable", count=2, timeout=60)
            time.sleep(2)
            seen.everything("database down")
            seen.chalk(config, "status")
            seen.chalk(config, "dlq", "list")
        finally:
            start_postgres()
        wait_until(lambda: "s-held-2" in seen.get("panel/jobs"), 180,
                   "the held messages to be taken once the database is back", every=1)
        seen.everything("after")
        seen.chalk(config, "jobs", "--json")
        seen.chalk(config, "dlq", "show", "--json")
    finally:
        stop_service(service)
        delete_broker_user(user)
    seen.outputs.append(("the service's output", log.read_text(errors="replace")))

    leaks = {secret[:5] + "…": [where for where, text in seen.outputs if secret in text]
             for secret in (amqp_password, pg_password, TOKEN)}
    assert not any(leaks.values()), f"secrets appear in: {leaks}"
    # the outages happened and were told, with the places named but not their passwords
    everything = "\n".join(text for _where, text in seen.outputs)
    assert "cannot reach the broker at amqp://" in everything
    assert f"storage {make_url(secret_db).render_as_string(hide_password=True)}" in everything


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql+psycopg://chalk:s3cret-pw@db.example:5432/chalk",
     "postgresql+psycopg://chalk:***@db.example:5432/chalk"),
    ("postgresql+psycopg://chalk@db/chalk?password=s3cret-pw&sslmode=require",
     "postgresql+psycopg://chalk@db/chalk?password=***&sslmode=require"),
    ("amqp://chalk:s3cret-pw@rabbit.example:5671/%2F", "amqp://rabbit.example:5671"),
    ("amqps://chalk:s3cret-pw@rabbit.example/prod", "amqps://rabbit.example:5671"),
    ("amqps://chalk:s3cret-pw@rabbit.example/prod?ssl_options={'ca_certs':'/no/such.pem'}",
     "amqps://rabbit.example:5671"),
    ("sqlite:///var/lib/chalk.db", "sqlite:///var/lib/chalk.db"),
    ("s3cret-pw pasted where a URL belongs", "(unreadable URL)"),
])
def test_a_url_is_shown_without_its_password(url, shown):
    assert shown_url(url) == shown
    assert "s3cret-pw" not in safe_url(url)


def test_a_store_that_cannot_be_opened_names_its_url_without_the_password():
    url = "postgresql+nosuchdriver://chalk:s3cret-pw@db.example/chalk"
    with pytest.raises(StorageError) as raised:
        SqlStore(url)
    assert "s3cret-pw" not in str(raised.value)
    assert "chalk:***@db.example" in str(raised.value)
