"""``python -m bench.null_picker PORT ENDPOINT``: an ext_proc picker that does no routing work.

It answers every message the way ``prefix-router epp`` does (and, like it, reads the
observer filter's without answering), on the same grpc.aio loop (uvloop), but with one
fixed endpoint and nothing decided or accounted: against it,
``python -m bench overhead --targets envoy_null_picker`` measures what the gRPC exchange
itself costs Envoy and a Python picker, the floor under ``envoy_picker``.
"""

from __future__ import annotations

import sys

import grpc
import uvloop
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

from router.epp import protocol


class NullPicker(ext_proc_grpc.ExternalProcessorServicer):
    def __init__(self, endpoint: str) -> None:
        self._replies: dict[str, ext_proc.ProcessingResponse] = {
            "request_headers": protocol.CONTINUE_HEADERS,
            "request_body": protocol.pick([endpoint]),
            "response_headers": protocol.CONTINUE_RESPONSE_HEADERS,
            "response_body": protocol.CONTINUE_RESPONSE_BODY,
        }

    async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext
                      ) -> None:
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            if message.observability_mode:  # the observer filter's: Envoy reads no reply
                if message.response_body.end_of_stream:
                    return  # the body's last chunk: done, as the picker is
                continue
            await context.write(self._replies[message.WhichOneof("request")])


async def serve(port: int, endpoint: str) -> None:
    server = grpc.aio.server()
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(NullPicker(endpoint), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), sys.argv[2]))
