"""``python -m bench engine``: the engine-side claims RAG teams are told, measured.

One module per claim (utilisation, prefix_sharing, beam, swap, block_size, real_vllm), each
a function ``run(profiles, quick) -> list[Table]`` over the simulator (engine_worker/sim) driven
offline on simulated time, so the numbers are the model's and reruns are identical.
"""
