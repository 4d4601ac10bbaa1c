"""Pre-flight of ``--ray-address``: its form, then that something answers there."""

from __future__ import annotations

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError

# What --ray-address accepts besides host:port (with an optional scheme such as ray://).
RAY_ADDRESS_WORDS = ("auto", "local")


def check_ray_address_format(address: str) -> None:
    """``--ray-address``: ``auto``, ``local`` or ``[scheme://]host:port`` (Ray's own check comes only
    after start-up, as a traceback)."""
    if address in RAY_ADDRESS_WORDS:
        return
    target = address.split("://", 1)[-1].rstrip("/")
    host, _, port = target.rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise PreflightError(
            f"--ray-address {address} is not an address: give the head node's host:port (e.g. 127.0.0.1:6379, "
            "as `ray start --head` prints it), ray://host:10001 for Ray Client, or auto; omit --ray-address to "
            "start a local Ray"
        )


RAY_ADDRESS_TIMEOUT_S = 5.0


def check_ray_address(address: str, timeout: float = RAY_ADDRESS_TIMEOUT_S) -> None:
    """Raise ``ConnectionError`` unless something answers at ``--ray-address host:port`` within
    ``timeout`` seconds (``ray.init`` would wait forever). ``auto`` and addresses without a port
    are left to Ray."""
    import socket

    target = address.split("://", 1)[-1].rstrip("/")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(
            f"--ray-address {address}: nothing answers at {host}:{port} within {timeout:g}s "
            f"({exc.strerror or type(exc).__name__}); start the cluster (`ray start --head`), check the "
            "address with `ray status` on its head node, or omit --ray-address to start a local Ray"
        ) from None


def check_ray(config: RunConfig) -> None:
    if not config.ray_address:
        return
    check_ray_address_format(config.ray_address)
    try:
        check_ray_address(config.ray_address)
    except ConnectionError as exc:
        raise PreflightError(str(exc)) from None

