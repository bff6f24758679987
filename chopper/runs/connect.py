"""How the ``chopper`` commands reach an agent: plaintext, TLS or mutual TLS, with a bearer token.

The options come from flags or, for each, an environment variable: ``--tls-ca``
(``CHOPPER_TLS_CA``), ``--tls-cert`` (``CHOPPER_TLS_CERT``), ``--tls-key`` (``CHOPPER_TLS_KEY``),
``--token-file`` (``CHOPPER_TOKEN_FILE``). TLS is used when a CA or a client certificate is given.
The token is read from its file (a token in a flag would show in ``ps``) and sent on every call
as ``authorization: Bearer``; the agent checks it on the RPCs that need one. It is never sent in
clear text over the network: a token with a plaintext TCP target that is not loopback is refused
before connecting.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chopper.daemon.auth import metadata, read_client_token
from chopper.daemon.settings import ConfigError, is_loopback
from chopper.daemon.tls import ClientTLS

if TYPE_CHECKING:
    import grpc

OPTIONS = (
    ("tls_ca", "CHOPPER_TLS_CA", "PEM CA bundle that signs the agent's certificate: connect over TLS"),
    ("tls_cert", "CHOPPER_TLS_CERT", "PEM client certificate, for an agent that requires mutual TLS (with --tls-key)"),
    ("tls_key", "CHOPPER_TLS_KEY", "PEM private key of --tls-cert"),
    ("token_file", "CHOPPER_TOKEN_FILE", "file holding the bearer token for RequestCapture (chopper capture)"),
)


def _bearer(token: str) -> Any:
    """A client interceptor that adds the bearer token to every call's metadata (grpc imported late)."""
    import grpc

    class Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(details._replace(metadata=(*(details.metadata or ()), *metadata(token))), request)

        intercept_unary_stream = intercept_unary_unary
        intercept_stream_unary = intercept_unary_unary
        intercept_stream_stream = intercept_unary_unary

    return Bearer()


@dataclass(frozen=True)
class ClientSecurity:
    """TLS files and bearer token of a client; the default is plaintext without a token."""

    tls: ClientTLS | None = None
    token: str = ""

    def check(self, target: str) -> None:
        """Refuse a token that would travel in clear text over the network.

        Raises:
            ConfigError: ``target`` is plaintext TCP to a host other than loopback.
        """
        if self.token and self.tls is None and not _local(target):
            raise ConfigError(f"--token-file: refusing to send the token in clear text to {target}; use the agent's "
                              "unix socket, or TLS with --tls-ca")

    def channel(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A channel to ``target`` with this security (``check`` first).

        Raises:
            ConfigError: See ``check``.
        """
        import grpc

        self.check(target)
        if self.tls is not None:
            channel = grpc.secure_channel(target, self.tls.credentials(), options=list(options))
        else:
            channel = grpc.insecure_channel(target, options=list(options))
        return grpc.intercept_channel(channel, _bearer(self.token)) if self.token else channel


def _local(target: str) -> bool:
    if target.startswith("unix:"):
        return True
    host = target.removeprefix("dns:///").rpartition(":")[0]
    return is_loopback(host)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The TLS and token flags of a subcommand that talks to an agent."""
    for name, env, help_text in OPTIONS:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar="FILE",
                            help=f"{help_text} (env {env})")


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ClientSecurity:
    """The ``ClientSecurity`` of parsed flags, each falling back to its environment variable.

    Raises:
        ConfigError: A file is unreadable or not PEM, a cert comes without its key, or the
            token file is empty.
    """
    env = os.environ if env is None else env
    values = {name: getattr(args, name, None) or env.get(var, "") for name, var, _ in OPTIONS}
    tls = None
    if values["tls_ca"] or values["tls_cert"] or values["tls_key"]:
        tls = ClientTLS(values["tls_ca"], values["tls_cert"], values["tls_key"])
    token = read_client_token(values["token_file"]) if values["token_file"] else ""
    return ClientSecurity(tls, token)
