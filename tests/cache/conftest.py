"""Fixtures of the cache tests: real compressed documents (a tiny random-weight model) and a real
S3 API (moto's server on 127.0.0.1, used through s3fs)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from homer_integrations import CompressedDocument, HomerModel
from tests.test_document_cache import make_engine

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "homer-test",
    "AWS_SECRET_ACCESS_KEY": "homer-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def cache_calib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache-calibration")


@pytest.fixture(scope="session")
def cache_engine(tokenizer, cache_calib: Path) -> HomerModel:
    return make_engine(tokenizer, cache_calib)


@pytest.fixture(scope="session")
def cache_texts(novel: str) -> list[str]:
    """Four different ~350-token documents."""
    return [novel[40_000 + i * 1500 : 40_000 + (i + 1) * 1500] for i in range(4)]


@pytest.fixture(scope="session")
def cache_docs(cache_engine: HomerModel, cache_texts: list[str]) -> list[CompressedDocument]:
    return [cache_engine.compress(t) for t in cache_texts]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API on 127.0.0.1; this process and its children reach it through the environment."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {**S3_ENV, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield env["AWS_ENDPOINT_URL"]
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()


@pytest.fixture
def s3_url(s3_endpoint: str) -> str:
    """``s3://`` URL of a prefix in a new, empty bucket."""
    import boto3

    bucket = f"homer-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/documents"


@pytest.fixture(params=["memory", "file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL of each kind fsspec offers here."""
    if request.param == "memory":
        return f"memory://homer-{uuid.uuid4().hex[:12]}/documents"
    if request.param == "file":
        return (tmp_path / "store").as_uri()
    return request.getfixturevalue("s3_url")
