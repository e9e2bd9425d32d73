"""The Endpoint Picker Protocol over Envoy's ext_proc messages: names, and the few replies.

Gateway API Inference Extension, docs/proposals/004-endpoint-picker-protocol:
- the picked endpoints go back as ``ip:port[,ip:port...]`` (primary first, then the ranked
  fallbacks the proxy tries in order) in the ``x-gateway-destination-endpoint`` request
  header and, with the same value, in dynamic metadata ``envoy.lb``;
- the gateway may restrict the pick to ``envoy.lb.subset_hint`` /
  ``x-gateway-destination-endpoint-subset`` in the request's metadata;
- the endpoint that served comes back as ``envoy.lb`` /
  ``x-gateway-destination-endpoint-served`` (this picker also reads Envoy's
  ``upstream.address`` attribute, which needs no gateway support);
- no ready endpoint is a 503 and a dropped request a 429, both as an ImmediateResponse.

This picker's own addition (router/epp/observe.py): each pick also names its exchange in
metadata ``prefix_router.epp`` / ``exchange``, so that a second ext_proc filter in
observability mode, which forwards that namespace with each response body chunk, can feed
the answer back to the exchange without Envoy waiting on the picker for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

DESTINATION = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
ATTRIBUTES_NAMESPACE = "envoy.filters.http.ext_proc"
UPSTREAM_ADDRESS = "upstream.address"
EXCHANGE_NAMESPACE = "prefix_router.epp"
EXCHANGE_KEY = "exchange"

CONTINUE_HEADERS = ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse())
CONTINUE_RESPONSE_HEADERS = ext_proc.ProcessingResponse(
    response_headers=ext_proc.HeadersResponse())
CONTINUE_RESPONSE_BODY = ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse())
CONTINUE_BODY = ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())


def headers(message: ext_proc.HttpHeaders) -> dict[str, str]:
    """Lower-case names -> values; Envoy sends values as ``raw_value`` bytes."""
    out: dict[str, str] = {}
    for header in message.headers.headers:
        out[header.key] = header.raw_value.decode("latin-1") if header.raw_value \
            else header.value
    return out


def subset_hint(request: ext_proc.ProcessingRequest) -> list[str] | None:
    """The endpoints the gateway allows, or None when it sent no hint."""
    namespace = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace.fields:
        return None
    return _addresses(namespace.fields[SUBSET_KEY])


def served_endpoint(request: ext_proc.ProcessingRequest) -> str | None:
    """Which endpoint answered: the protocol's metadata, else Envoy's upstream address."""
    namespace = request.metadata_context.filter_metadata.get(LB_NAMESPACE)
    if namespace is not None and SERVED_KEY in namespace.fields:
        found = _addresses(namespace.fields[SERVED_KEY])
        if found:
            return found[0]
    attributes = request.attributes.get(ATTRIBUTES_NAMESPACE)
    if attributes is not None and UPSTREAM_ADDRESS in attributes.fields:
        return attributes.fields[UPSTREAM_ADDRESS].string_value or None
    return None


def pick(endpoints: Iterable[str], exchange: str = "", on_headers: bool = False
         ) -> ext_proc.ProcessingResponse:
    """Where to send the request, in the header and the metadata: the answer to its body,
    or ``on_headers`` to its headers (held until the body came: see router/epp/exchange.py);
    ``exchange``: the id an observer filter's messages will carry back."""
    value = ",".join(endpoints)
    metadata = struct_pb2.Struct()
    metadata.fields[LB_NAMESPACE].struct_value.fields[DESTINATION].string_value = value
    if exchange:
        metadata.fields[EXCHANGE_NAMESPACE].struct_value.fields[EXCHANGE_KEY].string_value = \
            exchange
    common = ext_proc.CommonResponse(
        header_mutation=ext_proc.HeaderMutation(set_headers=[_header(DESTINATION, value)]))
    if on_headers:
        return ext_proc.ProcessingResponse(
            request_headers=ext_proc.HeadersResponse(response=common), dynamic_metadata=metadata)
    return ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse(response=common),
                                       dynamic_metadata=metadata)


def exchange_id(request: ext_proc.ProcessingRequest) -> str:
    """The exchange a forwarded ``prefix_router.epp`` namespace names ("" when none)."""
    namespace = request.metadata_context.filter_metadata.get(EXCHANGE_NAMESPACE)
    if namespace is None or EXCHANGE_KEY not in namespace.fields:
        return ""
    return namespace.fields[EXCHANGE_KEY].string_value


def response_headers(extra: Mapping[str, str]) -> ext_proc.ProcessingResponse:
    """Continue with headers added to the client's response (which worker, and why)."""
    mutation = ext_proc.HeaderMutation(set_headers=[_header(k, v) for k, v in extra.items()])
    return ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse(
        response=ext_proc.CommonResponse(header_mutation=mutation)))


def immediate(status: int, body: bytes, headers: Mapping[str, str] | None = None
              ) -> ext_proc.ProcessingResponse:
    """The gateway answers the client itself (a refusal): status, JSON body, headers."""
    mutation = ext_proc.HeaderMutation(set_headers=[
        _header(k, v) for k, v in {"content-type": "application/json", **(headers or {})}.items()])
    return ext_proc.ProcessingResponse(immediate_response=ext_proc.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), headers=mutation, body=body,
        details="prefix_router_picker"))


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def _addresses(value: struct_pb2.Value) -> list[str]:
    """A list value, or one comma-separated string."""
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [v.string_value.strip() for v in value.list_value.values if v.string_value]
    if kind == "string_value":
        return [a.strip() for a in value.string_value.split(",") if a.strip()]
    return []
