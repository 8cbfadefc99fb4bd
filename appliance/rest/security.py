"""Admission over HTTP: the request's ``Host`` must name this box, then the data plane admits the
operation the matched route asks for (token, browser rules, the bound on requests in flight) before the
handler reads a byte of the body; a signed request's body must be the one signed, whatever the handler
does with it. Errors go through the error middleware. ``http_caller`` describes a request's client from
its headers and connection, for aiohttp's routes and the infer lane alike."""

from __future__ import annotations

from aiohttp import web
from multidict import MultiMapping

from appliance.protocol.admission import Caller, Network, address_in
from appliance.protocol.operations import Operation
from appliance.rest.body import SIGNED_BODY, read_body
from appliance.rest.browser import browser_refusal, check_host
from appliance.rest.http_basics import transport_address
from appliance.rest.keys import CONFIG, DATAPLANE, OPERATIONS
from appliance.security.fleet_signature import EMPTY_BODY, FleetVerifier

__all__ = ["admission_middleware", "caller", "client_address", "http_caller"]

_CALLER = web.RequestKey("appliance.caller", Caller)


def client_address(headers: MultiMapping[str], peer: str | None, trusted_proxies: tuple[Network, ...]) -> str | None:
    """The client's address: the connection's ``peer``, or, when the peer is a trusted proxy, the last
    address in X-Forwarded-For that is not one of the trusted proxies."""
    if not trusted_proxies or not address_in(peer, trusted_proxies):
        return peer
    hops = [h.strip() for h in ",".join(headers.getall("X-Forwarded-For", [])).split(",") if h.strip()]
    for hop in reversed(hops):
        if not address_in(hop, trusted_proxies):
            return hop
    return hops[0] if hops else peer


def http_caller(headers: MultiMapping[str], peer: str | None, local: str | None, request_line: tuple[str, str],
                trusted_proxies: tuple[Network, ...]) -> Caller:
    """The client of one HTTP request: ``peer`` and ``local`` are its connection's two addresses (None
    where the transport has none), ``request_line`` its method and target as sent."""
    address = client_address(headers, peer, trusted_proxies)
    direct = address == peer
    return Caller(address, headers.get("Authorization"), connected_to=local if direct else None, direct=direct,
                  browser_refusal=browser_refusal(headers), request_line=request_line)


def _caller(request: web.Request) -> Caller:
    local = transport_address(request.transport, "sockname") if request.transport is not None else None
    return http_caller(request.headers, request.remote, local, (request.method, request.raw_path),
                       request.app[CONFIG].trusted_proxies)


def caller(request: web.Request) -> Caller:
    """The client of ``request``, as the admission middleware described it to the data plane."""
    found = request.get(_CALLER)
    return found if isinstance(found, Caller) else _caller(request)


@web.middleware
async def admission_middleware(request: web.Request, handler) -> web.StreamResponse:
    check_host(request.headers, request.app[CONFIG].hosts)
    # Routes are told apart by the handler that matched, never by the path text (a path with %2F
    # decodes differently from how it routes); anything unlisted (a 404, static files) reads.
    operation = request.app[OPERATIONS].get(request.match_info.handler, Operation.DOCUMENTS)
    request[_CALLER] = who = _caller(request)
    with request.app[DATAPLANE].admit(operation, who) as signed_body:
        if signed_body is None:
            return await handler(request)
        return await _serve_signed(request, handler, signed_body)


async def _serve_signed(request: web.Request, handler, signed_body: str) -> web.StreamResponse:
    """Serve a signed request whose body must have the digest ``signed_body``, in every case: a handler
    that reads the body checks it as it reads (rest/body.py, which then takes SIGNED_BODY off the
    request); one that would not read it (nothing came, or it takes no body) must not skip the check."""
    if not request.can_read_body:
        # Nothing came or will come (no body, Content-Length: 0, a chunked body already ended with no
        # chunk): the empty body, checked before the handler acts, as a handler may not read it at all.
        FleetVerifier.check_body(signed_body, EMPTY_BODY)
        return await handler(request)
    request[SIGNED_BODY] = signed_body
    response = await handler(request)
    if SIGNED_BODY in request:
        # The handler did not read the body (a GET): its answer leaves only if that body is the one signed.
        with request.app[DATAPLANE].account() as account:
            await read_body(request, account, request.app[CONFIG].body)
    return response
