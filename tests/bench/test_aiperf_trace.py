"""The trace aiperf replays is the bench's own Mooncake sample, row for row.

aiperf itself is not run here (its own venv, not part of ``make test``); what is checked
is the file handed to it: the same requests the ``mooncake`` workload builds, in order,
with their prompt text (one block per hash id), output lengths and scaled arrival times
intact after a write and read back.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench.aiperf_replay import aiperf_rows, write_trace
from bench.workloads import make_workload
from bench.workloads.mooncake import MooncakeConfig, default_trace_path, load_trace, select

OPTS = {"duration_s": 120.0, "sample_conversations": 0.2, "arrival_scale": 0.25, "seed": 3}


@pytest.mark.skipif(not default_trace_path().exists(), reason="shared/traces not present")
def test_aiperf_trace_is_the_bench_sample(tmp_path: Path) -> None:
    selected = select(load_trace(default_trace_path()), MooncakeConfig(**OPTS))
    path = tmp_path / "trace.jsonl"
    write_trace(path, aiperf_rows(selected, OPTS["arrival_scale"]))
    back = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    bench = make_workload("mooncake", **OPTS)

    assert len(back) == len(bench) == len(selected) > 10
    assert [r["text_input"] for r in back] == [b.prompt for b in bench]
    assert [r["output_length"] for r in back] == [b.max_tokens for b in bench]
    # aiperf's fixed schedule is in ms; the bench's arrivals are in simulated seconds
    assert [r["timestamp"] / 1000.0 for r in back] == pytest.approx([b.arrival_s for b in bench],
                                                                     abs=1e-3)
    assert set(back[0]) == {"timestamp", "text_input", "output_length"}
