#!/usr/bin/env bash
# The CUDA checks in one run, for a lent GPU machine (one H100 / H200; torch, Lightning, transformers, peft; no vLLM,
# no Ray; DeepSpeed optional): `pytest -m gpu` with per-test records, then a Markdown table of them.
#
# usage: bash scripts/gpu_checks.sh [--allow-no-cuda] [pytest args...]
#   GPU_CHECKS_TIMEOUT  seconds for the whole pytest run (default 480, so a 10-minute slot keeps a margin)
#   GPU_CHECKS_PATHS    what pytest collects (default: tests, i.e. every `gpu`-marked test of the suite)
#   PYTHON              the interpreter (default: python, else python3)
#   GPU_CHECKS_WHEELS   a folder of wheels to install first without dependencies (e.g. a DeepSpeed built elsewhere)
#   OUT                 where the records go (default /tmp): gpu_checks.json, gpu_checks.junit.xml, gpu_checks.log,
#                       gpu_checks.md (the table)
#
# Exit status: 0 every check that ran passed on a CUDA device (tests needing what the machine lacks, DeepSpeed,
# vLLM or Ray, are skipped and listed); 1 a check failed or errored, the run timed out, or nothing ran;
# 2 no CUDA device (everything skipped; 0 with --allow-no-cuda, which proves the script and its table here).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
ALLOW_NO_CUDA=""
if [ "${1:-}" = "--allow-no-cuda" ]; then
    ALLOW_NO_CUDA="--allow-no-cuda"
    shift
fi
PY="${PYTHON:-$(command -v python || command -v python3)}"
case "$PY" in  # absolute, since it also runs from another directory below
    /*) ;;
    */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
    *) PY="$(command -v "$PY")" ;;
esac
OUT_DIR="${OUT:-/tmp}"
mkdir -p "$OUT_DIR"
JSON="$OUT_DIR/gpu_checks.json"
rm -f "$JSON"
START=$(date +%s)

# The package: importable from the checkout for this process and every worker / child it starts (PYTHONPATH); an
# editable install without dependencies too where pip can do it offline (never fatal: PYTHONPATH is enough).
if ! (cd / && "$PY" -c "import lightning_hybrid_rollout" 2>/dev/null); then
    if "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT_DIR/gpu_checks.install.log" 2>&1; then
        echo "[gpu_checks] installed the package (pip install --no-deps -e .)"
    else
        echo "[gpu_checks] pip install --no-deps -e . failed (gpu_checks.install.log); PYTHONPATH will do"
    fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# wheels carried to the machine (e.g. DeepSpeed built elsewhere): GPU_CHECKS_WHEELS=dir, installed without deps
if [ -n "${GPU_CHECKS_WHEELS:-}" ] && ls "$GPU_CHECKS_WHEELS"/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-deps "$GPU_CHECKS_WHEELS"/*.whl >>"$OUT_DIR/gpu_checks.install.log" 2>&1 \
        && echo "[gpu_checks] installed $(ls "$GPU_CHECKS_WHEELS"/*.whl | wc -l) wheel(s) from $GPU_CHECKS_WHEELS" \
        || echo "[gpu_checks] installing the wheels of $GPU_CHECKS_WHEELS failed (gpu_checks.install.log)"
fi
# deterministic cuBLAS (the bit-exact comparisons), quiet library warnings, one OpenMP thread per process
export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/lhr_torch_extensions}"
"$PY" - <<'PYEOF'
import importlib.util

import torch

cuda = torch.cuda.is_available()
name = torch.cuda.get_device_name(0) if cuda else "none"
optional = {m: importlib.util.find_spec(m) is not None for m in ("deepspeed", "vllm", "ray", "peft", "transformers")}
print(f"[gpu_checks] torch {torch.__version__}, CUDA {torch.version.cuda}, device: {name}; installed: {optional}")
PYEOF

# shellcheck disable=SC2086  # GPU_CHECKS_PATHS is a list of paths
timeout --signal=INT --kill-after=30 "${GPU_CHECKS_TIMEOUT:-480}" \
    "$PY" -m pytest ${GPU_CHECKS_PATHS:-tests} -m gpu -p no:cacheprovider -p tests.gpu.gpu_report \
    --gpu-report "$JSON" --junitxml "$OUT_DIR/gpu_checks.junit.xml" -q "$@" 2>&1 | tee "$OUT_DIR/gpu_checks.log"
PYTEST_RC=${PIPESTATUS[0]}
echo
echo "[gpu_checks] pytest exit status $PYTEST_RC after $(( $(date +%s) - START )) s"
# shellcheck disable=SC2086  # ALLOW_NO_CUDA is empty or one flag
"$PY" -m tests.gpu.gpu_report summarize "$JSON" $ALLOW_NO_CUDA | tee "$OUT_DIR/gpu_checks.md"
RC=${PIPESTATUS[0]}
if [ "$PYTEST_RC" -eq 124 ] || [ "$PYTEST_RC" -eq 137 ]; then
    echo "[gpu_checks] the run hit GPU_CHECKS_TIMEOUT=${GPU_CHECKS_TIMEOUT:-480} s"
    RC=1
fi
exit "$RC"
