"""`--rpc HOST:PORT:KEY`: where a TVM RPC tracker is and which key to ask it for. Parsed here,
below both the device backend (`opcompiler.rpc`) and the simulator client (`tune.remote`), so
neither imports the other for it."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import OpcError

SPEC_HELP = "HOST:PORT:KEY of a TVM RPC tracker, e.g. 127.0.0.1:9190:a100"


@dataclass(frozen=True, kw_only=True)
class RpcSpec:
    """Where the tracker is and which device key to ask it for."""

    host: str
    port: int
    key: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port}:{self.key}"


def parse_rpc(spec: str) -> RpcSpec:
    """`HOST:PORT:KEY` -> RpcSpec; anything else is an OpcError naming `--rpc`."""
    parts = spec.rsplit(":", 2) if isinstance(spec, str) else []
    if len(parts) != 3 or not all(parts):
        raise OpcError("not HOST:PORT:KEY", arg="--rpc", value=spec, expected=SPEC_HELP)
    host, port_s, key = parts
    try:
        port = int(port_s)
    except ValueError:
        raise OpcError(f"port {port_s!r} is not a number", arg="--rpc", value=spec, expected=SPEC_HELP) from None
    if not 0 < port < 65536:
        raise OpcError(f"port {port} is out of range", arg="--rpc", value=spec, expected="a port in 1..65535")
    return RpcSpec(host=host, port=port, key=key)
