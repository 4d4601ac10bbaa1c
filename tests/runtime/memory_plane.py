"""The in-memory data plane for tests of the roles' logic without Ray (relax.runtime.data.memory_plane)."""

from relax.runtime.data.memory_plane import MemoryDataPlane

__all__ = ["MemoryDataPlane"]
