#!/usr/bin/env bash
# Create (or complete) kiln's virtual environment. Idempotent; `make` calls it when the
# environment's stamp is older than pyproject.toml.
#
# Note: torch is never installed as a side effect of another package. A torch that the base
# Python already has (a CUDA box keeps its CUDA build) is reused through
# --system-site-packages; otherwise we ask for exactly torch==2.13.0, which pip takes from the
# CPU wheel on this machine's disk instead of a multi-GB CUDA build.
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv --system-site-packages "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)

if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "kiln setup: installing torch==2.13.0 (CPU build)"
    "${pip[@]}" "torch==2.13.0"
fi
torch_version=$("$venv/bin/python" -c "import torch; print(torch.__version__.split('+')[0])")
# Pin torch to what is there so no dependency can swap it for another build.
echo "torch==$torch_version" > "$venv/kiln-torch-pin.txt"
"${pip[@]}" -c "$venv/kiln-torch-pin.txt" -e ".[dev]"
touch "$venv/.ready"
echo "kiln setup: environment ready in $venv (torch $torch_version)"
