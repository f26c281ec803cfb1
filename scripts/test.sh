#!/usr/bin/env bash
# The whole test suite: offline unit tests and integration tests on the real default models.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
bash "$ROOT/scripts/install-browser.sh"  # Debian's chromium, for the web app's browser test
cd "$ROOT"
exec python -m pytest "$@"
