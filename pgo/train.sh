#!/usr/bin/env bash
# The PGO training run (`cargo xtask pgo` runs it): the instrumented agent
# BIN under the benchmark's workload. Each agent writes its counts when it
# exits on SIGTERM, into the directory BIN was built to write them to.
#
#   1. Every default collector, every probe, and pod attribution against a
#      stand-in API server (api.py: 30 pods on the node) that the agent lists
#      and watches.
#   2. The same without the eBPF and pod collectors.
#
# Each is scraped as Prometheus does (keep-alive, text 0.0.4 and OpenMetrics,
# gzip, protobuf), with collect[] selections, the health endpoints, and wrk at
# 4 connections.
#
# usage: train.sh BIN
set -euo pipefail
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d)
API_PORT=19300
python3 "$HERE/api.py" "$API_PORT" "$D/kubeconfig" &
API=$!
trap 'kill $API 2>/dev/null || true; rm -rf "$D"' EXIT
for _ in $(seq 50); do [ -s "$D/kubeconfig" ] && break; sleep 0.1; done

COMMON=(--collector.filesystem.mount-points-exclude='^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)'
        --collector.diskstats.device-exclude='^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$')
NO_EBPF=()
for c in $("$BIN" --help | grep -o -- '^ *--collector\.\(ebpf\|pod\)_[a-z_]*$' | sed 's/.*collector\.//'); do
  NO_EBPF+=("--no-collector.$c")
done
[ ${#NO_EBPF[@]} -gt 0 ] || { echo "train.sh: found no eBPF collectors in $BIN --help" >&2; exit 1; }

scrapes() {
  python3 - "$1" <<'PY'
import http.client, sys
port = int(sys.argv[1])
def run(n, path="/metrics", headers={}):
    c = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(n):
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        r.read()
        if r.status != 200:
            sys.exit(f"GET {path}: {r.status}")
om = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
pb = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3"
run(1500)
run(300, headers={"Accept-Encoding": "gzip"})
run(300, headers={"Accept": om, "Accept-Encoding": "gzip"})
run(100, headers={"Accept": om})
run(100, headers={"Accept": pb, "Accept-Encoding": "gzip"})
run(50, "/metrics?collect[]=cpu&collect[]=meminfo")
run(50, "/metrics?exclude[]=netclass")
for p in ("/healthz", "/readyz", "/"):
    run(20, p)
PY
  wrk -t1 -c4 -d3s "http://127.0.0.1:$1/metrics" > /dev/null
}

agent() {
  local port=$1 want=$2
  shift 2
  "$BIN" --web.listen-address="127.0.0.1:$port" "${COMMON[@]}" "$@" > "$D/agent-$port.log" 2>&1 &
  local pid=$! ok=
  for _ in $(seq 150); do
    if curl -sf "http://127.0.0.1:$port/metrics" 2>/dev/null | grep -q "^$want"; then ok=1; break; fi
    sleep 0.2
  done
  [ -n "$ok" ] || { cat "$D/agent-$port.log" >&2; echo "train.sh: the agent on :$port never served $want" >&2; exit 1; }
  scrapes "$port"
  kill -TERM "$pid"
  wait "$pid" || { cat "$D/agent-$port.log" >&2; echo "train.sh: the agent on :$port failed" >&2; exit 1; }
}

agent 19310 'node_ebpf_pod_attribution_synced 1' \
  --collector.ebpf_pods.kubeconfig="$D/kubeconfig" --collector.ebpf_pods.node-name=pgo-node
agent 19311 'node_load1 ' "${NO_EBPF[@]}"
