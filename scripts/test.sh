#!/usr/bin/env bash
# The whole test suite: offline unit tests and integration tests on the real default models.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$ROOT"
exec python -m pytest "$@"
