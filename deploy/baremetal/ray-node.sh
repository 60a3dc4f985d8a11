#!/usr/bin/env bash
# Start this machine's Ray node with its topology levels as Ray labels (systemd runs it).
#
#   ray-node.sh head      ray start --head on RAY_PORT (default 6379)
#   ray-node.sh worker    ray start --address RAY_HEAD_ADDRESS
#
# (`ray start` through `python -m workers.host.ray_cli`, the same command line.)
#
# Levels come from `meshyard topo labels`: discovered on this node (NVML fabric clique →
# nvlink_domain) plus the operator's labels in MESHYARD_NODE_LABELS_FILE (k=v lines, e.g.
# leaf=leaf-a, spine=spine-0, or Kubernetes/cloud keys such as nvidia.com/gpu.clique) and
# MESHYARD_NODE_LABELS (k=v,k=v). The node is named MESHYARD_NODE_NAME (default: the short
# hostname), the name a declared cluster file uses for it.
# RAY_NUM_GPUS / RAY_NUM_CPUS declare the node's resources (default: what Ray detects).
# RAY_DASHBOARD=0 starts the head without Ray's dashboard (its web UI and state API, which
# meshyard does not use; Ray Train's driver does).
# MESHYARD_DRY_RUN=1 prints the ray command instead of running it.
set -euo pipefail

role="${1:-}"
if [[ "$role" != "head" && "$role" != "worker" ]]; then
  echo "usage: $0 head|worker" >&2
  exit 2
fi

MESHYARD_BIN="${MESHYARD_BIN:-/opt/meshyard/venv/bin}"
labels_file="${MESHYARD_NODE_LABELS_FILE:-/etc/meshyard/node-labels}"
node_name="${MESHYARD_NODE_NAME:-$(hostname -s)}"

topo_args=(topo labels --node-name "$node_name")
if [[ -r "$labels_file" ]]; then
  topo_args+=(--labels-file "$labels_file")
fi
labels="$("$MESHYARD_BIN/meshyard" "${topo_args[@]}")"
echo "meshyard topology labels for $node_name: $labels" >&2

# Isolated mode keeps every job's ranks out of Ray's ports: the workers' must be a known
# range (without one the node refuses user code), the same on every node. Ray's own command
# line, run so that the raylet starts its worker processes through meshyard's setup worker
# (workers/host/setup_worker.py: no Ray import before the worker's own).
cmd=("$MESHYARD_BIN/python" -m workers.host.ray_cli start --block --labels "$labels"
     --min-worker-port "${RAY_MIN_WORKER_PORT:-10002}"
     --max-worker-port "${RAY_MAX_WORKER_PORT:-19999}")
if [[ -n "${RAY_NUM_GPUS:-}" ]]; then
  cmd+=(--num-gpus "$RAY_NUM_GPUS")
fi
if [[ -n "${RAY_NUM_CPUS:-}" ]]; then
  cmd+=(--num-cpus "$RAY_NUM_CPUS")
fi
if [[ -n "${RAY_NODE_IP:-}" ]]; then
  cmd+=(--node-ip-address "$RAY_NODE_IP")
fi
if [[ "$role" == "head" ]]; then
  # The dashboard stays on loopback; reach it through an SSH tunnel or the proxy.
  cmd+=(--head --port "${RAY_PORT:-6379}" --dashboard-host 127.0.0.1)
  case "${RAY_DASHBOARD:-1}" in
    1) ;;
    0) cmd+=(--include-dashboard false) ;;
    *) echo "RAY_DASHBOARD must be 1 or 0, not '${RAY_DASHBOARD}'" >&2; exit 2 ;;
  esac
else
  if [[ -z "${RAY_HEAD_ADDRESS:-}" ]]; then
    echo "RAY_HEAD_ADDRESS is not set (e.g. 10.0.0.1:6379 in /etc/meshyard/ray.env)" >&2
    exit 2
  fi
  cmd+=(--address "$RAY_HEAD_ADDRESS")
fi

if [[ "${MESHYARD_DRY_RUN:-0}" == "1" ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
