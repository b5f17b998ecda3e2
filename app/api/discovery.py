"""Home Assistant finds the Wyoming server by mDNS: one `_wyoming._tcp.local.` service record.

This is what `wyoming-faster-whisper --zeroconf` announces (the `wyoming` package's
`HomeAssistantZeroconf`), with python-zeroconf (multicast on the LAN, no internet needed); Home
Assistant's Wyoming integration then offers the server under "Discovered". The record names
the host's address on the LAN and the port. Announcing is best effort: a host without a
multicast route (some containers) logs a warning and the server runs on, added by hand.

    STT_WYOMING_ZEROCONF=<name>   the instance name (default "stt-openvino"; empty = off)

Two servers with the same name on one LAN both announce (the second gets "<name> (2)").
"""

from __future__ import annotations

import contextlib
import logging
import socket

from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

log = logging.getLogger(__name__)

SERVICE_TYPE = "_wyoming._tcp.local."
MDNS_GROUP = "224.0.0.251"  # the address whose route gives the LAN interface


def lan_address(bind_host: str) -> str:
    """The address to announce: the bind address when it is one, else the interface that
    routes to the mDNS group (no packet is sent)."""
    if bind_host not in ("", "0.0.0.0", "::"):
        return socket.gethostbyname(bind_host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((MDNS_GROUP, 5353))
        return probe.getsockname()[0]


class WyomingAnnouncement:
    """Registers the service record on `start`, withdraws it on `stop`."""

    def __init__(self, name: str, port: int, bind_host: str) -> None:
        self.name, self.port, self.bind_host = name, port, bind_host
        self._zeroconf: AsyncZeroconf | None = None
        self._info: AsyncServiceInfo | None = None

    async def start(self) -> None:
        try:
            address = lan_address(self.bind_host)
            info = AsyncServiceInfo(
                SERVICE_TYPE,
                f"{self.name}.{SERVICE_TYPE}",
                addresses=[socket.inet_aton(address)],
                port=self.port,
            )
            zc = AsyncZeroconf(ip_version=IPVersion.V4Only)
            await zc.async_register_service(info, allow_name_change=True)
        except (OSError, ValueError, RuntimeError) as e:  # no multicast route, bad name, ...
            log.warning("Wyoming discovery (mDNS) is off: %s; add the server by hand", e)
            return
        self._zeroconf, self._info = zc, info
        log.info("Wyoming discovery: %s on %s:%d (mDNS)", info.name, address, self.port)

    async def stop(self) -> None:
        zc, info, self._zeroconf, self._info = self._zeroconf, self._info, None, None
        if zc is None or info is None:
            return
        with contextlib.suppress(Exception):  # shutting down: nothing to report to
            await zc.async_unregister_service(info)
        await zc.async_close()
