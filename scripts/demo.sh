#!/usr/bin/env bash
# The demo: install what is missing, start RabbitMQ if none answers, then push
# sample records through the shipped Demo workflow on Spark and print a summary.
#
#   bash scripts/demo.sh                 # 1,000 records
#   bash scripts/demo.sh --records 20000
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
bash scripts/services.sh start-rabbitmq >/dev/null
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
exec "$ROOT/.venv/bin/chalk" demo "$@"
