"""The pipeline's Spark Connect settings (`pipelines.runner.connect_endpoint`):
which port it takes, and that a port in use leaves the endpoint off rather
than stopping the pipeline (Spark would not start with a plugin that cannot
bind)."""

from __future__ import annotations

import dataclasses
import logging
import socket

import pytest

import conf
from pipelines.runner import CONNECT_PLUGIN, connect_endpoint

pytestmark = pytest.mark.unit


def _config(port: int) -> conf.ClusterConfig:
    shipped = conf.load(None, data_dir="/tmp/unused")
    return dataclasses.replace(shipped, pipeline=dataclasses.replace(shipped.pipeline, connect_port=port))


def test_the_endpoint_takes_its_port_any_free_one_or_none():
    settings, port = connect_endpoint(_config(0))
    assert port is not None and port > 0
    assert settings == {"spark.plugins": CONNECT_PLUGIN, "spark.connect.grpc.binding.address": "127.0.0.1",
                        "spark.connect.grpc.binding.port": str(port)}
    assert connect_endpoint(_config(-1)) == ({}, None)


def test_a_port_in_use_leaves_the_endpoint_off_and_says_so(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with caplog.at_level(logging.ERROR):
            assert connect_endpoint(_config(busy)) == ({}, None)
    assert f"127.0.0.1:{busy} cannot be bound" in caplog.text and "runs without it" in caplog.text
