"""Meta-World 3.1.1 under MuJoCo 4: the mocap-weld reset writes 11 values per equality constraint, MuJoCo 4 stores 12.

Meta-World's ``SawyerMocapBase.reset_mocap_welds`` assigns an 11-value row to ``model.eq_data[i]``; MuJoCo 4 widened
``eq_data`` to ``mujoco.mjNEQDATA`` = 12 values, so every task fails at build with ``ValueError: could not broadcast
input array from shape (11,) into shape (12,)``. The shim writes the same 11 values into the first 11 slots and
leaves the rest as the model compiled them; with 11-value MuJoCo (3.x) nothing is patched.
"""

from __future__ import annotations

import mujoco
import numpy as np

#: The 11-value weld row Meta-World 3.1.1 writes, copied from its source.
WELD_ROW = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 5.0])

_ORIGINAL = None  # Meta-World's own reset_mocap_welds, kept while the shim is in place


def needs_shim(n_eq_data: int | None = None) -> bool:
    """Whether Meta-World's 11-value weld row does not fit this MuJoCo's ``eq_data`` width (default: the installed
    ``mujoco.mjNEQDATA``)."""
    n = int(getattr(mujoco, "mjNEQDATA", len(WELD_ROW))) if n_eq_data is None else int(n_eq_data)
    return n != len(WELD_ROW)


def _reset_mocap_welds(self) -> None:
    # Same loop as Meta-World's, writing only the slots its row has.
    model = self.model
    if model.nmocap > 0 and model.eq_data is not None:
        for i in range(model.eq_data.shape[0]):
            if model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                model.eq_data[i, : len(WELD_ROW)] = WELD_ROW


def apply_shim(n_eq_data: int | None = None) -> bool:
    """Patch ``SawyerMocapBase.reset_mocap_welds`` when :func:`needs_shim`; idempotent. Returns whether the
    shim is in place afterwards. Imports Meta-World (call it before building a task)."""
    global _ORIGINAL
    from metaworld.sawyer_xyz_env import SawyerMocapBase

    if not needs_shim(n_eq_data):
        return _ORIGINAL is not None
    if _ORIGINAL is None:
        _ORIGINAL = SawyerMocapBase.reset_mocap_welds
        SawyerMocapBase.reset_mocap_welds = _reset_mocap_welds
    return True


def remove_shim() -> None:
    """Restore Meta-World's own method (tests)."""
    global _ORIGINAL
    if _ORIGINAL is not None:
        from metaworld.sawyer_xyz_env import SawyerMocapBase

        SawyerMocapBase.reset_mocap_welds = _ORIGINAL
        _ORIGINAL = None


def is_applied() -> bool:
    """Whether the shim currently replaces Meta-World's method."""
    return _ORIGINAL is not None
