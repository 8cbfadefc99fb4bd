"""Admission over HTTP: the request's ``Host`` must name this box, then the data plane admits the
operation the matched route asks for (token, browser rules, the bound on requests in flight) before the
handler reads a byte of the body. Errors go through the error middleware."""

from __future__ import annotations

from aiohttp import web

from appliance.protocol.admission import Caller, Network, address_in
from appliance.protocol.operations import Operation
from appliance.rest.body import SIGNED_BODY
from appliance.rest.browser import browser_refusal, check_host
from appliance.rest.keys import CONFIG, DATAPLANE, OPERATIONS

__all__ = ["admission_middleware", "caller", "client_address"]

_CALLER = "appliance.caller"


def client_address(request: web.BaseRequest, trusted_proxies: tuple[Network, ...],
                   peer: str | None = None) -> str | None:
    """The client's address: the peer's (``peer``: ``request.remote``, when the caller has it), or, when
    the peer is a trusted proxy, the last address in X-Forwarded-For that is not one of the trusted
    proxies."""
    if peer is None:
        peer = request.remote
    if not trusted_proxies or not address_in(peer, trusted_proxies):
        return peer
    hops = [h.strip() for h in ",".join(request.headers.getall("X-Forwarded-For", [])).split(",") if h.strip()]
    for hop in reversed(hops):
        if not address_in(hop, trusted_proxies):
            return hop
    return hops[0] if hops else peer


def _caller(request: web.Request) -> Caller:
    peer = request.remote  # aiohttp asks the transport again on every read
    address = client_address(request, request.app[CONFIG].trusted_proxies, peer)
    direct = address == peer
    connected_to = None
    if direct and request.transport is not None:
        sockname = request.transport.get_extra_info("sockname")
        connected_to = sockname[0] if isinstance(sockname, tuple) and sockname else None
    return Caller(address, request.headers.get("Authorization"), connected_to=connected_to, direct=direct,
                  browser_refusal=browser_refusal(request), request_line=(request.method, request.raw_path))


def caller(request: web.Request) -> Caller:
    """The client of ``request``, as the admission middleware described it to the data plane."""
    found = request.get(_CALLER)
    return found if isinstance(found, Caller) else _caller(request)


@web.middleware
async def admission_middleware(request: web.Request, handler) -> web.StreamResponse:
    check_host(request, request.app[CONFIG].hosts)
    # Routes are told apart by the handler that matched, never by the path text (a path with %2F
    # decodes differently from how it routes); anything unlisted (a 404, static files) reads.
    operation = request.app[OPERATIONS].get(request.match_info.handler, Operation.DOCUMENTS)
    request[_CALLER] = who = _caller(request)
    with request.app[DATAPLANE].admit(operation, who) as signed_body:
        if signed_body is not None:  # a signed request: its body must be the one signed (rest/body.py)
            request[SIGNED_BODY] = signed_body
        return await handler(request)
