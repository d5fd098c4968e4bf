#!/usr/bin/env bash
# One look at the real window on a real X server: starts Xvfb (1400x900x24, no window manager) and
# runs packaging/xvfb_walk.py on it: the window on Qt's xcb platform (not offscreen), driven by real
# X input (xdotool) at the places its widgets are drawn, as a person would: three chat turns (turn
# 3's TTFT within 1.5x turn 1's, the reused prefix in the stats line), a trace whose table rows and
# timeline bars select each other, a quick matmul run's roofline with both roofs, and a compare of
# two runs in a 1280x800 window. It prints one line per check and saves a screenshot of the screen
# after each step.
#
#   packaging/xvfb_walk.sh [OUT_DIR]        (default build/xvfb-walk; needs Xvfb, xdotool, import)
#
# Debian: apt-get install -y xvfb xdotool imagemagick libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1
# (the last three: Qt's xcb platform). The walk runs on a scratch home (no saved layout, settings or
# runs). tests/app/test_gui_xvfb.py runs it (marker `xvfb`).
set -euo pipefail

OUT=${1:-build/xvfb-walk}
PYTHON=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
for tool in Xvfb xdotool import; do
  command -v "$tool" >/dev/null || { echo "xvfb_walk: $tool not found: apt-get install -y xvfb xdotool imagemagick" >&2; exit 2; }
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
scratch=$(mktemp -d)
export XDG_CONFIG_HOME=$scratch/config XDG_DATA_HOME=$scratch/data XDG_CACHE_HOME=${XDG_CACHE_HOME:-$HOME/.cache}
export QT_QPA_PLATFORM=xcb

exec 3>"$scratch/display"
Xvfb -displayfd 3 -screen 0 1400x900x24 -nolisten tcp >"$scratch/xvfb.log" 2>&1 &
xvfb_pid=$!
cleanup() {
  kill "$xvfb_pid" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
for _ in $(seq 50); do [ -s "$scratch/display" ] && break; sleep 0.1; done
export DISPLAY=:$(head -1 "$scratch/display")
exec 3>&-  # the window must not inherit the display-number file

# The walk itself: the window in the checker's process, driven with xdotool at its widgets' places.
status=0
"$PYTHON" "$(dirname "$0")/xvfb_walk.py" "$OUT" 2>"$OUT/gui.log" || status=$?
echo "xvfb_walk: the walk exited with $status (the window's log: $OUT/gui.log)"
exit "$status"
