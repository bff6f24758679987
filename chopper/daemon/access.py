"""Access checks on every RPC of a Chopper gRPC server: size, rate, bearer token; refusals counted.

One ``grpc.ServerInterceptor`` wraps each method handler, before the servicer sees anything.
Per call, in this order:

1. **Rate**, per client and RPC: a token bucket of ``calls_per_s`` (``chopper.daemon.ratelimit``).
   The client is its certificate's common name over mutual TLS (from gRPC's auth context), else
   its IP address, and ``unix`` for the local socket (whose file mode and group decide who
   connects at all).
2. **Token**, for the RPCs in ``token_rpcs`` when a ``TokenFile`` is configured
   (``chopper.daemon.auth``): no bearer token is ``no_token``, one not in the file ``wrong_token``.
3. **Size** of each request message: over ``max_message_bytes`` is ``too_large``. The servers'
   gRPC core limit is twice that (``chopper.daemon.serving``), so the messages in between reach this
   check and are counted; gRPC refuses bigger ones itself, uncounted.
4. **Stream slots**, for every streaming RPC: a stream holds a server worker thread for its
   whole life, so streams take slots of ``chopper.daemon.ratelimit.StreamSlots`` (the server's worker
   pool has a reserve beyond them for calls that are not streams, ``chopper.daemon.serving``). Over
   the total is ``too_many_streams``; a client holding its share already, ``streams_per_client``.
   On the unix socket, where gRPC tells every caller apart from none other (the peer is
   ``unix:``), a client states its process id in the ``chopper-pid`` metadata and its streams
   count as that process's; a caller that states none shares the key ``unix`` with all others
   that do not. A slot is given back when the stream's handler returns (its last response sent,
   or the call ended).
5. **Stream rate**: each message of a client stream takes a token from that stream's own
   bucket of ``messages_per_s``.

A refusal is counted in ``Refusals`` by (RPC, reason), logged at most every 10 s per pair, and
answered with ``RESOURCE_EXHAUSTED`` (rate, size) or ``UNAUTHENTICATED`` (token) and a message
saying what to change. A trainer's marker stream cut this way costs only markers: the job-side
client drops and counts them, and never blocks or raises (``chopper.client``).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from chopper.daemon.auth import TokenFile, presented
from chopper.daemon.logs import LogGate
from chopper.daemon.ratelimit import RateLimiter, StreamSlots
from chopper.schema import PID_METADATA, UNREAD_METADATA

log = logging.getLogger(__name__)

REFUSAL_REASONS = {
    "rate_limited": "the client exceeded rate_limit_calls_per_s for this RPC, or its stream rate_limit_messages_per_s",
    "no_token": "a token-protected RPC (RequestCapture) came without an authorization: Bearer token",
    "wrong_token": "the bearer token is not one of the lines of the server's token_file",
    "too_large": "a request message over max_message_bytes (gRPC itself refuses those over twice that, uncounted)",
    "too_many_streams": "the server already held its most open streams; calls that are not streams keep a reserve",
    "streams_per_client": "the client (on the unix socket: the process named by chopper-pid) already held its most "
                          "open streams",
}
LOG_INTERVAL_S = 10.0


class TooLarge:
    """Stands in for a request message over the size limit, so the check can answer and count it."""

    def __init__(self, size: int) -> None:
        self.size = size


class Refusals:
    """Refused RPCs by (rpc, reason); safe from any thread."""

    def __init__(self) -> None:
        self._rpcs: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def rpc(self, rpc: str, reason: str) -> None:
        with self._lock:
            self._rpcs[(rpc, reason)] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        """A copy of the counts by (rpc, reason), for a scrape."""
        with self._lock:
            return dict(self._rpcs)


def client_identity(context: grpc.ServicerContext) -> str:
    """Who a call comes from, for rate limits: a verified certificate's ``cn:NAME``, an IP, or ``unix``."""
    names = (context.auth_context() or {}).get("x509_common_name")
    if names:
        return f"cn:{names[0].decode(errors='replace')}"
    peer = context.peer()
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return "unix"
    if kind in ("ipv4", "ipv6"):
        return f"{kind}:{rest.rsplit(':', 1)[0]}"
    return peer


def stream_client(client: str, metadata: Any) -> str:
    """The key a stream's slot is counted under: ``client``, or on the unix socket its stated process."""
    if client != "unix":
        return client  # a remote peer's stated process id would let it pick as many keys as it likes
    for key, value in metadata or ():
        if key == PID_METADATA and isinstance(value, str) and value.isdigit() and len(value) <= 10:
            return f"unix:pid={int(value)}"
    return client


class _Held:
    """A streaming response that gives its slot back when it ends, fails or is dropped by gRPC."""

    def __init__(self, responses: Iterator[Any], release: Callable[[], None]) -> None:
        self._responses = iter(responses)
        self._release: Callable[[], None] | None = release

    def __iter__(self) -> _Held:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._responses)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __del__(self) -> None:
        self.close()


def _sized(parse: Callable[[bytes], Any] | None, limit: int) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        if len(data) > limit:
            return TooLarge(len(data))
        return parse(data) if parse is not None else data

    return decode


class AccessControl(grpc.ServerInterceptor):
    """The checks of the module docstring, as a server interceptor.

    Args:
        refusals: Where refusals are counted.
        max_message_bytes: Largest request message accepted.
        calls_per_s: Calls per second per client and RPC (0: unlimited).
        messages_per_s: Messages per second per client stream (0: unlimited).
        tokens: Accepted bearer tokens; None: no RPC needs one.
        token_rpcs: Method names (``RequestCapture``) that need a token when ``tokens`` is set.
        streams: Slots of open streams; None: streams are not bounded here.
        clock: Monotonic seconds (injected in tests).
    """

    def __init__(self, refusals: Refusals, *, max_message_bytes: int, calls_per_s: float, messages_per_s: float,
                 tokens: TokenFile | None = None, token_rpcs: frozenset[str] = frozenset(),
                 streams: StreamSlots | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.refusals = refusals
        self.max_message_bytes = max_message_bytes
        self.calls = RateLimiter(calls_per_s, clock)
        self.messages = RateLimiter(messages_per_s, clock)
        self.tokens = tokens
        self.token_rpcs = token_rpcs if tokens is not None else frozenset()
        self.streams = streams
        self.clock = clock
        self._log_gate = LogGate(LOG_INTERVAL_S, clock)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        rpc = details.method.rsplit("/", 1)[-1]
        token = presented(details.invocation_metadata) if rpc in self.token_rpcs else None
        deserializer = _sized(handler.request_deserializer, self.max_message_bytes)
        if handler.request_streaming:
            field = "stream_stream" if handler.response_streaming else "stream_unary"
            inner = getattr(handler, field)

            def streaming(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                self._admit(rpc, token, context)
                release = self._hold(rpc, context)
                return self._run(release, handler.response_streaming, inner, self._metered(rpc, requests, context),
                                 context)

            return handler._replace(request_deserializer=deserializer, **{field: streaming})
        field = "unary_stream" if handler.response_streaming else "unary_unary"
        inner = getattr(handler, field)

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            self._admit(rpc, token, context)
            if isinstance(request, TooLarge):
                self._too_large(rpc, request, context)
            if not handler.response_streaming:
                return inner(request, context)
            return self._run(self._hold(rpc, context), True, inner, request, context)

        return handler._replace(request_deserializer=deserializer, **{field: unary})

    @staticmethod
    def _run(release: Callable[[], None], response_streaming: bool, inner: Callable[[Any, Any], Any], request: Any,
             context: grpc.ServicerContext) -> Any:
        """Call a stream's handler holding its slot: to its return, or to its responses' end."""
        try:
            response = inner(request, context)
        except BaseException:
            release()
            raise
        if response_streaming:
            return _Held(response, release)
        release()
        return response

    def _hold(self, rpc: str, context: grpc.ServicerContext) -> Callable[[], None]:
        """Take a stream slot for the call (or refuse it); returns what gives the slot back."""
        if self.streams is None:
            return lambda: None
        streams = self.streams
        key = stream_client(client_identity(context), context.invocation_metadata())
        reason = streams.acquire(key)
        if reason == "too_many_streams":
            self._refuse(context, rpc, reason, key, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"{rpc}: the server already holds its most open streams ({streams.total}); retry later "
                         "(calls that are not streams are still served)", unread=True)
        elif reason:
            self._refuse(context, rpc, reason, key, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"{rpc}: this client ({key}) already holds {streams.per_client} open streams, the most one "
                         "client may; close the streams it no longer needs", unread=True)
        return lambda: streams.release(key)

    def _admit(self, rpc: str, token: bytes | None, context: grpc.ServicerContext) -> None:
        client = client_identity(context)
        if not self.calls.admit((client, rpc)):
            self._refuse(context, rpc, "rate_limited", client, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"{rpc}: rate limit: more than {self.calls.rate:g} calls/s from this client ({client}); "
                         "call less often, or raise rate_limit_calls_per_s on the server", unread=True)
        if rpc not in self.token_rpcs:
            return
        assert self.tokens is not None
        if token is None:
            self._refuse(context, rpc, "no_token", client, grpc.StatusCode.UNAUTHENTICATED,
                         f"{rpc} needs a bearer token: pass --token-file FILE (or set CHOPPER_TOKEN_FILE) naming a "
                         "file that holds a token of the server's token_file", unread=True)
        elif not self.tokens.accepts(token):
            self._refuse(context, rpc, "wrong_token", client, grpc.StatusCode.UNAUTHENTICATED,
                         f"{rpc}: the bearer token is not accepted; --token-file must hold a token listed in the "
                         "server's token_file", unread=True)

    def _metered(self, rpc: str, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        bucket = self.messages.stream_bucket()
        for request in requests:
            if isinstance(request, TooLarge):
                self._too_large(rpc, request, context)
            if bucket is not None and not bucket.take(self.clock()):
                self._refuse(context, rpc, "rate_limited", client_identity(context),
                             grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"{rpc}: rate limit: this stream sent more than {bucket.rate:g} messages/s; put more in "
                             "each message, or raise rate_limit_messages_per_s on the server")
            yield request

    def _too_large(self, rpc: str, request: TooLarge, context: grpc.ServicerContext) -> None:
        self._refuse(context, rpc, "too_large", client_identity(context),
                     grpc.StatusCode.RESOURCE_EXHAUSTED,
                     f"{rpc}: a message of {request.size} bytes is over the server's max_message_bytes "
                     f"({self.max_message_bytes}); send smaller batches")

    def _refuse(self, context: grpc.ServicerContext, rpc: str, reason: str, client: str, code: grpc.StatusCode,
                message: str, *, unread: bool = False) -> None:
        """Count, log (at most every LOG_INTERVAL_S per RPC and reason) and end the call with ``code``.

        ``unread``: refused before any of the call's messages was read, which the trailing
        metadata ``UNREAD_METADATA`` tells the client (what it wrote was not taken in).
        """
        self.refusals.rpc(rpc, reason)
        if self._log_gate.due((rpc, reason)):
            log.warning("event=rpc_refused rpc=%s reason=%s client=%s", rpc, reason, client)
        if unread:
            context.set_trailing_metadata(((UNREAD_METADATA, "1"),))
        context.abort(code, message)
