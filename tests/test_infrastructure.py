"""The shared fixtures work: each test touches one real service."""

from __future__ import annotations

import sqlite3

import pika
import pytest
from sqlalchemy import create_engine, text


def _consume_one(conn: pika.BlockingConnection, queue: str, timeout: float = 10) -> bytes:
    channel = conn.channel()
    for method, _properties, body in channel.consume(queue, inactivity_timeout=timeout):
        assert method is not None, f"no message on {queue} within {timeout} s"
        channel.basic_ack(method.delivery_tag)
        channel.cancel()
        return body
    raise AssertionError("consume loop ended without a message")


def test_a_published_message_is_consumed_back(amqp_queues):
    queue = amqp_queues("roundtrip")
    conn = amqp_queues.connection()
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    channel.basic_publish(
        "", queue, b'{"id": "doc-1"}',
        pika.BasicProperties(delivery_mode=2, message_id="m-1"),
    )

    body = _consume_one(conn, queue)

    assert body == b'{"id": "doc-1"}'
    assert queue.startswith(amqp_queues.prefix)


def test_each_test_gets_its_own_queue_prefix(amqp_queues, broker_url):
    assert amqp_queues.prefix.startswith("ct.")
    assert amqp_queues.url == broker_url


def test_postgres_answers_select_1(postgres_url):
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("select 1")).scalar_one() == 1
            assert conn.execute(text("select current_database()")).scalar_one() == "chalk_test"
    finally:
        engine.dispose()


def test_pg_url_is_a_fresh_writable_database(pg_url):
    engine = create_engine(pg_url)
    try:
        with engine.begin() as conn:
            assert conn.execute(
                text("select count(*) from pg_tables where schemaname = 'public'")
            ).scalar_one() == 0
            conn.execute(text("create table t (x int)"))
            conn.execute(text("insert into t values (1), (2)"))
        with engine.connect() as conn:
            assert conn.execute(text("select sum(x) from t")).scalar_one() == 3
    finally:
        engine.dispose()


def test_spark_counts_a_range(spark):
    assert spark.range(10).count() == 10
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


def test_spark_workers_run_python_with_pyarrow(spark):
    # mapInArrow runs in a Python worker: fails unless PYSPARK_PYTHON is ours.
    def double(batches):
        import pyarrow.compute as pc

        for batch in batches:
            yield batch.set_column(0, "id", pc.multiply(batch.column(0), 2))

    df = spark.range(5).mapInArrow(double, "id long")

    assert sorted(r.id for r in df.collect()) == [0, 2, 4, 6, 8]


def test_sqlite_url_is_writable(sqlite_url, tmp_path):
    engine = create_engine(sqlite_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("create table t (x int)"))
            conn.execute(text("insert into t values (42)"))
    finally:
        engine.dispose()

    path = sqlite_url.removeprefix("sqlite:///")
    assert path.startswith(str(tmp_path))
    with sqlite3.connect(path) as db:
        assert db.execute("select x from t").fetchall() == [(42,)]


@pytest.mark.chaos
def test_broker_comes_back_after_a_restart(amqp_queues, broker_url):
    from _services import restart_broker

    queue = amqp_queues("survivor")
    conn = amqp_queues.connection()
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"kept", pika.BasicProperties(delivery_mode=2))
    conn.close()

    restart_broker(broker_url)

    body = _consume_one(amqp_queues.connection(), queue)
    assert body == b"kept"
