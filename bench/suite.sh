#!/bin/bash
# two streams of comparisons, each in a loopback-only network namespace (Dynamo binds *)
# the commands behind bench/README.md "Predicted TTFT against every peer"; ~70 minutes here
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
P=predicted_ttft,round_robin,least_loaded,consistent_hash,sglang_cache_aware,llmd_weighted,dynamo_kv,prefix_aware
FLEET="--workers 8 --profile llama-3-8b@h100-80gb --time-scale 1"
RAG="--workload rag $FLEET --cache-fleet-ratio 1.5"
MC="--workload mooncake --duration-s 600 --sample-conversations 0.2 --arrival-scale 0.25 $FLEET"
MT="--workload multiturn $FLEET --cache-fleet-ratio 1.5"
AG="--workload agentic $FLEET --cache-fleet-ratio 1.5"
run() { unshare -n sh -c "ip link set lo up; $PY -m bench compare $1 --policies $P --name $2" > "/tmp/suite-$2.log" 2>&1; }
( run "$RAG" ttft-rag-1; run "$RAG" ttft-rag-2; run "$AG" ttft-agentic-1; run "$MT" ttft-multiturn-1 ) &
( run "$MC" ttft-mooncake-1; run "$MC" ttft-mooncake-2 ) &
wait
