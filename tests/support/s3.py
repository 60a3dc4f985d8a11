"""A real S3-compatible server (moto's, deploy/lab/s3server.py) on 127.0.0.1 for a test
module, and the `ObjectStorage` that reaches it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

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

