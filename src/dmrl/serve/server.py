"""``dmrl serve``: a policy behind a WebSocket, msgpack messages, one session (queue, history, noise) per client.

One thread per connection (websockets' sync server); forward passes are serialised by one lock, decoding and
checking are not. A bad request gets ``{"ok": false, "error": one line}`` and the connection stays open; a client
that goes away mid-episode loses its session and nothing else. SIGINT / SIGTERM close every connection with 1001
(going away) and exit 0 (see serve.cli).
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

from dmrl.serve.protocol import COMMANDS, PROTOCOL, ProtocolError, error_reply, pack, unpack
from dmrl.serve.session import PolicyHost, Session

log = logging.getLogger(__name__)


class PolicyServer:
    """Serve ``host`` (a :class:`PolicyHost`) on ``address``; ``start()`` listens in a background thread.

    Use as a context manager, or ``start()`` / ``stop()``. ``sessions`` maps a client id to its :class:`Session`
    while it is connected.
    """

    def __init__(
        self, host: PolicyHost, address: str = "127.0.0.1", port: int = 0, max_clients: int = 16, max_mb: float = 16.0
    ) -> None:
        self.host = host
        self.address, self.port = address, port
        self.max_clients = max_clients
        self.max_size = int(max_mb * 2**20)
        self.sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"ws://{self.address}:{self.port}"

    def start(self) -> PolicyServer:
        from websockets.sync.server import serve

        # compression=None: no permessage-deflate, so a C++ client needs none, and no deflate time per message.
        self._server = serve(
            self._handle, self.address, self.port, compression=None, max_size=self.max_size, logger=log
        )
        self.port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="dmrl-serve", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close every connection with 1001 (going away), wait for their handlers."""
        if self._server is not None:
            self._server.shutdown()
            if self._thread is not None:
                self._thread.join(10)
            self._server = None

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handle(self, conn: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        cid = next(self._ids)
        with self._lock:
            full = len(self.sessions) >= self.max_clients
            if not full:
                session = self.sessions[cid] = Session(self.host)
        if full:
            log.warning("client %d from %s refused: %d clients connected", cid, conn.remote_address, self.max_clients)
            conn.close(1013, f"server full ({self.max_clients} clients); try again later")
            return
        log.info("client %d connected from %s", cid, conn.remote_address)
        try:
            for message in conn:
                conn.send(self._reply(session, message))
        except ConnectionClosed:
            pass  # the client went away, possibly mid-request: its reply has nowhere to go
        finally:
            with self._lock:
                self.sessions.pop(cid, None)
            where = f" mid-episode (step {session.steps})" if session.steps else ""
            log.info("client %d disconnected%s after %d episode(s)", cid, where, session.episodes)

    def _reply(self, session: Session, message: bytes | str) -> bytes:
        """One request -> its reply bytes; every failure is a one-line error reply, never a dropped connection."""
        try:
            msg = unpack(message)
            cmd = msg.get("cmd")
            if cmd == "act":
                action, planned = session.act(session.check_obs(msg.get("obs")))
                return pack({"ok": True, "action": action, "planned": planned, "step": session.steps})
            if cmd == "reset":
                extra = set(msg) - {"cmd", "seed", "drop"}
                if extra:
                    raise ProtocolError(f"reset: unknown field {sorted(extra)[0]!r}; allowed: seed, drop")
                seed = session.reset(msg.get("seed"), msg.get("drop"))
                return pack({"ok": True, "seed": seed, "drop": list(session.drop)})
            if cmd == "info":
                return pack({"ok": True, "protocol": PROTOCOL, **self.host.info()})
            raise ProtocolError(f"unknown cmd {cmd!r}; allowed: {', '.join(COMMANDS)}")
        except ProtocolError as e:
            return error_reply(str(e))
        except Exception as e:  # a bug or a policy failure on odd input: report it, keep serving
            log.exception("request failed")
            return error_reply(f"server error: {type(e).__name__}: {e}")
