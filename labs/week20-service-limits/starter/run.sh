#!/usr/bin/env bash
# One command to run the service. It must serve on the Unix socket $SERVICE_UDS when that is set (the grader's
# clean-copy check does), else on a TCP port of your choice.
echo "run.sh: TODO: start the service (uvicorn server:app ...)" >&2
exit 1
