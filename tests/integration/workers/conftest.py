"""A real S3-compatible server per module that asks for it (tests/support/s3.py)."""

from tests.support.s3 import s3, storage  # noqa: F401
