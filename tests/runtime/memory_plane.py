"""The in-memory data plane for tests of the roles' logic without Ray (relax.runtime.memory_plane)."""

from relax.runtime.memory_plane import MemoryDataPlane

__all__ = ["MemoryDataPlane"]
