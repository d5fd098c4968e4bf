#!/usr/bin/env bash
# One look at the real window on a real X server: starts Xvfb (1400x900x24, no window manager),
# runs `opscope gui` on it (Qt's xcb platform, not offscreen), walks the panels with xdotool as a
# person would (a chat reply, a trace of the planted bug, a benchmark, the Runs list, the engine
# settings, the store switch, the dark theme) and saves a screenshot of the screen after each step.
#
#   packaging/xvfb_walk.sh [OUT_DIR]        (default build/xvfb-walk; needs Xvfb, xdotool, import)
#
# Debian: apt-get install -y xvfb xdotool x11-apps imagemagick. The clicks use the positions of the
# default layout at 1400x900, so the walk runs on a scratch home (no saved layout, settings or runs).
# SLOW=2 doubles every wait on a busy machine. tests/app/test_gui_xvfb.py runs it (marker `xvfb`).
set -euo pipefail

OUT=${1:-build/xvfb-walk}
SLOW=${SLOW:-1}
OPSCOPE=${OPSCOPE:-$(dirname "$0")/../.venv/bin/opscope}
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
gui_pid=
cleanup() {
  [ -n "$gui_pid" ] && kill "$gui_pid" 2>/dev/null && wait "$gui_pid" 2>/dev/null
  kill "$xvfb_pid" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
for _ in $(seq 50); do [ -s "$scratch/display" ] && break; sleep 0.1; done
export DISPLAY=:$(head -1 "$scratch/display")
exec 3>&-  # the window must not inherit the display-number file

pause() { sleep "$(awk "BEGIN { print $1 * $SLOW }")"; }
# Qt takes a click only after the pointer has arrived: move, let it settle, then press.
click() { xdotool mousemove "$1" "$2"; sleep 0.3; xdotool click 1; pause "${3:-1}"; }
shot() { import -window root "$OUT/$1.png"; echo "xvfb_walk: $OUT/$1.png"; }
# A primary button (Send, Trace, Run) is this blue when enabled, grey while the engine is busy.
ENABLED="srgb(43,108,176)"
pixel() { import -window root -crop "1x1+$1+$2" -format "%[pixel:p{0,0}]" info: 2>/dev/null; }
wait_enabled() {  # X Y TIMEOUT_S WHAT: wait until the button at X,Y is enabled again
  local limit; limit=$(awk "BEGIN { print int($3 * $SLOW) }")
  for _ in $(seq "$limit"); do [ "$(pixel "$1" "$2")" = "$ENABLED" ] && return 0; sleep 1; done
  echo "xvfb_walk: $4 did not finish within $limit s" >&2; shot "timeout-$4"; exit 1
}
has_text() {  # X Y W: a dark glyph in the W px of row Y from X (a label that shows text)
  [ "$(import -window root -crop "${3}x1+$1+$2" -format "%[fx:minima.intensity < 0.6]" info: 2>/dev/null)" = 1 ]
}
tab() { case $1 in chat) click 26 64;; trace) click 81 64;; bench) click 158 64;; runs) click 234 64;; esac; }

"$OPSCOPE" gui >"$OUT/gui.log" 2>&1 &
gui_pid=$!
for _ in $(seq 120); do xdotool search --onlyvisible --name '^OpScope$' >/dev/null 2>&1 && break; sleep 0.5; done
pause 3
shot 01-start  # the worker may still be loading the embedded model: the chat message below waits for it

# Chat: a reply streams with live TTFT and tok/s, rendered as Markdown.
click 300 795 0.3
xdotool type --delay 15 "Write a Python function that reverses a string, in a code block."
xdotool key ctrl+Return
limit=$(awk "BEGIN { print int(1200 * $SLOW) }")
for _ in $(seq "$limit"); do has_text 10 737 300 && break; sleep 0.5; done  # the live stats line shows
pause 4
shot 02-chat-streaming
wait_enabled 570 857 600 chat-reply
shot 03-chat-reply

# Trace: the planted leaky-norm bug on the simulated accelerator, 2 tokens; then its finding.
tab trace
shot 04-trace-empty
click 128 141 0.5; xdotool key Down Return
click 390 141 0.5; xdotool key Down Return
click 610 113 0.3; xdotool key ctrl+a; xdotool type 2
click 698 113 3
wait_enabled 672 106 600 trace
click 195 275 3  # a loaded machine may still be drawing the 3,500 ops when the trace ends
shot 05-trace-finding

# Benchmarks: the quick matmul suite (the fifth suite in the list).
tab bench
shot 06-bench-empty
click 150 121 0.5; xdotool key Down Down Down Down Return
pause 1
click 100 466 3  # Run, under the form (Name, Tags, the A/B row)
wait_enabled 100 466 600 benchmark
shot 07-bench-done

# Runs: open the run, the engine settings, the store switch dialog.
tab runs
click 130 190 0.5
click 48 400 5  # reading the run from the store takes a while on a busy machine
shot 08-runs
# Without a window manager a dialog gets no keyboard focus: it is closed with its Cancel button.
click 835 34 2
shot 09-settings
click 778 685 1
click 688 112 2
shot 10-store-dialog
click 903 457 1

# Dark theme: View → Theme → Dark, then Trace and Runs.
click 58 9 0.6; click 90 163 0.6; xdotool mousemove 210 210; click 212 211 1.5
shot 11-dark-runs
tab trace
shot 12-dark-trace
tab chat
shot 13-dark-chat

# File → Quit: the window closes and stops its worker.
click 20 9 0.6; click 46 75 0
for _ in $(seq 60); do kill -0 "$gui_pid" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$gui_pid" 2>/dev/null; then echo "xvfb_walk: the window did not quit within 30 s" >&2; exit 1; fi
status=0
wait "$gui_pid" || status=$?
gui_pid=
echo "xvfb_walk: opscope gui exited with $status"
exit "$status"
