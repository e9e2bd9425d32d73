"""A tiny comparison end to end: real worker and router processes, two policies.

Checks that the result JSON is complete and that its figures are the workers' own:
the hit rate equals the workers' counters, per-worker requests add up to the total and
every request is accounted for.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench.cli import main
from bench.workloads import make_workload
from bench.workloads.mooncake import default_trace_path, load_trace

KEYS = {"meta", "requests", "duration_s", "ttft_ms", "e2e_ms", "worker_ttft_ms",
        "worker_e2e_ms", "tokens", "throughput", "hit_rate", "fleet_counters", "workers",
        "load", "router_cpu", "bounds", "records"}


def test_tiny_comparison(tmp_path: Path) -> None:
    main(["compare", "--workload", "rag", "--workers", "2", "--count", "36", "--rate", "6",
          "--docs", "12", "--doc-tokens", "800", "--cache-fleet-ratio", "1.5",
          "--time-scale", "0.1", "--policies", "round_robin,prefix_aware",
          "--out-dir", str(tmp_path), "--name", "tiny"])
    for label in ("round_robin", "prefix_aware"):
        res = orjson.loads((tmp_path / f"tiny-{label}.json").read_bytes())
        assert res.keys() >= KEYS
        assert res["requests"] == {"total": 36, "ok": 36, "error": 0, "timeout": 0,
                                   "not_sent": 0}
        assert len(res["records"]) == 36
        assert sorted(r["index"] for r in res["records"]) == list(range(36))
        fc, workers = res["fleet_counters"], res["workers"]
        # the reported hit rate is the workers' counters, exactly
        assert fc["prefix_cache_queries"] == sum(w["prefix_cache_queries"] for w in workers)
        assert fc["prefix_cache_hits"] == sum(w["prefix_cache_hits"] for w in workers)
        assert res["hit_rate"] == fc["prefix_cache_hits"] / fc["prefix_cache_queries"]
        # ...and agrees with what the clients were told in usage (no CPU tier, no preemption)
        assert fc["preemptions"] == 0
        assert res["tokens"]["cached"] == fc["prefix_cache_hits"]
        assert res["tokens"]["prompt"] == fc["prefix_cache_queries"]
        # every request is accounted for, per worker, by the workers and by the router
        assert sum(w["requests"] for w in workers) == 36
        assert sum(w["routed_by_header"] for w in workers) == 36
        assert all(w["requests"] == w["routed_by_header"] for w in workers)
        assert res["hit_rate"] <= res["bounds"]["unbounded_hit_rate"] + 1e-9
        assert res["ttft_ms"]["p50"] > 0 and res["router_cpu"]["us_per_request"] > 0
        # no warm-up request any more: the engines saw exactly the workload, and the first
        # request's engine TTFT is not negative (the sim's clock catches up when it starts)
        assert fc["request_success"] == 36
        assert res["worker_ttft_ms"]["mean"] > 0 and res["worker_ttft_ms"]["p50"] > 0
        # each request's engine TTFT and its engine server's, joined by response id: the
        # server's inside what the client waited (both are wall clocks)
        for r in res["records"]:
            client_ms = (r["first_token_s"] - r["sent_s"]) * 1000 / 0.1
            assert r["engine_ttft_ms"] > 0 and 0 < r["server_ttft_ms"] <= client_ms, r
        assert res["hop_ms"]["p50"] > 0 and res["engine_ttft_ms"]["p50"] > 0
        assert res["engine_server_ms"]["p50"] is not None
        assert res["meta"]["regime"] == "larger than one worker, smaller than the fleet"
        # the router's own counters: the engines' cached tokens it read back from usage,
        # every one (a usage object split across two reads of a stream is read too)
        assert res["router_counters"]["cached_tokens_actual_total"] == fc["prefix_cache_hits"]
    table = (tmp_path / "tiny.md").read_text()
    assert "python -m bench compare" in table and "| prefix_aware |" in table
    for png in ("tiny-ttft-cdf.png", "tiny-hit-p99.png", "tiny-load.png"):
        assert (tmp_path / png).stat().st_size > 10_000
    (tmp_path / "tiny-load.png").unlink()
    main(["replot", "--name", "tiny", "--out-dir", str(tmp_path)])  # same table from the files
    assert (tmp_path / "tiny.md").read_text() == table
    assert (tmp_path / "tiny-load.png").stat().st_size > 10_000


def test_context_hash_scopes() -> None:
    from bench.compare import parse_policy

    assert parse_policy("prefix_aware@0.25+hdr") == ("prefix_aware", 0.25, "all")
    assert parse_policy("prefix_aware@0.25+hdr1") == ("prefix_aware", 0.25, "first")
    assert parse_policy("round_robin") == ("round_robin", None, None)
    whole = make_workload("rag", count=200, seed=1, send_context_hash=True)
    first = make_workload("rag", count=200, seed=1, send_context_hash=True,
                          context_hash_scope="first")
    assert [r.prompt for r in whole] == [r.prompt for r in first]
    # "first": equal first documents <=> equal keys; "all": equal document lists <=> equal keys
    for reqs, part in ((first, lambda g: g.split(",")[0]), (whole, lambda g: g)):
        pairs = {(part(r.group), r.context_hash) for r in reqs}
        assert len(pairs) == len({p for p, _ in pairs}) == len({h for _, h in pairs})
    assert len({r.context_hash for r in first}) < len({r.context_hash for r in whole})


def test_workloads_are_deterministic() -> None:
    a = make_workload("rag", count=20, seed=3)
    b = make_workload("rag", count=20, seed=3)
    assert a == b and a != make_workload("rag", count=20, seed=4)
    assert make_workload("multiturn", conversations=5) == make_workload("multiturn",
                                                                        conversations=5)


@pytest.mark.skipif(not default_trace_path().exists(), reason="shared/traces not present")
def test_mooncake_unbounded_bound_is_36_6_percent() -> None:
    from bench.bounds import trace_block_hit_rate

    rate = trace_block_hit_rate(r["hash_ids"] for r in load_trace(default_trace_path()))
    assert round(100 * rate, 1) == 36.6
