#!/usr/bin/env bash
# One command to run the service: ./run.sh
# Listens on 127.0.0.1:${PORT:-8000}, or on the Unix socket $SERVICE_UDS when it is set.
# Limits come from INFRACOURSE_SERVICE (JSON, see infracourse.kit.service_kit.ServiceConfig).
set -euo pipefail
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [ -n "${SERVICE_UDS:-}" ]; then
    exec python -m uvicorn server:app --uds "$SERVICE_UDS" --no-access-log --timeout-graceful-shutdown 1
fi
exec python -m uvicorn server:app --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" --no-access-log \
    --timeout-graceful-shutdown 1
