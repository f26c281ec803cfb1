#!/usr/bin/env bash
# The main job: a document Q&A demo on the embedded default models (offline).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
exec python -m apps.demo "$@"
