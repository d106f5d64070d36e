#!/usr/bin/env bash
# The test command: install what is missing, start RabbitMQ and PostgreSQL,
# run pytest in .venv. Arguments go to pytest (paths are relative to the repo
# root); without arguments the whole suite runs.
#
#   bash scripts/test.sh                       # everything (tests/lab beside the rest)
#   bash scripts/test.sh tests/test_infrastructure.py -x
#   bash scripts/test.sh tests/lab             # the lab's tests alone (root)
#
# Exit code is pytest's; "no tests collected" (5) counts as a failure.
# With CI=true the services this script started are stopped at the end
# (CHALK_KEEP_SERVICES=1 keeps them); locally they stay up for the next run.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SERVICES="bash $ROOT/scripts/services.sh"

bash scripts/install.sh

# Remember what was already up: CI clean-up stops only what this run started.
before=$($SERVICES status 2>/dev/null || true)
rmq_was_up=0; pg_was_up=0
[[ $before == *"rabbitmq: up"* ]] && rmq_was_up=1
[[ $before == *"postgres: up"* ]] && pg_was_up=1

cleanup() {
    if [ -n "${CI:-}" ] && [ "${CI}" != false ] && [ "${CHALK_KEEP_SERVICES:-}" != 1 ]; then
        [ $rmq_was_up = 1 ] || $SERVICES stop-rabbitmq || true
        [ $pg_was_up = 1 ] || $SERVICES stop-postgres || true
    fi
}
trap cleanup EXIT

# Both services boot in parallel (RabbitMQ takes ~6 s, PostgreSQL ~1 s).
$SERVICES start-rabbitmq &
rmq_pid=$!
pg_url=$($SERVICES start-postgres)
wait "$rmq_pid" || { echo "[test] RabbitMQ did not start" >&2; exit 1; }

export CHALK_TEST_BROKER_URL=${CHALK_TEST_BROKER_URL:-$($SERVICES broker-url)}
export CHALK_TEST_POSTGRES_URL=${CHALK_TEST_POSTGRES_URL:-$pg_url}
export CHALK_TEST_REQUIRE_SERVICES=1   # fixtures fail instead of skipping
export PYSPARK_PYTHON=$ROOT/.venv/bin/python
export PYSPARK_DRIVER_PYTHON=$ROOT/.venv/bin/python
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}

echo "[test] broker $CHALK_TEST_BROKER_URL, postgres $CHALK_TEST_POSTGRES_URL"
if [ $# -gt 0 ]; then
    set +e
    "$ROOT/.venv/bin/python" -m pytest -q --timeout=600 "$@"
    rc=$?
    set -e
    [ $rc != 5 ] || echo "[test] pytest collected no tests: counted as a failure" >&2
    exit $rc
fi

# The whole suite: the lab's tests (tests/lab: hosts in network namespaces with their
# own RabbitMQ cluster, PostgreSQL and Spark) use none of the services above, and spend
# most of their time waiting out faults: they run in a pytest process of their own,
# beside the main suite, and their report follows the main suite's.
lab_tmp=$(mktemp -d /tmp/chalk-lab-tests.XXXXXX)
lab_log=$lab_tmp/pytest.log
export CHALK_LAB_FIGURES=${CHALK_LAB_FIGURES:-$lab_tmp/figures.jsonl}
started=$SECONDS
"$ROOT/.venv/bin/python" -m pytest -q --timeout=900 -p no:cacheprovider --basetemp="$lab_tmp/t" \
    tests/lab >"$lab_log" 2>&1 &
lab_pid=$!
set +e
"$ROOT/.venv/bin/python" -m pytest -q --timeout=600 --ignore=tests/lab
rc=$?
main_seconds=$((SECONDS - started))
wait "$lab_pid"
lab_rc=$?
set -e
echo "[test] the lab's tests (tests/lab, beside the main suite; figures in $CHALK_LAB_FIGURES):"
cat "$lab_log"
echo "[test] wall clock: main suite ${main_seconds} s, both $((SECONDS - started)) s"
[ $rc != 5 ] || echo "[test] pytest collected no tests: counted as a failure" >&2
[ $lab_rc != 5 ] || echo "[test] the lab's pytest collected no tests: counted as a failure" >&2
[ $rc = 0 ] || exit $rc
exit $lab_rc
