#!/usr/bin/env bash
# Time `make run` from a fresh clone until the server answers its health check
# (bench/README.md, "Issue 28: `make run` from a fresh clone").
# usage: bench/make_run_time.sh SOURCE_REPO BRANCH LABEL [nocache]
#   e.g. bench/make_run_time.sh . main after; bench/make_run_time.sh . main after-cold nocache
set -u
src=$1; branch=$2; label=$3; nocache=${4:-}
dir=$(mktemp -d)/troth-$label
git clone -q --branch "$branch" "$src" "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
env_extra=()
[ -n "$nocache" ] && env_extra=(PIP_NO_CACHE_DIR=1)
start=$(date +%s.%N)
( cd "$dir" && exec env "${env_extra[@]}" setsid make run LISTEN=127.0.0.1:$port METRICS_LISTEN=127.0.0.1:$mport CONSOLE_LISTEN=127.0.0.1:$cport > make-run.log 2>&1 ) &
makepid=$!
healthy=""
for i in $(seq 1 1200); do
  if "$dir/.venv/bin/python" - "$port" <<'PY' 2>/dev/null
import sys, grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
ch = grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}")
r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
sys.exit(0 if r.status == health_pb2.HealthCheckResponse.SERVING else 1)
PY
  then healthy=$(date +%s.%N); break; fi
  sleep 0.5
done
end=${healthy:-$(date +%s.%N)}
# The started line names the console's URL, and the console answers there.
console_printed=no; console_up=no
for i in $(seq 1 20); do
  grep -qE "console(=|\":\")http://127.0.0.1:$cport/" "$dir/make-run.log" && console_printed=yes
  curl -fsS "http://127.0.0.1:$cport/healthz" >/dev/null 2>&1 && console_up=yes
  [ $console_printed = yes ] && [ $console_up = yes ] && break
  sleep 0.5
done
kill -TERM -- -$makepid 2>/dev/null
wait $makepid 2>/dev/null
pkgs=$("$dir/.venv/bin/python" -m pip list --format=freeze 2>/dev/null | wc -l)
size=$(du -sm "$dir/.venv" | cut -f1)
printf '%s: healthy=%s seconds=%.1f packages=%s venv_MB=%s console_url_printed=%s console_up=%s\n' "$label" "${healthy:+yes}" "$(echo "$end - $start" | bc)" "$pkgs" "$size" "$console_printed" "$console_up" | tee -a /tmp/make-run-times.txt
