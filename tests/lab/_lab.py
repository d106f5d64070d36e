"""The lab from Python: its hosts (``scripts/lab.sh``), Chalk members on c1..c3, and a
2-stage chain whose every effect is counted.

:class:`Lab` drives ``scripts/lab.sh`` (cut, delay, heal, kill, start) and asks the
RabbitMQ cluster which node leads a queue.  :class:`Chain` is one run: a database of
its own on ``db``, queues A → B → C of its own, workflows One and Two that each add
one to a counter of the record (``stage1``, ``stage2``), three members with the same
rules, records pushed to A.  While it runs, a sampler thread notes every half second
how many records reached C and what the cluster row says (leader, epoch, view).
:meth:`Chain.verdict` counts, once the members are stopped:

- *lost*: records whose counters are not both at least 1, or that never reached C;
- *doubled*: records with a counter above 1, or that reached C under two message IDs;
- *stuck*: messages left in A, B or a dead-letter queue, leases still held, outbox
  batches never sent;
- *double leases*: from an audit of ``chalk_leases`` (a trigger writes each insert,
  update and delete with the database's clock): a lease that passed to another owner
  while the one before had neither ended nor expired.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.pool import NullPool

from blackboard import Blackboard
from listener_router import ListenerRule, Settings, push_records
from listener_router.broker import connect, dlq_name
from listener_router.store import ServiceStore

ROOT = Path(__file__).resolve().parents[2]
LAB_SH = ROOT / "scripts" / "lab.sh"
NET = "198.18.0"
ADDRESSES = {"mq1": 11, "mq2": 12, "mq3": 13, "db": 20, "spark": 30, "w1": 31, "w2": 32,
             "c1": 41, "c2": 42, "c3": 43}
MEMBERS = ("c1", "c2", "c3")
MQ = ("mq1", "mq2", "mq3")
HEARTBEAT, TTL = 1.0, 5.0
AMQP_HEARTBEAT = 5   # seconds: a cut connection is noticed by both sides within ~10 s
# libpq: give up a connection whose data goes unacknowledged for 10 s, and a connect
# after 5 s (without them a member cut off waits out TCP's retransmission backoff, ~30 s
# after a 30 s cut, and its connects SYN's: minutes).
DB_QUERY = {"connect_timeout": "5", "keepalives": "1", "keepalives_idle": "5",
            "keepalives_interval": "2", "keepalives_count": "3", "tcp_user_timeout": "10000"}


def _helpers() -> Any:
    """tests/listener_router/listener_router_helpers (its test pipelets, write_config)."""
    folder = str(ROOT / "tests" / "listener_router")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import listener_router_helpers

    return listener_router_helpers


def addr(host: str) -> str:
    return f"{NET}.{ADDRESSES[host]}"


def node_url(host: str) -> str:
    return f"amqp://guest:guest@{addr(host)}:5672/%2F?heartbeat={AMQP_HEARTBEAT}"


def broker_urls(first: str = "mq1") -> str:
    """The three nodes, ``first`` first (each member starts at a node of its own)."""
    start = MQ.index(first)
    return ", ".join(node_url(h) for h in MQ[start:] + MQ[:start])


class LabError(RuntimeError):
    pass


class Lab:
    """``scripts/lab.sh`` from Python; the lab is up (the session fixture built it)."""

    postgres_url = f"postgresql+psycopg://postgres@{addr('db')}:5432/chalk"
    spark_master = f"spark://{addr('spark')}:7077"

    def sh(self, *args: str, timeout: float = 180) -> str:
        done = subprocess.run(["bash", str(LAB_SH), *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise LabError(f"lab.sh {' '.join(args)} exited {done.returncode}: "
                           f"{done.stderr.strip()[-2000:]}")
        return done.stdout

    def cut(self, host: str, *peers: str) -> None:
        self.sh("cut", host, *peers)

    def delay(self, host: str, *peers: str, ms: int, loss: float = 0.0) -> None:
        self.sh("delay", host, *peers, "--ms", str(ms), "--loss", str(loss))

    def heal(self, *hosts: str) -> None:
        self.sh("heal", *hosts)

    def kill(self, host: str) -> None:
        self.sh("kill", host)

    def start(self, host: str) -> None:
        self.sh("start", host, timeout=300)

    def ctl(self, *args: str, host: str = "mq1", timeout: float = 60) -> str:
        """``rabbitmqctl`` on a node of the cluster (inside its host)."""
        lab = os.environ.get("CHALK_LAB_DIR", "/var/tmp/chalk-lab")
        env = [f"RABBITMQ_NODENAME=rabbit@{host}", f"RABBITMQ_MNESIA_BASE={lab}/{host}/mnesia",
               f"RABBITMQ_CONFIG_FILE={lab}/{host}/rabbitmq",
               f"RABBITMQ_CONF_ENV_FILE={lab}/{host}/rabbitmq-env.conf",
               f"RABBITMQ_ENABLED_PLUGINS_FILE={lab}/{host}/enabled_plugins"]
        done = subprocess.run(["bash", str(LAB_SH), "exec", host, "env", *env,
                               "/usr/sbin/rabbitmqctl", *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise LabError(f"rabbitmqctl {' '.join(args)} on {host}: {done.stderr.strip()[-1000:]}")
        return done.stdout

    def queues(self, *columns: str, host: str = "mq1") -> list[dict[str, str]]:
        """``list_queues`` as rows (``name`` first), asked of ``host``."""
        out = self.ctl("--formatter", "json", "list_queues", "-q", "name", *columns, host=host)
        return json.loads(out or "[]")

    def leader_of(self, queue: str, ask: Sequence[str] = MQ) -> str:
        """The host whose node leads quorum queue ``queue`` (asked of the first node that
        answers)."""
        for host in ask:
            try:
                rows = self.queues("leader", host=host)
            except (LabError, subprocess.TimeoutExpired, ValueError):
                continue
            for row in rows:
                if row["name"] == queue:
                    return str(row["leader"]).split("@", 1)[1]
        raise LabError(f"no node of the cluster names a leader for {queue}")

    def wait_queue_members(self, queue: str, count: int, timeout: float = 120) -> None:
        """Until quorum queue ``queue`` has ``count`` members online."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                rows = [r for r in self.queues("online", host="mq1") if r["name"] == queue]
                last = rows
                if rows and len(rows[0]["online"]) >= count:
                    return
            except (LabError, subprocess.TimeoutExpired, ValueError) as e:
                last = e
            time.sleep(1)
        raise LabError(f"{queue} has not {count} members online after {timeout:.0f} s: {last}")


# --- what every run on the lab does --------------------------------------------------

# A member's Spark application on the lab's standalone master: an executor of one core
# on each worker host (the master spreads them), small memory.
SPARK_CONF = {"spark.cores.max": "2", "spark.executor.cores": "1",
              "spark.executor.memory": "512m", "spark.sql.shuffle.partitions": "2",
              "spark.ui.enabled": "false", "spark.driver.memory": "512m"}

# The driver's ports on a member, fixed as a firewall needs them (docs/cluster.md's c1): the
# executors connect to all three.
DRIVER_PORTS = {"spark.driver.port": "7079", "spark.blockManager.port": "7080",
                "spark.chalk.workers.port": "7081"}


def create_database(lab: Lab, name: str) -> str:
    """A database of its own on ``db``; its URL, with the members' libpq timeouts."""
    _admin(lab, f'CREATE DATABASE "{name}"')
    return make_url(lab.postgres_url).set(database=name, query=DB_QUERY).render_as_string(
        hide_password=False)


def drop_database(lab: Lab, name: str) -> None:
    _admin(lab, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _admin(lab: Lab, statement: str) -> None:
    admin = create_engine(lab.postgres_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(statement))
    finally:
        admin.dispose()


def start_member(host: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    """``chalk run --config config`` on ``host`` (its output into ``log``), in a process
    group of its own."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP=addr(host))
    with open(log, "ab") as handle:
        return subprocess.Popen(
            ["bash", str(LAB_SH), "exec", host, sys.executable, "-m", "listener_router", "run",
             "--config", str(config)],
            stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            stdin=subprocess.DEVNULL)


def stop_members(procs: dict[str, subprocess.Popen[bytes]], logs: dict[str, Path],
                 timeout: float = 90) -> None:
    """TERM to each member's group; one still running after ``timeout`` is killed, and
    that is an error (with its log's end)."""
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for host, proc in procs.items():
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            log = logs[host].read_text(errors="replace") if logs[host].exists() else ""
            raise AssertionError(f"{host} did not stop within {timeout:.0f} s:\n"
                                 f"{log[-3000:]}") from None


def report(name: str, figures: dict[str, Any], tmp_path: Path) -> None:
    """One line of figures into ``$CHALK_LAB_FIGURES`` (JSON lines; default: the session's
    temporary folder), where docs/cluster.md's tables come from."""
    path = Path(os.environ.get("CHALK_LAB_FIGURES") or tmp_path.parent / "lab-figures.jsonl")
    line = {"test": name, **figures, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "load": os.getloadavg()[0]}
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(f"\nlab {name}: {line}")


# --- one run of the chain --------------------------------------------------------------

STAGE = """<?xml version="1.0"?>
<process name="{name}" xmlns="http://docs.oasis-open.org/wsbpel/2.0/process/executable"
         xmlns:proc="http://www.eclipse.org/smila/processor">
  <sequence>
    <proc:invokePipelet name="count">
      <proc:pipelet class="lr_test_pipelets.Increment"/>
      <proc:configuration><proc:param name="attribute">{counter}</proc:param></proc:configuration>
    </proc:invokePipelet>
  </sequence>
</process>
"""


AUDIT = """
CREATE TABLE lab_lease_audit (
    id bigserial PRIMARY KEY, op char(1) NOT NULL, record_id text NOT NULL,
    owner text, old_owner text, expires_at double precision, old_expires_at double precision,
    at double precision NOT NULL);
CREATE FUNCTION lab_lease_audit() RETURNS trigger AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO lab_lease_audit (op, record_id, owner, expires_at, at)
      VALUES ('I', NEW.record_id, NEW.owner, NEW.expires_at, extract(epoch from clock_timestamp()));
  ELSIF TG_OP = 'UPDATE' THEN
    INSERT INTO lab_lease_audit (op, record_id, owner, old_owner, expires_at, old_expires_at, at)
      VALUES ('U', NEW.record_id, NEW.owner, OLD.owner, NEW.expires_at, OLD.expires_at,
              extract(epoch from clock_timestamp()));
  ELSE
    INSERT INTO lab_lease_audit (op, record_id, old_owner, old_expires_at, at)
      VALUES ('D', OLD.record_id, OLD.owner, OLD.expires_at, extract(epoch from clock_timestamp()));
  END IF;
  RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER lab_lease_audit AFTER INSERT OR UPDATE OR DELETE ON chalk_leases
  FOR EACH ROW EXECUTE FUNCTION lab_lease_audit();
"""


def double_leases(events: Iterable[tuple[str, str, str | None, str | None, float | None,
                                         float | None, float]]) -> list[str]:
    """Records whose lease passed to another owner while the one before still held it.

    ``events``: the audit's rows in order, ``(op, record, owner, old_owner, expires_at,
    old_expires_at, at)``.  An insert or an update that changes the owner takes the
    lease; it is a double lease when the owner before had not released it (no delete
    since it took it) and its lease had not expired (``old_expires_at`` after ``at``).
    An insert over a lease that was never deleted cannot happen (the row is the record's).
    """
    found: dict[str, str] = {}
    for op, record, owner, old_owner, _expires, old_expires, at in events:
        if op == "U" and owner != old_owner and old_expires is not None and old_expires > at:
            found.setdefault(record, f"{record}: taken by {owner} at {at:.3f} while {old_owner} "
                                     f"held it until {old_expires:.3f}")
    return list(found.values())


@dataclass
class Sample:
    at: float               # monotonic
    done: int | None        # messages in C
    leader: str | None
    epoch: int | None
    view: tuple[str, ...]


@dataclass
class Verdict:
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    double_leases: list[str] = field(default_factory=list)

    def problems(self) -> dict[str, list[str]]:
        return {k: v for k, v in vars(self).items() if v}


class Chain:
    """One run: a database and queues of its own, three members, records pushed to A."""

    def __init__(self, lab: Lab, tmp: Path, *, records: int = 5000, rate: float | None = 125.0,
                 spark: dict[str, Any] | None = None, members: Sequence[str] = MEMBERS):
        self.lab, self.tmp, self.count, self.members = lab, tmp, records, tuple(members)
        tag = uuid.uuid4().hex[:6]
        self.a, self.b, self.c = f"lab.{tag}.a", f"lab.{tag}.b", f"lab.{tag}.c"
        self.ids = [f"r{i:05d}" for i in range(records)]
        self.database = f"lab_{tag}"
        self.db = create_database(lab, self.database)
        store = ServiceStore.connect(self.db)   # the tables, so the audit can watch leases
        with store.engine.begin() as conn:
            conn.execute(text(AUDIT))
        store.engine.dispose()
        self.engine = create_engine(self.db, poolclass=NullPool)
        workflows = tmp / "workflows"
        workflows.mkdir(parents=True, exist_ok=True)
        (workflows / "one.xml").write_text(STAGE.format(name="LabOne", counter="stage1"))
        (workflows / "two.xml").write_text(STAGE.format(name="LabTwo", counter="stage2"))
        (workflows / "lr_test_pipelets.py").write_text(_helpers().TEST_PIPELETS)
        self.spark = spark
        self.configs = {h: self._config(h, workflows, rate) for h in self.members}
        self.logs = {h: tmp / f"{h}.log" for h in self.members}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.samples: list[Sample] = []
        self.marks: dict[str, float] = {}
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self.started: float | None = None

    def _config(self, host: str, workflows: Path, rate: float | None) -> Path:
        first = MQ[MEMBERS.index(host) % 3] if host in MEMBERS else "mq1"
        one = {"name": "one", "queue": self.a, "workflow": "LabOne", "batch_size": 50,
               "max_wait_ms": 100, "prefetch": 200}
        if rate is not None:
            one["rate_limit"] = rate
        sections: dict[str, Any] = {"engine": {"runner": "local"}}
        if self.spark is not None:
            sections = {"engine": {"runner": "spark", **self.spark.pop("engine", {})},
                        "spark": {"master": self.lab.spark_master, "conf": {
                            "spark.driver.host": addr(host), "spark.driver.bindAddress": addr(host),
                            **self.spark["conf"]}}}
        return _helpers().write_config(
            self.tmp / f"{host}.toml", db=self.db, broker=broker_urls(first), workflows=workflows,
            blackboard={"lease_seconds": 30}, broker_options={"delivery_limit": 100},
            node={"name": host, "heartbeat_seconds": HEARTBEAT, "ttl_seconds": TTL},
            listeners=[one, {"name": "two", "queue": self.b, "workflow": "LabTwo",
                             "batch_size": 50, "max_wait_ms": 100, "prefetch": 200}],
            routers=[{"workflow": "LabOne", "queue": self.b}, {"workflow": "LabTwo", "queue": self.c}],
            **sections)

    # -- members -------------------------------------------------------------------------
    def start_member(self, host: str) -> None:
        self.procs[host] = start_member(host, self.configs[host], self.logs[host])

    def log(self, host: str) -> str:
        return self.logs[host].read_text(errors="replace") if self.logs[host].exists() else ""

    def logs_tail(self, size: int = 2500) -> str:
        return "\n".join(f"--- {h}\n{self.log(h)[-size:]}" for h in self.members)

    def wait_up(self, timeout: float = 180) -> None:
        self.wait(lambda: all(" up: queues " in self.log(h) for h in self.members), timeout,
                  "every member up")
        self.wait(lambda: len(self._row()[2]) == len(self.members), timeout,
                  "every member in the view")

    def stop_members(self, timeout: float = 90) -> None:
        stop_members(self.procs, self.logs, timeout)

    def kill_members(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)

    # -- records and progress ---------------------------------------------------------
    def push(self, ids: Sequence[str] | None = None) -> None:
        settings = Settings(blackboard_url=self.db, broker_url=broker_urls(), delivery_limit=100,
                            listeners=(ListenerRule(name="one", queue=self.a, workflow="LabOne"),))
        push_records(settings, self.a, [{"id": rid, "attributes": {"n": i}}
                                         for i, rid in enumerate(ids or self.ids)])

    def _row(self) -> tuple[str | None, int | None, tuple[str, ...]]:
        with self.engine.connect() as conn:
            row = conn.execute(text("SELECT leader, epoch, view_members FROM chalk_cluster "
                                    "WHERE id = 1")).first()
        if row is None:
            return None, None, ()
        return row[0], row[1], tuple(m[0] for m in json.loads(row[2]))

    @staticmethod
    def _depth(ch: Any, queue: str) -> int:
        return int(ch.queue_declare(queue, passive=True).method.message_count)

    def sample_forever(self) -> None:
        conn = ch = None
        while not self._stop.is_set():
            done = None
            try:
                if conn is None or not conn.is_open or ch is None or not ch.is_open:
                    conn = connect(broker_urls())
                    ch = conn.channel()
                done = self._depth(ch, self.c)
            except (pika.exceptions.AMQPError, OSError, ConnectionError):
                conn = None
            try:
                leader, epoch, view = self._row()
            except Exception:  # the database is what is cut off, in one test
                leader, epoch, view = None, None, ()
            self.samples.append(Sample(time.monotonic(), done, leader, epoch, view))
            self._stop.wait(0.5)
        if conn is not None and conn.is_open:
            conn.close()

    def run(self, plant: Callable[[], None] | None = None) -> None:
        """Members up, records pushed, the sampler on.  With ``plant``: the records are
        pushed first, then ``plant()`` runs, then the members start."""
        if plant is not None:
            self.push()
            plant()
        for host in self.members:
            self.start_member(host)
        self.wait_up()
        self._sampler = threading.Thread(target=self.sample_forever, daemon=True)
        self._sampler.start()
        self.started = time.monotonic()
        if plant is None:
            self.push()
        self.mark("pushed")

    def mark(self, name: str) -> float:
        self.marks[name] = time.monotonic()
        return self.marks[name]

    def done(self) -> int:
        found = [s.done for s in self.samples if s.done is not None]
        return found[-1] if found else 0

    def wait(self, condition: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = condition()
            if found:
                return found
            time.sleep(0.2)
        raise AssertionError(f"{what}: not within {timeout:.0f} s\n{self.logs_tail()}")

    def wait_done(self, timeout: float = 300) -> None:
        self.wait(lambda: self.done() >= self.count, timeout,
                  f"{self.count} records through the chain (at {self.done()})")
        self.mark("done")

    def finish(self) -> Verdict:
        """Stop the sampler and the members; count what happened."""
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=10)
        self.stop_members()
        return self.verdict()

    # -- counting -----------------------------------------------------------------------
    def verdict(self) -> Verdict:
        verdict = Verdict()
        conn = connect(broker_urls())
        try:
            ch = conn.channel()
            under: dict[str, set[str]] = {}
            while True:
                method, props, body = ch.basic_get(self.c, auto_ack=True)
                if method is None:
                    break
                for record in json.loads(body)["records"]:
                    under.setdefault(record["id"], set()).add(props.message_id)
            for queue in (self.a, self.b, dlq_name(self.a), dlq_name(self.b), dlq_name(self.c)):
                depth = self._depth(ch, queue)
                if depth:
                    verdict.stuck.append(f"{depth} message(s) left in {queue}")
        finally:
            conn.close()
        with Blackboard.connect(self.db) as bb:
            bb.load_many(self.ids)
            counts = {rid: bb.get_attributes(rid, ["stage1", "stage2"]) for rid in self.ids}
            bb.invalidate_many(self.ids)
        for rid in self.ids:
            got = counts[rid]
            one, two = got.get("stage1", 0), got.get("stage2", 0)
            if one < 1 or two < 1 or rid not in under:
                verdict.lost.append(f"{rid}: stage1={one} stage2={two}, "
                                    f"{'in C' if rid in under else 'never reached C'}")
            if one > 1 or two > 1 or len(under.get(rid, ())) > 1:
                verdict.doubled.append(f"{rid}: stage1={one} stage2={two}, reached C under "
                                       f"{len(under.get(rid, ()))} message ID(s)")
        with self.engine.connect() as conn:
            leases = conn.execute(text("SELECT count(*) FROM chalk_leases")).scalar_one()
            unsent = conn.execute(text("SELECT count(*) FROM chalk_outbox_batches "
                                       "WHERE sent_at IS NULL")).scalar_one()
            events = conn.execute(text(
                "SELECT op, record_id, owner, old_owner, expires_at, old_expires_at, at "
                "FROM lab_lease_audit ORDER BY id")).all()
        if leases:
            verdict.stuck.append(f"{leases} lease(s) still held")
        if unsent:
            verdict.stuck.append(f"{unsent} outbox batch(es) never sent")
        verdict.double_leases = double_leases(events)
        return verdict

    # -- figures ------------------------------------------------------------------------
    def progress(self) -> list[tuple[float, int]]:
        """(moment, records in C so far) from the samples; C only grows, so a count below an
        earlier one (a passive declare answered while the queue's leader moved) is taken
        as the earlier."""
        out: list[tuple[float, int]] = []
        top = 0
        for s in self.samples:
            if s.done is not None:
                top = max(top, s.done)
                out.append((s.at, top))
        return out

    def rate(self, start: float, end: float) -> float:
        """Records per second that reached C between two moments (from the samples)."""
        inside = [(at, n) for at, n in self.progress() if start <= at <= end]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    def figures(self, fault: float, heal: float, window: float = 5.0) -> dict[str, float | None]:
        """Throughput before the fault, its lowest 5-s window from the fault to the end, the
        dip, and the time from the heal until a window is back at 80 % of before (None:
        it never dipped below that, or every record was through before the heal)."""
        first = next(s.at for s in self.samples if s.done)
        before = self.rate(max(first, fault - 8), fault)
        end = self.marks.get("done", self.samples[-1].at)
        lowest, recovered = before, None
        t = fault
        while t + window <= end:
            r = self.rate(t, t + window)
            lowest = min(lowest, r)
            if t >= heal and recovered is None and r >= 0.8 * before:
                recovered = t - heal
            t += 0.5
        return {"before": round(before, 1), "lowest": round(lowest, 1),
                "dip": round(1 - lowest / before, 2) if before else None,
                "recovered_after": None if lowest >= 0.8 * before or end <= heal else
                (round(recovered, 1) if recovered is not None else round(end - heal, 1)),
                "finished_during_fault": end <= heal,
                "total": round(end - (self.started or fault), 1)}

    def view_back_after(self, heal: float) -> float | None:
        """Seconds from ``heal`` until the established view held every member again."""
        for s in self.samples:
            if s.at >= heal and set(s.view) >= set(self.members):
                return round(s.at - heal, 1)
        return None

    def epochs(self) -> list[tuple[str | None, int | None]]:
        """(leader, epoch) as sampled, each change once."""
        out: list[tuple[str | None, int | None]] = []
        for s in self.samples:
            if s.epoch is not None and (not out or out[-1] != (s.leader, s.epoch)):
                out.append((s.leader, s.epoch))
        return out

    def close(self) -> None:
        self._stop.set()
        self.kill_members()
        self.engine.dispose()
        drop_database(self.lab, self.database)


def epochs_strictly_increase(epochs: list[tuple[str | None, int | None]]) -> bool:
    """Each change of leader comes with a higher epoch, and no epoch goes back."""
    values = [e for _leader, e in epochs]
    return all(b > a for a, b in zip(values, values[1:], strict=False))


def left_behind() -> list[str]:
    """What of the lab is still there: namespaces, its bridge, nftables rules of its own,
    processes."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = {line.split()[0] for line in out.splitlines() if line.strip()}
    found = [f"namespace {h}" for h in ADDRESSES if h in names]
    if subprocess.run(["ip", "link", "show", "chalklab0"], capture_output=True).returncode == 0:
        found.append("bridge chalklab0")
    rules = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    found += [f"nftables {line.strip()}" for line in rules.splitlines() if "lab_" in line]
    for proc in Path("/proc").iterdir():   # lab.sh marks what it starts with CHALK_LAB_HOST
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            marked = b"\0CHALK_LAB_HOST=" in b"\0" + (proc / "environ").read_bytes()
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marked:
            found.append(f"process {proc.name}: {command[:120]}")
    return found

