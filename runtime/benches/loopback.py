"""The loopback HTTP server of the benchmarks' mock endpoints (a model, a provider, a
collector): one thread a connection, and a listen backlog as deep as a real server's.
`socketserver`'s default backlog is 5: a burst of connections past it has its SYNs dropped,
and the kernel sends them again a second later, which a benchmark would then count as ours (a
call that reached the fleet's provider 0.9 s after a 429 had been let through before it)."""

import http.server
import threading


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True


def serve(handler):
    """A server of `handler` on an ephemeral loopback port, serving on a thread of its own."""
    server = Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
