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


def test_draws_before_either_is_bound_never_coincide() -> None:
    # A router's port and its metrics port are both drawn before the router binds either (CI once saw them equal).
    # A range of 40 ports makes a repeat all but certain in 30 independent draws.
    ports = [free_port("127.0.0.1", 31900, 31940) for _ in range(30)]
    assert len(set(ports)) == len(ports)


def test_a_taken_port_names_its_holder() -> None:
    import os

    import pytest

    from slime_like.core.process import PortInUseError, check_port_free

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUseError, match=rf"LISTEN 127\.0\.0\.1:{port} by pid {os.getpid()} \("):
            check_port_free("127.0.0.1", port)


def test_threads_drawing_at_once_never_share_or_block_a_port() -> None:
    # Engines start side by side in threads: each draws and checks at once. A draw's probe bind used to hold a
    # port another thread had just been handed, failing that thread's check ("no socket holds it now").
    from concurrent.futures import ThreadPoolExecutor

    from slime_like.core.process import check_port_free

    def draw_and_check(_: int) -> int:
        port = free_port("127.0.0.1", 31800, 31900)
        check_port_free("127.0.0.1", port)
        return port

    with ThreadPoolExecutor(4) as pool:
        ports = list(pool.map(draw_and_check, range(60)))
    assert len(set(ports)) == len(ports)
