#!/bin/bash
# every workload twice, all eight policies, each in a loopback-only network namespace
# (Dynamo binds *): the commands behind bench/README.md "Predicted TTFT against every peer".
# One comparison at a time by default (~170 minutes here), as the README's commands run:
# on two cores a second comparison beside it adds CPU contention that the client-side
# figures then measure (s23, agentic: p50 49 against llm-d's 46 ms with the twins side
# by side, 39 against 42 in a comparison of the two alone). STREAMS=2 runs the two runs of
# each workload side by side (~85 minutes), so each policy's slot shares the machine with
# the same policy's slot of its twin. SUFFIX names the runs: ttft-<workload>-$SUFFIX-<n>.
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
  if [ "${STREAMS:-1}" = 2 ]; then
    run "${W%:*}" "ttft-${W##*:}-$SUFFIX-1" & run "${W%:*}" "ttft-${W##*:}-$SUFFIX-2" &
    wait
  else
    run "${W%:*}" "ttft-${W##*:}-$SUFFIX-1"; run "${W%:*}" "ttft-${W##*:}-$SUFFIX-2"
  fi
done
