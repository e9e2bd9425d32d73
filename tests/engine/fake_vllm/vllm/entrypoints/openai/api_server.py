"""Stands in for `python -m vllm.entrypoints.openai.api_server` in launcher tests.

Serves /health, /metrics (vllm:cache_config_info with num_gpu_blocks, requests running) and
/slow?s=N (a request that stays in flight N seconds), writes its argv and the environment
the launcher set to FAKE_VLLM_RECORD, exits 0 on SIGTERM, or at once with FAKE_VLLM_EXIT.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

RUNNING = [0]
LOCK = threading.Lock()


def arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: str, status: int = 200) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/health":
            self._send("")
        elif url.path == "/metrics":
            self._send(
                "# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="{arg("--block-size", "16")}",'
                f'engine="0",num_gpu_blocks="1234"}} 1.0\n'
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="m"}} {RUNNING[0]}.0\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n')
        elif url.path == "/slow":
            with LOCK:
                RUNNING[0] += 1
            time.sleep(float(parse_qs(url.query).get("s", ["1"])[0]))
            with LOCK:
                RUNNING[0] -= 1
            self._send("done")
        else:
            self._send("", 404)


def main() -> None:
    record = os.environ.get("FAKE_VLLM_RECORD")
    if record:
        with open(record, "w") as out:
            json.dump({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in (
                "PYTHONHASHSEED", "LMCACHE_CONFIG_FILE", "VLLM_CPU_KVCACHE_SPACE")}}, out)
    if os.environ.get("FAKE_VLLM_EXIT"):
        sys.exit(int(os.environ["FAKE_VLLM_EXIT"]))
    server = ThreadingHTTPServer((arg("--host", "127.0.0.1"), int(arg("--port", "8000"))),
                                 Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    main()
