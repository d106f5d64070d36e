#!/usr/bin/env bash
# The test command: install what is missing, start RabbitMQ and PostgreSQL,
# run pytest in .venv. Arguments go to pytest (paths are relative to the repo
# root); without arguments the whole suite runs.
#
#   bash scripts/test.sh                       # everything
#   bash scripts/test.sh tests/test_infrastructure.py -x
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
set +e
"$ROOT/.venv/bin/python" -m pytest -q --timeout=600 "$@"
rc=$?
set -e
if [ $rc = 5 ]; then
    echo "[test] pytest collected no tests: counted as a failure" >&2
fi
exit $rc
