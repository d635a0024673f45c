#!/usr/bin/env bash
# One study on several nodes, for real: PostgreSQL (Optuna study + MLflow backend store), `mlflow server`, a
# controller (`bisect-eagle run`) and two workers (`bisect-eagle worker`), each node in its own network
# namespace with its own address on a bridge this script makes, reaching the stores only over TCP. One worker
# is SIGKILLed in the middle of a live trial; the others reap its trial by heartbeat (docs/multinode.md) and
# finish the study. Prints one JSON line: workers, trials, distinct fingerprints, duplicates, lost, reaped,
# runs_left_running. Exit 0 when duplicates = lost = runs_left_running = 0 and reaped >= 1.
#
# Needs root (namespaces, and PostgreSQL run as user postgres) and Debian's postgresql package. Where network
# namespaces are not permitted, the nodes are separate process trees on 127.0.0.1 (said on stderr).
# Everything it makes (namespaces, bridge, servers, databases, files) is removed on exit, failure included.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BE="${BISECT_EAGLE:-$REPO/.venv/bin/bisect-eagle}"
PY="$(dirname "$BE")/python"
MLFLOW="$(dirname "$BE")/mlflow"
PGBIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[ -x "$PGBIN/initdb" ] || { echo "multinode_check: PostgreSQL not installed (apt-get install postgresql)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "multinode_check: needs root (network namespaces; PostgreSQL as user postgres)" >&2; exit 2; }

TAG="be$$"
WORK="$(mktemp -d /tmp/bisect-eagle-multinode-XXXXXX)"
chmod 755 "$WORK"
NET="10.$((100 + $$ % 100)).$(($$ / 100 % 250)).0"
PFX="${NET%.0}"
BR="$TAG-br"
NODES=(c w1 w2)
PIDS=()
NETNS=0

log() { echo "multinode_check: $*" >&2; }

cleanup() {
  set +e
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
  sleep 1
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  [ -d "$WORK/pg/data" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pg/data" -m immediate stop >/dev/null 2>&1
  if [ "$NETNS" = 1 ]; then
    for n in "${NODES[@]}"; do ip netns del "$TAG-$n" 2>/dev/null; done
    ip link del "$BR" 2>/dev/null
  fi
  [ -n "${BISECT_EAGLE_KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

show_logs() { for f in "$WORK"/node-*/err.log "$WORK/mlflow.log"; do echo "== $f" >&2; tail -n 8 "$f" >&2; done; }

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# -- the network: a bridge and one namespace per node, or 127.0.0.1 --------------------------------------
if ip link add "$BR" type bridge 2>/dev/null; then
  NETNS=1
  ip addr add "$PFX.1/24" dev "$BR" && ip link set "$BR" up
  i=2
  for n in "${NODES[@]}"; do
    ip netns add "$TAG-$n"
    ip link add "$TAG-$n-h" type veth peer name "$TAG-$n-n"
    ip link set "$TAG-$n-h" master "$BR" up
    ip link set "$TAG-$n-n" netns "$TAG-$n"
    ip -n "$TAG-$n" addr add "$PFX.$i/24" dev "$TAG-$n-n"
    ip -n "$TAG-$n" link set "$TAG-$n-n" up
    ip -n "$TAG-$n" link set lo up
    i=$((i + 1))
  done
  STORE_HOST="$PFX.1"
  log "nodes in network namespaces ${NODES[*]/#/$TAG-} on bridge $BR ($PFX.0/24); stores on $STORE_HOST"
else
  STORE_HOST=127.0.0.1
  log "network namespaces are not permitted here: the nodes are separate process trees on 127.0.0.1"
fi

# on_node NODE CMD...: run CMD as node NODE (its own namespace and host name), in its own process group
on_node() {
  local n="$1"; shift
  mkdir -p "$WORK/node-$n"
  if [ "$NETNS" = 1 ]; then
    (cd "$WORK/node-$n" && exec setsid ip netns exec "$TAG-$n" unshare --uts sh -c 'hostname "$0"; exec "$@"' \
      "node-$n" "$@" >"$WORK/node-$n/out.json" 2>"$WORK/node-$n/err.log") &
  else
    (cd "$WORK/node-$n" && exec setsid "$@" >"$WORK/node-$n/out.json" 2>"$WORK/node-$n/err.log") &
  fi
  PIDS+=("$!")
}

# -- PostgreSQL: a throwaway server of Debian's package, password logins over TCP ------------------------
PGPORT="$(free_port)"
PGPW="mn-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
mkdir -p "$WORK/pg" && chown postgres "$WORK/pg"
(cd / && runuser -u postgres -- "$PGBIN/initdb" -D "$WORK/pg/data" -U postgres --auth-local=trust \
  --auth-host=scram-sha-256 >/dev/null)
echo "host all all $PFX.0/24 scram-sha-256" >>"$WORK/pg/data/pg_hba.conf"
LISTEN=127.0.0.1; [ "$NETNS" = 1 ] && LISTEN="127.0.0.1,$STORE_HOST"
(cd / && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/log" -w \
  -o "-c listen_addresses=$LISTEN -p $PGPORT -k $WORK/pg" start >/dev/null)
psql_() { (cd / && runuser -u postgres -- "$PGBIN/psql" -q -h "$WORK/pg" -p "$PGPORT" -U postgres -c "$1"); }
psql_ "CREATE ROLE bisect LOGIN PASSWORD '$PGPW'"
psql_ "CREATE DATABASE optuna OWNER bisect"
psql_ "CREATE DATABASE mlflow OWNER bisect"
DB="postgresql://bisect:$PGPW@$STORE_HOST:$PGPORT"

# -- mlflow server on PostgreSQL, artifacts served over HTTP -----------------------------------------------
MPORT="$(free_port)"
(cd "$WORK" && exec setsid "$MLFLOW" server --backend-store-uri "$DB/mlflow" --artifacts-destination "$WORK/artifacts" \
  --host "$STORE_HOST" --port "$MPORT" --workers 1 >"$WORK/mlflow.log" 2>&1) &
PIDS+=("$!")
TRACKING="http://$STORE_HOST:$MPORT"
"$PY" - "$TRACKING" <<'PYEOF'
import sys, time, httpx
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        if httpx.get(sys.argv[1] + "/health", timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
sys.exit("mlflow server did not answer within 120 s")
PYEOF

# -- the study: the tiny scenario on the local engine, four distinct configs, target out of reach ---------
cat >"$WORK/multinode.yaml" <<'YAML'
name: multinode
scenario: tiny
dump_layer_ids: [1, 5, 9]
training_accuracy: 0.8992
engine:
  kind: local
  settings: {device: cpu, num_prompts: 1, warmup_prompts: 0, max_new_tokens: 32}
baseline: measure
criterion: {metric: accept_length, ratio: 100}
standalone:
  wirings: [{rule: "[:-1]", name: trained}]
  margin: 0.05
  samples: 4
  steps: 2
space:
  num_steps: {type: int, low: 1, high: 4}
# the model off: it would (rightly) skip every config of an unreachable target, and this check needs trials
search: {sampler: grid, seed: 0, max_live_trials: 6, max_wall_s: 240, repeats: 1, model: {enabled: false}}
YAML
export BISECT_EAGLE_HEARTBEAT_S=1 BISECT_EAGLE_GRACE_S=10 MLFLOW_TRACKING_URI="$TRACKING"
ARGS=("$WORK/multinode.yaml" --storage "$DB/optuna" --tracking-uri "$TRACKING" --study-name multinode --json)
on_node c "$BE" run "${ARGS[@]}"
CONTROLLER="${PIDS[-1]}"
on_node w1 "$BE" worker "${ARGS[@]}" --wait-s 240
WORKERS=("${PIDS[-1]}")
on_node w2 "$BE" worker "${ARGS[@]}" --wait-s 240
WORKERS+=("${PIDS[-1]}")

# -- SIGKILL the first worker seen in the middle of a live trial -------------------------------------------
"$PY" - "$TRACKING" "${WORKERS[@]}" <<'PYEOF' || { log "no worker ran a live trial"; show_logs; exit 1; }
import os, signal, sys, time
from mlflow import MlflowClient
client, workers = MlflowClient(sys.argv[1]), sys.argv[2:]
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    exp = client.get_experiment_by_name("multinode")
    runs = client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING' and tags.stage = 'live'") if exp else []
    for r in runs:
        pid = (r.data.tags.get("owner", "").split(":") + ["", ""])[1]
        if pid in workers:
            os.kill(int(pid), signal.SIGKILL)
            print(f"multinode_check: SIGKILLed worker pid {pid} during live trial {r.info.run_name}", file=sys.stderr)
            sys.exit(0)
    time.sleep(0.5)
sys.exit(1)
PYEOF

wait "$CONTROLLER" || true
for pid in "${WORKERS[@]}"; do wait "$pid" || true; done

# -- the verdict, from the stores over TCP ----------------------------------------------------------------
"$PY" - "$TRACKING" "$DB/optuna" <<'PYEOF'
import json, sys
from collections import Counter
from mlflow import MlflowClient
from bisect_eagle.search.study.claims import Claims
client = MlflowClient(sys.argv[1])
exp = client.get_experiment_by_name("multinode")
runs = client.search_runs([exp.experiment_id], max_results=1000)
live = [r for r in runs if r.data.tags.get("stage") == "live"]
measured = Counter(r.data.tags["fingerprint"] for r in live
                   if r.info.status == "FINISHED" and r.data.tags.get("outcome") in ("ok", "failed", "pruned"))
claims = Claims(sys.argv[2], "multinode").all()
space_size = 4  # num_steps 1..4 on one wiring
out = {"workers": 2, "trials": sum(measured.values()), "fingerprints": len(measured),
       "duplicates": sum(n - 1 for n in measured.values()),
       "lost": space_size - len(measured) + sum(c.state == "running" for c in claims),
       "reaped": sum("reaped_by" in r.data.tags for r in live),
       "runs_left_running": sum(r.info.status == "RUNNING" for r in runs),
       "owners": sorted({r.data.tags.get("owner", "").split(":")[0] for r in live})}
print(json.dumps(out))
sys.exit(0 if out["duplicates"] == out["lost"] == out["runs_left_running"] == 0 and out["reaped"] >= 1 else 1)
PYEOF
