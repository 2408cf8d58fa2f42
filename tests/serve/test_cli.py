"""``dmrl serve`` as a robot stack runs it: a process with a ready line, SIGTERM / SIGINT shutdown that closes every
client with 1001 and exits 0; the --onnx planner with per-client noise; bad flags exit 2 with one line."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from serve_helpers import direct_actions, state_obs

from dmrl.cli import main
from dmrl.policies.checkpoint import load_policy
from dmrl.serve.client import PolicyClient

SRC = Path(__file__).resolve().parents[2] / "src"


def _start(*flags: str) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dmrl", "serve", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    if not ready:
        proc.kill()
        raise AssertionError("dmrl serve printed no ready line in 60 s")
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise AssertionError(f"dmrl serve exited {proc.returncode}: {proc.stderr.read()}")
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen, client: PolicyClient, sig: int) -> str:
    from websockets.exceptions import ConnectionClosed

    proc.send_signal(sig)
    with pytest.raises(ConnectionClosed) as e:
        client.conn.recv(timeout=10)
    assert e.value.rcvd is not None and e.value.rcvd.code == 1001  # going away
    assert proc.wait(10) == 0
    return proc.stderr.read()


def test_serve_process_acts_like_the_policy_and_stops_on_sigterm(state_checkpoint):
    proc, ready = _start("--checkpoint", str(state_checkpoint))
    try:
        assert ready["planner"] == "torch" and ready["obs_keys"] == ["state"] and ready["url"].startswith("ws://")
        steps = state_obs(4, 6)
        client = PolicyClient(ready["url"])
        client.reset(seed=5)
        got = np.stack([client.act(o) for o in steps])
        client.act(steps[0])  # mid-episode when the signal comes
        log = _stop(proc, client, signal.SIGTERM)
    finally:
        proc.kill()
        proc.wait(10)
    assert "client 1 connected" in log and "shutting down: closing 1 connection(s)" in log
    torch.set_num_threads(1)
    np.testing.assert_array_equal(got, direct_actions(load_policy(state_checkpoint)[0], [(5, steps)])[0])


def test_sigint_stops_dmrl_serve_cleanly(state_checkpoint, capsys):
    """In this process (signal handlers run on the main thread): a client thread acts, then sends SIGINT to us."""
    from websockets.exceptions import ConnectionClosed

    with socket.socket() as s:  # a free port for the server to take
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen: dict[str, object] = {}

    def robot() -> None:
        try:
            for _ in range(200):  # until the server listens
                try:
                    client = PolicyClient(f"ws://127.0.0.1:{port}", timeout=10)
                    break
                except OSError:
                    time.sleep(0.05)
            seen["connected"] = True
            client.reset(seed=1)
            seen["action"] = client.act(state_obs(0, 1)[0])
            os.kill(os.getpid(), signal.SIGINT)
            try:
                client.conn.recv(timeout=10)
            except ConnectionClosed as e:
                seen["code"] = e.rcvd.code if e.rcvd is not None else None
        except Exception as e:  # noqa: BLE001 - reported by the asserts below
            seen["error"] = repr(e)
            if seen.get("connected"):  # the server runs: stop it (never signal pytest once main has returned)
                os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=robot)
    thread.start()
    code = main(["serve", "--checkpoint", str(state_checkpoint), "--port", str(port)])
    thread.join(20)
    assert code == 0 and "error" not in seen, seen
    assert seen["code"] == 1001 and np.asarray(seen["action"]).shape == (3,)
    assert json.loads(capsys.readouterr().out.splitlines()[0])["url"] == f"ws://127.0.0.1:{port}"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # pytest's handler is back


def test_onnx_planner_gives_each_client_its_own_noise(state_checkpoint, tmp_path):
    from dmrl.export import OnnxPlanner, export_onnx
    from dmrl.serve.cli import ServeConfig, load_host
    from dmrl.serve.server import PolicyServer

    pytest.importorskip("onnxruntime")
    policy = load_policy(state_checkpoint)[0]
    graph = tmp_path / "policy.onnx"
    export_onnx(policy, graph)
    episodes = {"a": (3, state_obs(6, 9)), "b": (8, state_obs(7, 9))}
    host = load_host(ServeConfig(checkpoint=state_checkpoint, onnx=graph))  # what `dmrl serve --onnx` serves
    with PolicyServer(host, port=0) as server:
        clients = {k: PolicyClient(server.url) for k in episodes}
        assert clients["a"].info["planner"] == "onnxruntime"
        for k, (seed, _) in episodes.items():
            clients[k].reset(seed=seed)
        got: dict[str, list] = {k: [] for k in episodes}
        for t in range(9):  # interleaved: each client's noise is its own generator's
            for k, (_, steps) in episodes.items():
                got[k].append(clients[k].act(steps[t]))
        for c in clients.values():
            c.close()
    for k, (seed, steps) in episodes.items():
        policy.set_planner(OnnxPlanner(graph, seed=seed))
        policy.reset()
        want = np.stack([policy.act(o) for o in steps])
        np.testing.assert_array_equal(np.stack(got[k]), want)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--checkpoint", "no/such/dir"], "checkpoint no/such/dir: missing config.json"),
        (["--port", "70000"], "--port: got 70000; allowed 0 .. 65535"),
        (["--onnx", "x.onnx", "--inference-steps", "2"], "--inference-steps applies to the torch planner"),
        (["--onnx", "missing.onnx"], "onnx model missing.onnx: no such file"),
        (["--max-clients", "0"], "--max-clients and --cpu-threads must be >= 1"),
        (["--action-steps", "9"], "--action-steps: got 9; allowed 1 .. 7"),
        (["--port", "BUSY"], "cannot listen"),
        (["--host", ""], "--host: got ''"),
    ],
)
def test_bad_flags_exit_2_with_one_line(state_checkpoint, capsys, flags, expected):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        flags = [str(busy.getsockname()[1]) if f == "BUSY" else f for f in flags]
        if "--checkpoint" not in flags:
            flags = ["--checkpoint", str(state_checkpoint), *flags]
        assert main(["serve", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored or never touched
