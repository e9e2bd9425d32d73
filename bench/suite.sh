#!/bin/bash
# every workload twice, all eight policies, each in a loopback-only network namespace
# (Dynamo binds *): the commands behind bench/README.md "Predicted TTFT against every peer"
# (~85 minutes here). The two runs of one workload go side by side, so each policy's slot
# shares the machine with the same policy's slot of the twin run: with different
# workloads side by side, one stream's fleet start (eight engines, Dynamo's service) fell
# in the other's first slot alone, predicted_ttft's (s22: hop p50 6.4 against 3.4 ms).
# SUFFIX names the runs: ttft-<workload>-$SUFFIX-<n>.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SUFFIX=${SUFFIX:-s6}
P=predicted_ttft,round_robin,least_loaded,consistent_hash,sglang_cache_aware,llmd_weighted,dynamo_kv,prefix_aware
FLEET="--workers 8 --profile llama-3-8b@h100-80gb --time-scale 1"
RAG="--workload rag $FLEET --cache-fleet-ratio 1.5"
MC="--workload mooncake --duration-s 600 --sample-conversations 0.2 --arrival-scale 0.25 $FLEET"
MT="--workload multiturn $FLEET --cache-fleet-ratio 1.5"
AG="--workload agentic $FLEET --cache-fleet-ratio 1.5"
run() { unshare -n sh -c "ip link set lo up; $PY -m bench compare $1 --policies $P --name $2" > "/tmp/suite-$2.log" 2>&1; }
for W in "$RAG:rag" "$AG:agentic" "$MT:multiturn" "$MC:mooncake"; do
  run "${W%:*}" "ttft-${W##*:}-$SUFFIX-1" & run "${W%:*}" "ttft-${W##*:}-$SUFFIX-2" &
  wait
done
