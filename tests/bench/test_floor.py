"""bench.floor: each request's least TTFT (alone, idle engine, every earlier prompt cached)."""

from __future__ import annotations

import random

from bench.floor import (
    NEAR_MS,
    excess,
    habits,
    pushed_requests,
    report,
    sent_mid_decode,
    ttft_floor_ms,
    why_pushed,
)
from bench.workloads import BenchRequest
from bench.workloads.text import words
from engine_worker.sim.engine import Engine
from engine_worker.sim.engine_config import EngineConfig
from engine_worker.sim.profiles import load_profile
from engine_worker.sim.tokenizer import SimTokenizer

PROFILE = "llama-3-8b@h100-80gb"


def text(name: str, n: int) -> str:
    return words(n, random.Random(name))  # n tokens exactly


def requests() -> list[BenchRequest]:
    document = text("doc", 6000)
    prompts = [(document + text("q", 40), 6040),    # cold: the whole document
               (document + text("r", 40), 6040),    # the document again, a new question
               (text("other", 2000), 2000),         # a shorter cold prompt
               (text("long", 12000), 12000)]        # a longer cold one
    return [BenchRequest(index=i, arrival_s=0.0, prompt=p, prompt_tokens=n, max_tokens=8)
            for i, (p, n) in enumerate(prompts)]


def test_floor_counts_only_what_no_earlier_prompt_holds() -> None:
    floor = ttft_floor_ms(requests(), PROFILE)
    assert set(floor) == {0, 1, 2, 3}
    assert floor[1] < floor[0] / 5  # the document is cached: only the question's tail
    assert floor[2] < floor[0] < floor[3]  # cold: grows with the prompt


def test_no_engine_starts_a_request_sooner_than_its_floor() -> None:
    """The same requests at once on one engine (queued, its own cache): none beats its
    floor."""
    reqs = requests()
    floor = ttft_floor_ms(reqs, PROFILE)
    engine = Engine(PROFILE, EngineConfig(num_gpu_blocks=4096, max_model_len=16384,
                                          hash_seed="0"))
    tokenizer = SimTokenizer(load_profile(PROFILE).model.vocab)
    handles = [engine.add_request(tokenizer.encode(r.prompt), r.max_tokens, arrival=0.0)
               for r in reqs]
    while not all(h.done for h in handles):
        assert engine.step() is not None
    for r, h in zip(reqs, handles, strict=True):
        assert h.stats.first_token is not None
        assert h.stats.first_token * 1000.0 >= floor[r.index] - 1e-6
    assert handles[3].stats.first_token * 1000.0 > floor[3] + 100  # it queued behind three


def test_excess_and_pushed_read_requests_against_their_floor() -> None:
    floor = {0: 100.0, 1: 100.0, 2: 20.0, 3: 300.0, 4: 150.0}
    # engine times: 0 and 4 met their floor, 1 queued 200 ms, 2 missed its cache (250 ms)
    engine = {0: 102.0, 1: 300.0, 2: 250.0, 3: 305.0, 4: 150.0}
    e = excess(engine, floor)
    assert e["near"] == 3 / 5
    assert e["p50"] == 5.0
    # the client's median is 250 ms: 1 and 3 lie above it; 1's floor lies far under it,
    # 3's above it
    client = {0: 107.0, 1: 305.0, 2: 250.0, 3: 310.0, 4: 155.0}
    assert pushed_requests(client, floor) == {1}
    floor[3] = 250.0 - NEAR_MS + 1  # within a hop of the median: carried, not pushed
    assert pushed_requests(client, floor) == {1}
    floor[3] = 250.0 - NEAR_MS - 1
    assert pushed_requests(client, floor) == {1, 3}


def record(index: int, worker: str | None, sent: float, first: float, end: float,
           status: str = "ok", engine_ms: float | None = None) -> dict[str, object]:
    return {"index": index, "worker": worker, "sent_s": sent, "first_token_s": first,
            "end_s": end, "status": status, "engine_ttft_ms": engine_ms}


def test_sent_mid_decode_sees_only_the_same_workers_streams_past_their_first_token() -> None:
    records = [
        record(0, "w0", 0.0, 1.0, 5.0),   # w0 decodes 0 from 1.0 to 5.0
        record(1, "w0", 0.5, 2.0, 3.0),   # sent while 0 still prefilled: not mid-decode
        record(2, "w0", 4.0, 4.5, 6.0),   # sent while 0 (and no other) decoded
        record(3, "w1", 2.0, 2.5, 3.0),   # another worker, idle
        record(4, "w0", 6.0, 6.5, 7.0),   # after 0 and 2 ended: idle (end is exclusive)
        record(5, "w0", 2.5, 9.0, 9.5, status="error"),  # failed: not counted
        record(6, None, 2.5, 3.0, 4.0),   # a peer's record names no worker
    ]
    assert sent_mid_decode(records) == {0: False, 1: False, 2: True, 3: False, 4: False}


def test_habits_names_the_requests_pushed_in_most_runs() -> None:
    floor = {0: 100.0, 1: 100.0, 2: 20.0, 3: 100.0, 4: 150.0}

    def run(ttfts: dict[int, float]) -> dict[str, dict[str, object]]:
        return {"p": {"meta": {"time_scale": 1.0}, "records": [
            record(i, "w0", 0.0, t / 1000.0, 1.0) for i, t in ttfts.items()]}}

    # median 250 ms in each: 1 is pushed in all three runs, 4 in two, 3 in one
    runs = [run({0: 107.0, 1: 305.0, 2: 250.0, 3: 110.0, 4: 400.0}),
            run({0: 107.0, 1: 305.0, 2: 250.0, 3: 300.0, 4: 155.0}),
            run({0: 107.0, 1: 305.0, 2: 250.0, 3: 110.0, 4: 400.0})]
    table = habits(["a", "b", "c"], runs, floor)
    assert "| p | 3 | 2.0 | – | 2 | 1, 4 |" in table  # the records carry no engine TTFT
    # a policy in one run of the three: its habits are that run's
    runs[1]["q"] = runs[1]["p"]
    assert "| q | 1 | 2.0 | – | 2 | 1, 3 |" in habits(["a", "b", "c"], runs, floor)
    # with the engines' TTFT the causes read per run: all sent at once to one worker, every
    # pushed one waited behind a prompt of the same instant
    for results in runs:
        for r in results["p"]["records"]:
            r["engine_ttft_ms"] = 1000.0 * r["first_token_s"]
    assert "| p | 3 | 2.0 | 2.0 / 0.0 / 0.0 / 0.0 | 2 | 1, 4 |" \
        in habits(["a", "b", "c"], runs, floor)


def test_why_pushed_tells_a_tick_a_queue_a_miss_and_a_hop_apart() -> None:
    floor = {i: 100.0 for i in range(8)}
    records = [
        record(0, "w0", 10.000, 10.500, 11.0, engine_ms=500.0),  # cold, long: the one ahead
        record(1, "w0", 10.004, 10.800, 11.0, engine_ms=105.0),  # 4 ms after it: same tick
        record(2, "w1", 20.000, 20.600, 21.0, engine_ms=600.0),  # older work on w1
        record(3, "w1", 20.300, 20.900, 21.0, engine_ms=110.0),  # 300 ms later: queued
        record(4, "w2", 30.000, 30.400, 31.0, engine_ms=390.0),  # idle w2, 290 ms over: missed
        record(5, "w3", 40.000, 40.125, 41.0, engine_ms=110.0),  # idle, engine near its floor
        record(6, "w3", 39.999, 40.500, 41.0, engine_ms=500.0, status="error"),  # failed: not
        # ahead of 5, though sent to its worker just before it
        record(7, "w3", 40.001, 40.020, 41.0, engine_ms=100.0),  # behind 5, not pushed
    ]
    result = {"meta": {"time_scale": 1.0}, "records": records}
    assert why_pushed(result, {1, 3, 4, 5}, floor) == {"tick": 1, "queued": 1, "missed": 1,
                                                       "near": 1}
    assert why_pushed(result, {7}, floor) == {"tick": 1}  # 5 was still prefilling
    # a peer's records (no worker named) cannot say
    records[3]["worker"] = None
    assert why_pushed(result, {1, 3}, floor) is None


def test_report_row_says_why_each_was_pushed_and_what_the_hop_added() -> None:
    floor = {i: 100.0 for i in range(5)}
    records = [  # client TTFT 120, 110, 400, 598, 130 ms; engine 5-10 ms under each
        record(0, "w0", 0.0, 0.120, 1.0, engine_ms=110.0),
        record(1, "w1", 0.0, 0.110, 1.0, engine_ms=105.0),
        record(2, "w2", 0.0, 0.400, 1.0, engine_ms=395.0),   # idle w2, cold: missed
        record(3, "w2", 0.002, 0.600, 1.0, engine_ms=590.0),  # behind 2, same instant
        record(4, "w3", 0.0, 0.130, 1.0, engine_ms=125.0),
    ]
    table = report("run", {"p": {"meta": {"time_scale": 1.0}, "records": records}}, floor)
    row = table.splitlines()[-1]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # median 130 ms: 2 and 3 crossed it; client over engine 10 / 5 / 5 / 8 / 5 ms
    assert cells[0] == "p" and cells[2] == "2"
    assert cells[-2] == "1 / 0 / 1 / 0"
    assert cells[-1].startswith("5.0 / ")
