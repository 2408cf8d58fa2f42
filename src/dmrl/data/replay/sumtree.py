"""Sum tree for proportional prioritized replay (Schaul et al. 2016, appendix B.2.1), vectorised over a batch.

An array-backed complete binary tree of float64: node 1 is the root, node i has children 2i and 2i+1, and the
leaves are nodes P .. 2P-1 where P is the capacity rounded up to a power of two. Leaf P + j holds the value of
item j; leaves j >= capacity stay zero, so they never add mass and are never found. Every operation touches one
node per level for each item of a batch, and the whole batch moves through the levels together as numpy
arrays, so a batch of B costs O(B log n) work in O(log n) numpy calls.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    """Leaf values v_j >= 0 for j in [0, capacity), their sum, and a search by prefix sum.

    Values are whatever the caller samples proportionally to (the replay buffer stores p_j^alpha).
    """

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int | np.integer) or capacity < 1:
            raise ValueError(f"SumTree capacity: got {capacity!r}; must be an int >= 1")
        self.capacity = int(capacity)
        self._n_leaves = 1 << (self.capacity - 1).bit_length()  # P, a power of two >= capacity
        self._depth = self._n_leaves.bit_length() - 1  # levels below the root; P = 2**depth
        self._tree = np.zeros(2 * self._n_leaves, dtype=np.float64)  # index 0 unused
        self._max = 1.0  # new items get this; 1.0 until an update sets something larger (PER's p_max)

    @property
    def total(self) -> float:
        """Sum of all leaf values."""
        return float(self._tree[1])

    @property
    def max_value(self) -> float:
        """Largest value ever written by `update` (1.0 before any); a running max, like PER's p_max, so new
        items are sampled at least as often as any item has been."""
        return self._max

    def _check_indices(self, indices: np.ndarray, name: str) -> np.ndarray:
        indices = np.asarray(indices)
        if indices.ndim != 1 or (indices.size and not np.issubdtype(indices.dtype, np.integer)):
            raise ValueError(f"SumTree {name} indices: got {indices.dtype} {indices.shape}; must be 1-d integers")
        indices = indices.astype(np.int64, copy=False)
        if indices.size and (indices.min() < 0 or indices.max() >= self.capacity):
            raise ValueError(
                f"SumTree {name} indices: got values in [{indices.min()}, {indices.max()}]; "
                f"must be in [0, {self.capacity})"
            )
        return indices

    def get(self, indices: np.ndarray) -> np.ndarray:
        """Leaf values: indices (B,) int -> (B,) float64."""
        return self._tree[self._n_leaves + self._check_indices(indices, "get")]

    def update(self, indices: np.ndarray, values: np.ndarray | float) -> None:
        """Set leaf values: indices (B,) int in [0, capacity), values (B,) or scalar, finite and >= 0.

        A repeated index takes its last value in the batch (as a loop of single updates would).
        """
        indices = self._check_indices(indices, "update")
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), indices.shape)
        if indices.size == 0:
            return
        if not np.all(np.isfinite(values)) or values.min() < 0:
            raise ValueError(
                f"SumTree update values: got min {values.min()}, all finite: "
                f"{bool(np.all(np.isfinite(values)))}; must be finite and >= 0"
            )
        # numpy does not promise which write wins for repeated indices in a fancy assignment, so keep the last
        # occurrence of each explicitly: np.unique on the reversed array returns each index's first position there.
        uniq, first_in_reversed = np.unique(indices[::-1], return_index=True)
        values = values[::-1][first_in_reversed]
        self._tree[self._n_leaves + uniq] = values
        self._max = max(self._max, float(values.max()))
        # Recompute parents level by level; `nodes` stays sorted, so halving makes duplicates adjacent and
        # dropping them is O(B) instead of another sort.
        nodes = self._n_leaves + uniq
        for _ in range(self._depth):
            nodes = nodes >> 1
            nodes = nodes[np.concatenate(([True], nodes[1:] != nodes[:-1]))]
            self._tree[nodes] = self._tree[2 * nodes] + self._tree[2 * nodes + 1]

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """Leaf index j with cumsum(v)[j-1] <= u < cumsum(v)[j] for each u: prefix_sums (B,) in [0, total)
        -> (B,) int64 in [0, capacity), always a leaf with v_j > 0.

        Values at or beyond `total` (including the case u == total from round-off in the caller) are clipped
        to just below it. Raises if the tree is empty (total == 0).
        """
        total = self._tree[1]
        if not total > 0:
            raise ValueError("SumTree find: total is 0; update some values to > 0 before sampling")
        u = np.asarray(prefix_sums, dtype=np.float64)
        if u.ndim != 1:
            raise ValueError(f"SumTree find prefix_sums: got shape {u.shape}; must be (B,)")
        u = np.clip(u, 0.0, np.nextafter(total, 0.0))
        tree = self._tree
        nodes = np.ones(u.shape, dtype=np.int64)
        for _ in range(self._depth):
            left = tree[2 * nodes]
            right = tree[2 * nodes + 1]
            # A parent is the float sum of its children, so u - left can land at or just past `right`; never
            # step into a zero-mass right child (empty slots, padding leaves) whatever round-off says.
            go_right = (u >= left) & (right > 0)
            u = np.where(go_right, u - left, u)
            nodes = 2 * nodes + go_right
            # Keep u strictly inside the chosen child's mass so the next level sees a consistent query.
            u = np.minimum(u, np.nextafter(tree[nodes], 0.0))
        return nodes - self._n_leaves
