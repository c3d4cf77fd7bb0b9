#!/usr/bin/env bash
# Screenshots of evbd's status page as an operator's browser shows it, with
# Debian's headless Chromium: a builder of SOURCES sources (default 8) under
# traffic, two of them silent, for SECONDS seconds (default 40, so the plots have
# some minutes... of seconds), then `/` and `/sources` into OUT (default .).
#   packaging/status_screenshot.sh [SOURCES] [SECONDS] [OUT]
# Needs build/bin (./packaging/setup.sh build) and `chromium` (apt-get install chromium).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${EVB_BIN:-$root/build/bin}
sources=${1:-8}
seconds=${2:-40}
out=$(realpath "${3:-.}")
command -v chromium >/dev/null || { echo "status_screenshot: chromium is not installed (apt-get install chromium)" >&2; exit 2; }
work=$(mktemp -d)
sample_pid=
trap 'kill $evbd_pid $src_pid $sample_pid 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
port=$((20000 + RANDOM % 20000))
"$bin/evbd" --set sources="$sources" --set input.listen=127.0.0.1:$port --set monitor.listen=127.0.0.1:0 \
  --set output.directory="$work/data" --set building.timeout_ms=500 >"$work/evbd.log" 2>&1 &
evbd_pid=$!
for _ in $(seq 100); do grep -q "building run" "$work/evbd.log" && break; sleep 0.1; done
url=$(grep -o 'http://[^ ]*/metrics' "$work/evbd.log" | head -1)
url=${url%/metrics}
# Two sources never send: they show as "need a look".
"$bin/evb-source" --to 127.0.0.1:$port --sources $((sources - 2)) --events 100000000 --rate $(( 16000 / sources > 200 ? 16000 / sources : 200 )) \
  --size 200:2000 >/dev/null 2>&1 &
src_pid=$!
# An online monitor sampling the built events (shown on the page), when curl is here.
if command -v curl >/dev/null; then
  curl -sN "$url/sample?stream" >/dev/null 2>&1 &
  sample_pid=$!
fi
sleep "$seconds"
for page in "" sources; do
  name=status${page:+-$page}-$sources.png
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1100 \
    --screenshot="$out/$name" "$url/$page" >/dev/null 2>&1
  echo "$out/$name"
done
