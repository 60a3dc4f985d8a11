"""A real S3-compatible server (moto's, deploy/lab/s3server.py) on 127.0.0.1 for a test
module, and the `ObjectStorage` that reaches it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.lab import s3server
from orchestrator.storage.object_storage import ObjectStorage


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3server.S3Server]:
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    server = s3server.start("127.0.0.1", log=log)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def storage(s3: s3server.S3Server) -> ObjectStorage:
    """A fresh prefix in the module's bucket for each test."""
    return ObjectStorage.parse(s3.uri(f"t-{uuid.uuid4().hex[:8]}"), endpoint=s3.endpoint,
                               access_key=s3server.ACCESS_KEY, secret_key=s3server.SECRET_KEY)


def keys(storage: ObjectStorage, job_id: str) -> list[str]:
    """Every object under the job's folder, relative to it."""
    from pyarrow import fs as pafs

    base = storage.job_path(job_id)
    infos = storage.filesystem().get_file_info(pafs.FileSelector(base, recursive=True,
                                                                allow_not_found=True))
    return sorted(i.path[len(base) + 1:] for i in infos if i.type is pafs.FileType.File)



class Gate:
    """A TCP forwarder in front of a server, to take it off the network and back: `close()`
    refuses new connections and cuts the open ones (a store that went down), `open()` listens
    on the same port again, `stop()` gives the port back. `endpoint` is what clients are
    given. While closed the gate keeps its port bound without listening (a connection is
    refused, as by a host with nothing on the port): released, the port could be taken by
    any other socket on the machine, a client's own ephemeral port included (a client that
    keeps retrying a refused local port can end up connected to itself on it), and `open()`
    would fail with "Address already in use"."""

    def __init__(self, target: tuple[str, int]) -> None:
        import socket
        import threading

        self._socket, self._threading = socket, threading
        self.target = target
        self._lock = threading.Lock()
        self._conns: list[Any] = []
        self._listener: Any = None
        self._held: Any = None  # the port's socket while closed: bound, not listening
        self.port = 0
        self.open()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _bound(self) -> Any:
        sock = self._socket.socket()
        # SO_REUSEPORT alone: the held socket is bound while the listener still listens (the
        # port is never free between the two), and a socket bound with SO_REUSEADDR only,
        # which Linux lets share a port none of its sockets listens on, is refused it
        sock.setsockopt(self._socket.SOL_SOCKET, self._socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", self.port))
        return sock

    def open(self) -> None:
        with self._lock:
            sock, self._held = self._held, None
        if sock is None:
            sock = self._bound()
        sock.listen(64)
        self.port = sock.getsockname()[1]
        with self._lock:
            self._listener = sock
        self._threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def close(self) -> None:
        held = self._bound() if self._listener is not None else None
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
            if held is not None:
                self._held = held
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(self._socket.SHUT_RDWR)
            listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(self._socket.SHUT_RDWR)
            c.close()

    def stop(self) -> None:
        """Closed for good: the port is given back."""
        self.close()
        with self._lock:
            held, self._held = self._held, None
        if held is not None:
            held.close()

    def _accept(self, listener: Any) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = self._socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # closed meanwhile
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                self._threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(1)  # SHUT_WR
