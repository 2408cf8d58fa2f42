"""``dmrl serve``: its typed config and runner. Light to import (the CLI lists every command at start-up): the
server, msgpack and websockets load only when the command runs."""

from __future__ import annotations

import json
import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dmrl.serve.session import PolicyHost

log = logging.getLogger(__name__)


@dataclass
class ServeConfig:
    """``dmrl serve --checkpoint RUN/checkpoint --port 8765``."""

    checkpoint: Path
    """A checkpoint directory (policy.safetensors + config.json), e.g. runs/bc/checkpoint."""
    port: int = 8765
    """TCP port to listen on (0: any free port; the ready line on stdout names it)."""
    host: str = "127.0.0.1"
    """Interface to listen on: 127.0.0.1 serves this machine only, 0.0.0.0 every interface (robots on the LAN)."""
    onnx: Path | None = None
    """Plan chunks with this exported graph (``dmrl export``, e.g. RUN/checkpoint/policy.onnx) in onnxruntime
    instead of torch; the checkpoint still gives the settings, and each client keeps its own history and queue."""
    inference_steps: int | None = None
    """Override the diffusion policy's DDIM steps (torch planner only: a graph has its steps unrolled)."""
    action_steps: int | None = None
    """Override Ta, the actions executed from each chunk before replanning: 1 .. Tp - To + 1."""
    max_clients: int = 16
    """Connections served at once; one more is closed with 1013 (try again later)."""
    max_message_mb: float = 16.0
    """Largest request accepted; a bigger one closes its connection with 1009 (message too big)."""
    cpu_threads: int = 1
    """torch threads for the policy (1: the lowest latency at batch 1 here, and no spin-waiting)."""

    def __post_init__(self) -> None:
        if not self.host.strip():  # "" would bind every interface: make that a visible choice (0.0.0.0)
            raise ValueError("--host: got ''; give an address or name, e.g. 127.0.0.1 (this machine) or 0.0.0.0 (all)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port: got {self.port}; allowed 0 .. 65535 (0: any free port)")
        if self.max_clients < 1 or self.cpu_threads < 1:
            raise ValueError(
                f"--max-clients and --cpu-threads must be >= 1, got {self.max_clients}, {self.cpu_threads}"
            )
        if not self.max_message_mb > 0:
            raise ValueError(f"--max-message-mb: got {self.max_message_mb}; must be > 0")
        if self.inference_steps is not None and self.onnx is not None:
            raise ValueError("--inference-steps applies to the torch planner; an --onnx graph has its steps unrolled")


def load_host(cfg: ServeConfig) -> PolicyHost:
    """The checkpoint (and graph) of ``cfg`` loaded, with its overrides applied."""
    from dmrl.policies.checkpoint import load_policy
    from dmrl.serve.session import PolicyHost
    from dmrl.train.engine import configure_cpu_threads

    configure_cpu_threads(cfg.cpu_threads)
    policy = load_policy(cfg.checkpoint)[0]
    if cfg.inference_steps is not None:
        if not hasattr(policy, "set_sampler"):
            raise ValueError(f"--inference-steps applies to diffusion policies; {cfg.checkpoint} is {policy.name}")
        policy.set_sampler(cfg.inference_steps)
    if cfg.action_steps is not None:
        from dmrl.train.evaluate import set_action_steps

        set_action_steps(policy, cfg.action_steps)
    onnx = None
    if cfg.onnx is not None:
        from dmrl.export import OnnxPlanner

        # A graph that reads an instruction embeds it outside the graph with the checkpoint's own LanguageEncoder.
        reads_text = "instruction" in policy.chunk.obs_keys
        text = {"text_encoder": policy.encoder.text_encoder} if reads_text else {}
        onnx = OnnxPlanner(cfg.onnx, threads=cfg.cpu_threads, **text)
    return PolicyHost(policy, onnx)


def run_serve(cfg: ServeConfig) -> None:
    """Load, listen, print one JSON ready line on stdout, serve until SIGINT / SIGTERM."""
    from dmrl.serve.protocol import PROTOCOL
    from dmrl.serve.server import PolicyServer

    host = load_host(cfg)
    server = PolicyServer(host, cfg.host, cfg.port, cfg.max_clients, cfg.max_message_mb)
    try:
        server.start()
    except OSError as e:
        raise ValueError(f"--host {cfg.host} --port {cfg.port}: cannot listen ({e.strerror or e})") from None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(json.dumps({"url": server.url, "protocol": PROTOCOL, **host.info()}), flush=True)
        log.info("serving %s on %s (SIGINT / SIGTERM to stop)", host.policy.name, server.url)
        while not stop.wait(0.5):
            pass
        log.info("shutting down: closing %d connection(s)", len(server.sessions))
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
