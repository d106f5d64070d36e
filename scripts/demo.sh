#!/usr/bin/env bash
# The demo: install what is missing, start RabbitMQ if none answers, then push
# sample records through the shipped Demo workflow on Spark and print a summary:
# the cold start (Spark, and warm-up records) and the steady rate, apart.
#
#   bash scripts/demo.sh                   # 20,000 records timed after 3,000 warming up
#   bash scripts/demo.sh --records 100000
#   CHALK_BROKER_URL=amqp://guest:guest@localhost:5673/%2F bash scripts/demo.sh
#                                          # a broker of yours, on another port: none started
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
if [ -z "${CHALK_BROKER_URL:-}" ]; then
    bash scripts/services.sh start-rabbitmq >/dev/null
fi
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
exec "$ROOT/.venv/bin/chalk" demo "$@"
