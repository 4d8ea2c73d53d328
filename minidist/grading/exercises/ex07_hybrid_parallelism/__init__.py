"""Exercise 07, a device mesh built by hand: ``mesh_coords`` (a rank's place in a row-major
grid), ``mesh_groups`` (one sub-communicator per dimension, from ``comm.split``) and, as the
stretch part, ``sync_gradients`` (gradients averaged over the dp dimension only).

The reference is torch's ``init_device_mesh`` layout (``ranks.py``): ranks in C order, the
last dimension fastest, and along dimension d one group of every rank that shares all its
other coordinates, ordered by its d coordinate. ``mesh_groups`` runs in launched worlds of
6 and 8 ranks on 3D, 2D and 1D shapes, names in any order. ``md.DeviceMesh``, the mesh
module's arithmetic, ``HybridGPT`` and torch's ``init_device_mesh`` are out of reach (the
sandbox's ``MESH`` rule).
"""

from ...engine.sandbox import MESH
from ...engine.spec import Exercise, GradedTest
from . import checks

EXERCISE = Exercise("07_hybrid_parallelism", (
    GradedTest("test_mesh_coords", 2, ("mesh_coords",), checks.check_mesh_coords, rules=(MESH,)),
    GradedTest("test_mesh_groups", 4, ("mesh_groups",), checks.check_mesh_groups, rules=(MESH,)),
    GradedTest("test_sync_gradients", 3, ("sync_gradients",), checks.check_sync_gradients,
               rules=(MESH,), part="stretch"),
))
