"""Serving the metrics of mover/views/metrics.py: over HTTP (`mover metrics --listen ADDR`, and
`--metrics-listen ADDR` of `mover follow` and `mover worker`), or as a file for node_exporter's
textfile collector (`mover metrics --textfile PATH`). prometheus_client renders the exposition
format and runs the HTTP server, in a daemon thread of its own: a scrape is a read of the control
schema on the collector's own connection, never the serving command's."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile

from mover.errors import BadInput
from mover.views.metrics import MoverCollector


def parse_listen(text: str) -> tuple[str, int]:
    """ADDR as node_exporter takes it: `:9187` (every interface), `127.0.0.1:9187`,
    `localhost:9187`, `[::1]:9187`; port 0 takes a free one."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise BadInput(f"--listen {text!r}: expected HOST:PORT or :PORT", hint="e.g. `--listen :9187` or "
                                                                               "`--listen 127.0.0.1:9187`")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise BadInput(f"--listen {text!r}: {host!r} is no IPv6 address", hint="e.g. `--listen [::1]:9187`"
                           ) from exc
    return host or "0.0.0.0", int(port)


def registry(dsn: str, *, timeout: float) -> tuple[CollectorRegistry, MoverCollector]:
    """A registry of mover's metrics alone (no process or platform collectors: what a scrape of it
    returns is what mover knows of its migrations)."""
    collector = MoverCollector(dsn, timeout=timeout)
    reg = CollectorRegistry(auto_describe=False)  # describing would read the database at registration
    reg.register(collector)
    return reg, collector


@contextmanager
def serving(dsn: str, listen: str, *, timeout: float = 5.0) -> Iterator[str]:
    """/metrics served on `listen` until the block ends; yields the URL it answers on."""
    host, port = parse_listen(listen)
    reg, collector = registry(dsn, timeout=timeout)
    try:
        server, thread = start_http_server(port, addr=host, registry=reg)
    except OSError as exc:
        collector.close()
        raise BadInput(f"cannot listen on {listen!r}: {exc.strerror or exc}",
                       hint="another address or port (`--listen 127.0.0.1:9187`)") from exc
    shown = f"[{host}]" if ":" in host else host
    try:
        yield f"http://{shown}:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        collector.close()


def write_textfile(dsn: str, path: Path, *, interval: float | None, stop: threading.Event,
                   timeout: float = 5.0) -> bool:
    """The metrics written to `path` for node_exporter's textfile collector: a temporary file
    beside it, renamed over it (node_exporter never reads half a file); once, or every
    `interval` seconds until `stop` is set. Returns whether the last write read the schema."""
    reg, collector = registry(dsn, timeout=timeout)
    try:
        while True:
            try:
                write_to_textfile(str(path), reg)
            except OSError as exc:
                raise BadInput(f"cannot write {str(path)!r}: {exc.strerror or exc}",
                               hint="a path in a directory this user may write (node_exporter's "
                                    "--collector.textfile.directory), ending in .prom") from exc
            if interval is None or stop.wait(interval):
                return not collector.failing
    finally:
        collector.close()
