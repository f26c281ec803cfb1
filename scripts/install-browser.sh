#!/usr/bin/env bash
# Installs the system Chromium that the web app's browser test drives (Playwright uses it through
# executable_path; nothing downloads a browser of its own). Idempotent: a no-op when it is there.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
    SUDO=sudo
else
    SUDO=
fi
echo "[setup] installing chromium (Debian package) for the browser test" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null
