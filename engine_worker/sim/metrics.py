"""vLLM's Prometheus metrics for one simulated engine, on its own registry (no globals).

prometheus_client appends ``_total`` to counter names, so ``vllm:prefix_cache_queries`` is
exposed as ``vllm:prefix_cache_queries_total`` exactly as vLLM exposes it. Latency
histograms observe simulated seconds (not scaled by --time-scale) so that benchmarks read
the latency the modelled GPU would have.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class EngineMetrics:
    def __init__(self, model_name: str, block_size: int, num_gpu_blocks: int,
                 enable_prefix_caching: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, lab = self.registry, ["model_name"]
        self.prefix_queries = Counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in tokens.", lab, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in tokens.", lab, registry=r)
        self.external_queries = Counter("vllm:external_prefix_cache_queries",
                                        "CPU-tier (connector) queries, in tokens.", lab,
                                        registry=r)
        self.external_hits = Counter("vllm:external_prefix_cache_hits",
                                     "CPU-tier (connector) hits, in tokens.", lab, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent.",
                              lab, registry=r)
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.",
                             lab, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                             lab, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Time to first token (simulated seconds).", lab,
                              buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "End-to-end request latency (simulated seconds).", lab,
                             buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", lab,
                                     registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens.", lab,
                                         registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative preemptions.", lab,
                                   registry=r)
        self.request_success = Counter("vllm:request_success", "Finished requests.",
                                       [*lab, "finished_reason"], registry=r)
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     ["block_size", "num_gpu_blocks", "enable_prefix_caching", "model_name"],
                     registry=r)
        info.labels(block_size=str(block_size), num_gpu_blocks=str(num_gpu_blocks),
                    enable_prefix_caching=str(enable_prefix_caching),
                    model_name=model_name).set(1)
        self.model_name = model_name
        # the labelled children, made once: .labels() per token is most of a decode step
        self._children = {metric: metric.labels(model_name=model_name) for metric in (
            self.prefix_queries, self.prefix_hits, self.external_queries, self.external_hits,
            self.kv_usage, self.running, self.waiting, self.ttft, self.e2e,
            self.prompt_tokens, self.generation_tokens, self.preemptions)}

    def m(self, metric):
        return self._children[metric]

    def render(self) -> bytes:
        return generate_latest(self.registry)


