#!/bin/sh
# Install the OpScope menu entry and icons (Linux/BSD desktops). For a PyInstaller folder, pass
# the folder: the entry then runs its executable instead of `opscope gui`.
#   packaging/install-desktop.sh                      # for a Python install (opscope on PATH)
#   packaging/install-desktop.sh /opt/opscope-gui     # for a PyInstaller folder
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
data="${XDG_DATA_HOME:-$HOME/.local/share}"
if [ $# -ge 1 ]; then
    bundle=$(cd "$1" && pwd)
    mkdir -p "$data/applications" "$data/icons/hicolor/256x256/apps"
    sed -e "s|^Exec=.*|Exec=$bundle/opscope-gui|" -e "s|^TryExec=.*|TryExec=$bundle/opscope-gui|" \
        "$here/resources/opscope.desktop" > "$data/applications/opscope.desktop"
    cp "$here/resources/icons/opscope-256.png" "$data/icons/hicolor/256x256/apps/opscope.png"
    command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database "$data/applications" || true
    echo "installed the menu entry for $bundle/opscope-gui"
else
    PYTHON="${PYTHON:-$here/.venv/bin/python}"
    [ -x "$PYTHON" ] || PYTHON=python3
    cd "$here" && "$PYTHON" -m opscope.app.desktop_entry
fi
