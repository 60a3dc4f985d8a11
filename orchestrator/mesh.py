"""The rank <-> mesh-coordinates contract, as the control plane imports it.

`MeshShape`, `Degrees` and `DIMS` live in `meshyard.mesh` (standard library only), so
that user code's `meshyard.train` computes ranks with the same arithmetic as the solver,
the runtime, the watchdog and the workers.
"""

from meshyard.mesh import DIMS, Degrees, MeshShape

__all__ = ["DIMS", "Degrees", "MeshShape"]
