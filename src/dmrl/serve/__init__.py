"""Policy server (``dmrl serve``, serve.server) and its Python client (serve.client): reset / act over a WebSocket,
one msgpack map per message (serve.protocol; docs/serve.md). Nothing is imported here, so the CLI can list the
command without msgpack or websockets installed."""
