#!/usr/bin/env bash
# Headless Chromium from Debian's packages, for the live page's browser test
# (tests/spark/test_live_page.py). `make test` runs this once; `make setup` does not need it.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_chromium.sh: no apt-get here; install Chromium (a 'chromium' command on PATH) yourself" >&2
  exit 1
fi
run_as_root=()
if [ "$(id -u)" != 0 ]; then
  if ! sudo -n true 2>/dev/null; then
    echo "install_chromium.sh: run 'sudo apt-get install -y chromium' (needs root), then make test again" >&2
    exit 1
  fi
  run_as_root=(sudo -n)
fi
"${run_as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${run_as_root[@]}" apt-get install -y -qq --no-install-recommends chromium
chromium --version
