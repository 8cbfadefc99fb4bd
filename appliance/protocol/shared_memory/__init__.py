"""Triton's shared-memory extensions, free of any transport.

    registry = SharedMemoryRegistry("local", SharedMemoryLimits(), LocalPeers(["127.0.0.0/8", "::1/128"]))
    registry.system.register("input0", "/input0", offset=0, byte_size=64, local=True)
    registry.system.status(local=True)          # [{"name", "key", "offset", "byte_size"}]
    registry.cuda.register("gpu0", raw_handle, device_id=0, byte_size=64, local=True)
    with await registry.bind(request, local=True, reserve=account.reserve) as binding:
        response = await model.infer(request)     # inputs were read from their regions
        await binding.write(response)             # outputs go into theirs
    registry.system.unregister(local=True)      # all system regions; a name for one
    registry.close()                            # at stop: everything

``local`` is the front end's word on whether the client is on this host (``local_peers`` decides it
the same way for every front end); ``client_shm`` (off, local, any) says whom that admits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from appliance.engine.types import InferRequest
from appliance.protocol.shared_memory.binding import Binding, bind
from appliance.protocol.shared_memory.cuda import CudaIpc, CudaSharedMemory
from appliance.protocol.shared_memory.params import shared_memory_ref
from appliance.protocol.shared_memory.peers import LocalPeers
from appliance.protocol.shared_memory.system import SHM_DIR, SystemSharedMemory
from appliance.protocol.shared_memory.table import CLIENT_SHM_MODES, RegionTable, SharedMemoryLimits

__all__ = [
    "CLIENT_SHM_MODES",
    "Binding",
    "CudaIpc",
    "CudaSharedMemory",
    "LocalPeers",
    "SharedMemoryLimits",
    "SharedMemoryRegistry",
    "SystemSharedMemory",
    "shared_memory_ref",
]


class SharedMemoryRegistry:
    """Every registered region, system and CUDA (one namespace, as in Triton)."""

    def __init__(self, client_shm: str, limits: SharedMemoryLimits, local_peers: LocalPeers, *,
                 directory: Path = SHM_DIR, cuda: CudaIpc | None = None) -> None:
        self._table = RegionTable(client_shm, limits)
        self.local_peers = local_peers
        self.system = SystemSharedMemory(self._table, directory)
        self.cuda = CudaSharedMemory(self._table, cuda if cuda is not None else CudaIpc())

    @property
    def client_shm(self) -> str:
        return self._table.client_shm

    def extensions(self) -> list[str]:
        """The server-metadata extensions this registry serves here."""
        names = []
        if self.system.enabled:
            names.append("system_shared_memory")
        if self.cuda.enabled:
            names.append("cuda_shared_memory")
        return names

    async def bind(self, request: InferRequest, *, local: bool, reserve: Callable[[int], None]) -> Binding:
        """See ``appliance.protocol.shared_memory.binding.bind``."""
        return await bind(self._table, request, local=local, reserve=reserve)

    def counts(self) -> tuple[int, int]:
        """(regions held open, their bytes): registered ones and unregistered ones still in use."""
        return self._table.counts()

    def close(self) -> None:
        """Unregister every region; refuse registrations from now on (the appliance is stopping)."""
        self._table.close()
