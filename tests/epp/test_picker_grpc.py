"""The picker's side of the protocol, spoken to it directly over gRPC (no Envoy): the
subset hint, the destination header and metadata agreeing, refusals, health, and an
observer stream that arrives after the picking stream has ended."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.epp import protocol
from router.epp.observe import OBSERVER_METADATA
from router.server.decide import address
from tests.epp.conftest import MODEL, Gateway, start_gateway


@pytest.fixture(scope="module")
def picker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # a long grace: an exchange waiting for its observation stays open however slow CI is
    gw = start_gateway(tmp_path_factory.mktemp("picker"), fail_modes=(),
                       picker_args=("--epp-observe-grace-s", "120"))
    yield gw
    gw.stop()


def request_headers(subset: list[str] | None = None) -> ext_proc.ProcessingRequest:
    message = ext_proc.ProcessingRequest(request_headers=ext_proc.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions"),
            base_pb2.HeaderValue(key=":method", raw_value=b"POST")])))
    if subset is not None:
        hint = message.metadata_context.filter_metadata["envoy.lb.subset_hint"]
        hint.fields["x-gateway-destination-endpoint-subset"].list_value.values.add(
        ).string_value = subset[0]
        for endpoint in subset[1:]:
            hint.fields["x-gateway-destination-endpoint-subset"].list_value.values.add(
            ).string_value = endpoint
    return message


def body(payload: dict) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(
        body=json.dumps(payload).encode(), end_of_stream=True))


async def exchange(port: int, *messages: ext_proc.ProcessingRequest
                   ) -> list[ext_proc.ProcessingResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = ext_proc_grpc.ExternalProcessorStub(channel).Process()
        replies = []
        for message in messages:
            await call.write(message)
            replies.append(await call.read())
            if replies[-1].HasField("immediate_response"):
                break
        await call.done_writing()
        return replies


def destination(reply: ext_proc.ProcessingResponse) -> tuple[str, str]:
    mutation = reply.request_body.response.header_mutation
    header = next(h.header.raw_value.decode() for h in mutation.set_headers
                  if h.header.key == "x-gateway-destination-endpoint")
    meta = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields[
        "x-gateway-destination-endpoint"].string_value
    return header, meta


async def test_pick_lists_ranked_endpoints_in_header_and_metadata(picker: Gateway) -> None:
    replies = await exchange(picker.grpc_port, request_headers(),
                             body({"model": MODEL, "prompt": "hello " * 50}))
    header, meta = destination(replies[1])
    assert header == meta  # the protocol forbids the two to differ
    endpoints = header.split(",")
    assert sorted(endpoints) == sorted(address(s.url) for s in picker.sims)  # + fallbacks


async def test_subset_hint_limits_the_pick(picker: Gateway) -> None:
    allowed = address(picker.sims[2].url)
    for seed in range(5):  # contexts the ring would spread over all three
        replies = await exchange(picker.grpc_port, request_headers([allowed]),
                                 body({"model": MODEL, "prompt": f"ctx {seed} " * 80}))
        assert destination(replies[1])[0] == allowed


async def test_subset_with_no_routable_endpoint_is_503(picker: Gateway) -> None:
    replies = await exchange(picker.grpc_port, request_headers(["10.9.9.9:8000"]),
                             body({"model": MODEL, "prompt": "hello"}))
    immediate = replies[-1].immediate_response
    assert immediate.status.code == 503
    assert json.loads(immediate.body)["error"]["code"] == "no_worker_in_subset"


async def test_bad_body_is_an_immediate_400(picker: Gateway) -> None:
    bad = ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=b"{not json",
                                                                    end_of_stream=True))
    replies = await exchange(picker.grpc_port, request_headers(), bad)
    assert replies[-1].immediate_response.status.code == 400
    assert json.loads(replies[-1].immediate_response.body)["error"]["type"] == \
        "invalid_request_error"


async def test_held_headers_are_answered_with_the_pick_once_the_body_is_whole(
        picker: Gateway) -> None:
    """Envoy streaming the body without waiting for the headers' answer (the shipped
    config): nothing comes back until the body's last chunk, then the headers' answer
    carrying the pick (Envoy routes on it) and one answer per chunk, in that order."""
    headers = request_headers()
    headers.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.STREAMED
    headers.protocol_config.send_body_without_waiting_for_header_response = True
    payload = json.dumps({"model": MODEL, "prompt": "held " * 80}).encode()
    chunks = [ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(
        body=part, end_of_stream=last)) for part, last in
        ((payload[:40], False), (payload[40:], True))]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.grpc_port}") as channel:
        call = ext_proc_grpc.ExternalProcessorStub(channel).Process()
        await call.write(headers)
        await call.write(chunks[0])
        early = asyncio.ensure_future(call.read())
        done, _ = await asyncio.wait((early,), timeout=0.5)
        assert not done, "answered before the body was whole"
        await call.write(chunks[1])
        replies = [await early, await call.read(), await call.read()]
        await call.done_writing()
    assert [r.WhichOneof("response") for r in replies] == [
        "request_headers", "request_body", "request_body"]
    mutation = replies[0].request_headers.response.header_mutation
    header = next(h.header.raw_value.decode() for h in mutation.set_headers
                  if h.header.key == protocol.DESTINATION)
    assert header == replies[0].dynamic_metadata.fields[protocol.LB_NAMESPACE].struct_value \
        .fields[protocol.DESTINATION].string_value
    assert header.split(",")[0] in {address(s.url) for s in picker.sims}
    assert not replies[1].request_body.HasField("response")  # the body goes on unchanged


async def test_grpc_health_services(picker: Gateway) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def observation(exchange: str, body: bytes) -> ext_proc.ProcessingRequest:
    """What Envoy's observer filter sends: the body, the pick's metadata, no reply wanted."""
    message = ext_proc.ProcessingRequest(
        response_body=ext_proc.HttpBody(body=body, end_of_stream=True),
        observability_mode=True)
    message.metadata_context.filter_metadata[protocol.EXCHANGE_NAMESPACE].fields[
        protocol.EXCHANGE_KEY].string_value = exchange
    return message


async def test_observation_after_the_picking_stream_ended_is_still_learned(
        picker: Gateway) -> None:
    """A picker reading behind Envoy gets a request's end (its picking stream closes)
    before the observed body: it keeps the exchange open for it, then learns its usage
    and ends it; the same observation again finds nothing open."""
    usage_read = picker.picker_metric("prefix_router_cache_prediction_error_ratio_count")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.grpc_port}") as channel:
        stub = ext_proc_grpc.ExternalProcessorStub(channel)
        call = stub.Process(metadata=((OBSERVER_METADATA, "response-body"),))
        await call.write(request_headers())
        await call.read()
        await call.write(body({"model": MODEL, "prompt": "observed " * 60}))
        pick = await call.read()
        meta = pick.dynamic_metadata.fields[protocol.EXCHANGE_NAMESPACE].struct_value
        exchange = meta.fields[protocol.EXCHANGE_KEY].string_value
        endpoint = destination(pick)[0].split(",")[0]
        worker = next(s.name for s in picker.sims if address(s.url) == endpoint)
        served = ext_proc.ProcessingRequest(response_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[
                base_pb2.HeaderValue(key=":status", raw_value=b"200")])))
        served.attributes[protocol.ATTRIBUTES_NAMESPACE].fields[
            protocol.UPSTREAM_ADDRESS].string_value = endpoint
        await call.write(served)
        await call.read()
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK  # the picker has seen the end
        assert picker.picker_metric("prefix_router_worker_in_flight", worker=worker) == 1

        answer = json.dumps({"object": "text_completion", "choices": [], "usage": {
            "prompt_tokens": 61, "completion_tokens": 4, "total_tokens": 65,
            "prompt_tokens_details": {"cached_tokens": 0}}}).encode()
        for _ in range(2):  # no reply is written on an observer stream: it just ends
            observer = stub.Process()
            await observer.write(observation(exchange, answer))
            await observer.done_writing()
            assert await observer.code() == grpc.StatusCode.OK
    assert picker.settled_metric("prefix_router_worker_in_flight", 0, worker=worker) == 0
    assert picker.picker_metric("prefix_router_cache_prediction_error_ratio_count") == \
        usage_read + 1
    assert picker.picker_metric("prefix_router_epp_observations_total",
                                outcome="observed") == 1
    assert picker.picker_metric("prefix_router_epp_observations_total",
                                outcome="unmatched") == 1
