"""free_port draws from its own generator: processes that seed the global one alike still pick different ports."""

from __future__ import annotations

import random
import socket

from slime_like.core.process import free_port


def test_free_port_leaves_the_global_generator_alone() -> None:
    random.seed(1234)  # what cpu_compat.seed_all does in every trainer process
    port = free_port()
    after = random.random()
    random.seed(1234)
    assert after == random.random()  # the global draw did not move: the port came from elsewhere
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))  # and it was free
