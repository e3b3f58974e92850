#!/usr/bin/env bash
# What the `browser` tests (tests/test_browser_ui.py) need on a CI machine: Debian's Chromium and the
# playwright Python package in the venv that runs the comfy tests. Never `playwright install`: no
# browser downloads; playwright drives /usr/bin/chromium. CI runs as root.
# Usage: .ci/browser_deps.sh /path/to/venv/bin/python
set -euo pipefail
python=${1:?usage: $0 VENV_PYTHON}
if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
"$python" -m pip install -q playwright
/usr/bin/chromium --version
"$python" -c "import playwright.sync_api; print('[ShardDiT] playwright ready')"
