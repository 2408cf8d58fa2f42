"""Replay ring and prioritized replay: sum tree against brute force, PER frequencies and weights, shared memory."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from dmrl.data.replay import ReplayBuffer, ReplayConfig, ReplayHandle, SumTree

SPEC = {"obs": ((2, 3), np.float32), "action": ((4, 2), np.float32), "done": ((4,), np.bool_)}


def _items(ids: np.ndarray) -> dict[str, np.ndarray]:
    """Items whose every field encodes the item id, so a sampled row says which item it is."""
    ids = np.asarray(ids, dtype=np.float32)
    return {
        "obs": np.broadcast_to(ids[:, None, None], (len(ids), 2, 3)).copy(),
        "action": np.broadcast_to(-ids[:, None, None], (len(ids), 4, 2)).copy(),
        "done": np.broadcast_to((ids % 2 == 1)[:, None], (len(ids), 4)).copy(),
    }


def _sampled_ids(buf: ReplayBuffer, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    idx, batch, _ = buf.sample(n, np.random.default_rng(seed))
    ids = batch["obs"][:, 0, 0].astype(np.int64)
    np.testing.assert_array_equal(batch["action"], -batch["obs"][:, :1, :1].repeat(4, 1).repeat(2, 2))
    np.testing.assert_array_equal(batch["done"][:, 0], ids % 2 == 1)
    return idx, ids


def _write_in_child(handle: ReplayHandle, first_id: int, n: int) -> None:
    """Collector side of the shared-memory test; module level so a spawned process can import it."""
    buf = ReplayBuffer.attach(handle)
    for start in range(first_id, first_id + n, 3):  # several small adds, like a collector stepping envs
        buf.add(_items(np.arange(start, min(start + 3, first_id + n))))
    buf.close()


# --- sum tree ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1, 5, 37, 64])
def test_sumtree_matches_brute_force(capacity):
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    expected = np.zeros(capacity)
    running_max = 1.0
    for _ in range(20):
        idx = rng.integers(0, capacity, size=rng.integers(1, 2 * capacity + 2))  # duplicates on purpose
        vals = rng.uniform(0, 2, size=idx.shape) * (rng.random(idx.shape) > 0.3)  # ~30% zeros
        tree.update(idx, vals)
        for i, v in zip(idx, vals, strict=True):  # the reference: a loop of single updates, last write wins
            expected[i] = v
        running_max = max(running_max, float(expected.max()))  # of values stored, not overwritten in-batch
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), expected)
        assert tree.total == pytest.approx(expected.sum(), rel=1e-12, abs=1e-12)
        if expected.sum() == 0:
            continue
        cum = np.cumsum(expected)
        u = rng.uniform(0, tree.total, size=500)
        np.testing.assert_array_equal(tree.find(u), np.searchsorted(cum, u, side="right"))
    assert tree.max_value == running_max


def test_sumtree_never_finds_empty_leaves():
    tree = SumTree(1000)
    vals = np.full(1000, 0.1)
    vals[[0, 1, 500, 997, 998, 999]] = 0.0  # zero-mass leaves at both ends and in the middle
    tree.update(np.arange(1000), vals)
    total = tree.total
    edges = np.cumsum(vals)
    u = np.concatenate([edges, edges - 1e-15, [0.0, total, np.nextafter(total, 0), total * 2, -1.0]])
    found = tree.find(u)
    assert found.min() >= 0 and found.max() < 1000
    assert np.all(vals[found] > 0)
    assert found[-4] == found[-3] == found[-2] == 996  # at/above total: the last non-empty leaf


def test_sumtree_rejects_bad_input():
    tree = SumTree(4)
    with pytest.raises(ValueError, match="total is 0"):
        tree.find(np.array([0.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.update(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError, match=r"must be in \[0, 4\)"):
        tree.update(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)


# --- prioritized sampling ------------------------------------------------------------------------------------


def test_prioritized_frequencies_follow_priorities():
    buf = ReplayBuffer(SPEC, ReplayConfig(capacity=8, alpha=0.6))
    buf.add(_items(np.arange(8)))
    td = np.array([0.0, 0.5, 1.0, 2.0, 0.1, 4.0, 0.25, 3.0])
    buf.update_priorities(np.arange(8), td)
    p = (np.abs(td) + 1e-6) ** 0.6
    expected = p / p.sum()
    rng = np.random.default_rng(0)
    counts = np.zeros(8)
    for _ in range(200):
        idx, batch, _ = buf.sample(1000, rng)
        np.testing.assert_array_equal(batch["obs"][:, 0, 0], idx)  # rows come from the sampled slots
        counts += np.bincount(idx, minlength=8)
    n = counts.sum()
    chi2 = float(((counts - n * expected) ** 2 / (n * expected)).sum())
    assert chi2 < 24.3, (chi2, counts / n, expected)  # 7 dof: p = 0.001; stratification only lowers it
    assert counts[0] < 20  # |td| = 0 keeps only eps^alpha: expected 6 of 200k draws, rare but never impossible


def test_importance_weights_match_formula():
    cfg = ReplayConfig(capacity=16, alpha=0.7, beta0=0.4)
    buf = ReplayBuffer(SPEC, cfg)
    buf.add(_items(np.arange(10)))
    td = np.linspace(0.01, 5.0, 10)
    buf.update_priorities(np.arange(10), td)
    idx, _, w = buf.sample(64, np.random.default_rng(1), progress=0.5)
    beta = 0.4 + 0.6 * 0.5
    prob = (td[idx] + cfg.eps) ** cfg.alpha / ((td + cfg.eps) ** cfg.alpha).sum()
    direct = (10 * prob) ** -beta
    assert w.dtype == np.float32 and w.shape == (64,)
    np.testing.assert_allclose(w, direct / direct.max(), rtol=1e-6)
    assert w.max() == 1.0


def test_beta_anneals_to_one():
    buf = ReplayBuffer(SPEC, ReplayConfig(capacity=8, beta0=0.4, beta_steps=10))
    buf.add(_items(np.arange(4)))
    rng = np.random.default_rng(0)
    betas = []
    for _ in range(15):
        betas.append(buf.beta())
        buf.sample(4, rng)
    np.testing.assert_allclose(betas[:11], 0.4 + 0.06 * np.arange(11))
    assert betas[10:] == [1.0] * 5
    assert buf.beta(progress=0.0) == 0.4 and buf.beta(progress=1.0) == 1.0
    with pytest.raises(ValueError, match="progress"):
        buf.sample(4, rng, progress=1.5)


def test_new_items_get_max_priority():
    buf = ReplayBuffer(SPEC, ReplayConfig(capacity=8, alpha=1.0))
    buf.add(_items(np.arange(3)))
    np.testing.assert_array_equal(buf.priorities(np.arange(8)), [1, 1, 1, 0, 0, 0, 0, 0])
    buf.update_priorities(np.array([0, 1]), np.array([5.0, 0.5]))
    buf.update_priorities(np.array([0]), np.array([0.2]))  # p_max stays the largest ever seen, as in PER
    buf.add(_items(np.arange(3, 5)))
    np.testing.assert_allclose(buf.priorities(np.arange(5)), [0.2, 0.5, 1.0, 5.0, 5.0], rtol=1e-5)
    with pytest.raises(ValueError, match="NaN or inf"):
        buf.update_priorities(np.array([0]), np.array([np.nan]))


# --- ring and uniform mode -----------------------------------------------------------------------------------


@pytest.mark.parametrize("prioritized", [True, False])
def test_ring_keeps_newest_capacity_items(prioritized):
    buf = ReplayBuffer(SPEC, ReplayConfig(capacity=5, prioritized=prioritized))
    buf.add(_items(np.arange(3)))
    buf.add(_items(np.arange(3, 7)))  # wraps: slots 3, 4, 0, 1
    assert (buf.n_written, len(buf), buf.pos) == (7, 5, 2)
    idx, ids = _sampled_ids(buf, 500)
    assert set(ids) == {2, 3, 4, 5, 6}
    np.testing.assert_array_equal(ids % 5, idx)
    buf.add(_items(np.arange(7, 19)))  # more than capacity in one call: only the last 5 stay
    assert (buf.n_written, len(buf), buf.pos) == (19, 5, 4)
    idx, ids = _sampled_ids(buf, 500, seed=1)
    assert set(ids) == {14, 15, 16, 17, 18}
    np.testing.assert_array_equal(ids % 5, idx)


def test_uniform_mode():
    buf = ReplayBuffer(SPEC, ReplayConfig(capacity=100, prioritized=False))
    buf.add(_items(np.arange(40)))
    counts = np.zeros(40)
    rng = np.random.default_rng(0)
    for _ in range(20):
        idx, _, w = buf.sample(1000, rng)
        assert np.all(w == 1.0) and idx.max() < 40
        counts += np.bincount(idx, minlength=40)
    assert counts.min() > 400 and counts.max() < 600  # expected 500 each, sd ~22
    buf.update_priorities(idx, np.ones(1000))  # a no-op, so algorithms need not branch on the mode


def test_empty_and_bad_batches():
    buf = ReplayBuffer(SPEC, ReplayConfig(capacity=4))
    with pytest.raises(ValueError, match="no synced items"):
        buf.sample(2, np.random.default_rng(0))
    good = _items(np.arange(2))
    with pytest.raises(ValueError, match="missing key 'done'"):
        buf.add({k: v for k, v in good.items() if k != "done"})
    with pytest.raises(ValueError, match=r"add\['action'\]: got shape \(2, 4, 3\)"):
        buf.add({**good, "action": np.zeros((2, 4, 3), np.float32)})
    with pytest.raises(ValueError, match=r"add\['done'\]: got dtype float64"):
        buf.add({**good, "done": np.zeros((2, 4))})
    with pytest.raises(RuntimeError, match="shared=True"):
        buf.handle()


@pytest.mark.parametrize(
    ("field", "value"),
    [("capacity", 0), ("capacity", 1.5), ("alpha", -0.1), ("beta0", 1.5), ("beta_steps", 0), ("eps", 0.0)],
)
def test_bad_config_values(field, value):
    with pytest.raises(ValueError, match=f"ReplayConfig.{field}: got") as err:
        ReplayConfig(**{field: value})
    assert "\n" not in str(err.value)


# --- shared memory -------------------------------------------------------------------------------------------


def test_spawned_collector_writes_into_shared_ring():
    buf = ReplayBuffer(SPEC, ReplayConfig(capacity=8), shared=True)
    blocks = list(buf.handle().blocks.values())
    try:
        buf.add(_items(np.arange(2)))
        buf.update_priorities(np.array([0, 1]), np.array([3.0, 0.1]))  # p_max = (3 + eps)^0.6
        proc = mp.get_context("spawn").Process(target=_write_in_child, args=(buf.handle(), 2, 10))
        proc.start()
        proc.join(timeout=60)
        assert proc.exitcode == 0
        assert buf.n_written == 12 and len(buf) == 8  # the counter is shared...
        assert np.all(buf.priorities(np.arange(8))[[2, 3]] == 0)  # ...the tree is not, until sync
        assert buf.sync() == 10
        np.testing.assert_allclose(buf.priorities(np.arange(8)), (3.0 + 1e-6) ** 0.6)
        idx, ids = _sampled_ids(buf, 400)
        assert set(ids) == set(range(4, 12)) and np.all(ids % 8 == idx)
        assert buf.sync() == 0

        reader = ReplayBuffer.attach(buf.handle())  # an attached copy writes, but has no tree
        with pytest.raises(RuntimeError, match="only the creating process"):
            reader.sample(2, np.random.default_rng(0))
        with pytest.raises(RuntimeError, match="call close"):
            reader.unlink()
        reader.close()
    finally:
        buf.close()
        buf.unlink()
    assert not any(os.path.exists(f"/dev/shm/{name}") for name in blocks)
