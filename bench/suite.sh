#!/bin/bash
# every workload twice, all eight policies, two comparisons at a time, each in a
# loopback-only network namespace (Dynamo binds *): the commands behind bench/README.md
# "Where it stands" (~75 minutes here). SUFFIX names the runs: ttft-<workload>-$SUFFIX-<n>.
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
( run "$MC" "ttft-mooncake-$SUFFIX-1"; run "$MC" "ttft-mooncake-$SUFFIX-2"; run "$MT" "ttft-multiturn-$SUFFIX-2" ) &
( run "$RAG" "ttft-rag-$SUFFIX-1"; run "$AG" "ttft-agentic-$SUFFIX-1"; run "$MT" "ttft-multiturn-$SUFFIX-1"
  run "$RAG" "ttft-rag-$SUFFIX-2"; run "$AG" "ttft-agentic-$SUFFIX-2" ) &
wait
