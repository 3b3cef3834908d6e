"""A worker's /metrics server: it binds the address it is given (--metrics-addr,
PGQUEUE['METRICS_ADDR']), alone and under the supervisor. Every 127.x.y.z address is
the loopback interface on Linux, so a server bound to 127.0.0.2 is reachable there and
refuses connections on 127.0.0.1. And the worker side imports none of the web side's
collector module (django_pgqueue.ops.metrics)."""

import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def free_port(addr: str, count: int = 1) -> int:
    """A port such that ``count`` ports from it are free on ``addr`` and 127.0.0.1."""
    while True:
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
        if port + count <= 65535 and all(is_free(p) for p in range(port, port + count)):
            return port


def is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def scrape(addr: str, port: int) -> set[str]:
    url = f"http://{addr}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return {f.name for f in text_string_to_metric_families(response.read().decode())}


def try_scrape(addr: str, port: int) -> set[str] | None:
    """The metric names, or None while the server is not up yet."""
    try:
        return scrape(addr, port)
    except urllib.error.URLError:
        return None


def refused(addr: str, port: int) -> bool:
    try:
        scrape(addr, port)
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


def test_a_worker_serves_its_metrics_on_the_given_address_only(start_worker):
    # given: a worker bound to 127.0.0.2
    port = free_port("127.0.0.2")
    start_worker("--metrics-port", str(port), "--metrics-addr", "127.0.0.2")

    # when: it is scraped there, and on 127.0.0.1
    names = wait_until(lambda: try_scrape("127.0.0.2", port), message="the metrics server")

    # then: its metrics are served on 127.0.0.2, and 127.0.0.1 refuses the connection
    assert "pgqueue_task_outcomes" in names
    assert refused("127.0.0.1", port)


def test_a_worker_bound_to_localhost_is_scraped_there(start_worker):
    port = free_port("127.0.0.1")
    start_worker("--metrics-port", str(port), "--metrics-addr", "127.0.0.1")

    names = wait_until(lambda: try_scrape("127.0.0.1", port), message="the metrics server")

    assert {"pgqueue_task_outcomes", "pgqueue_worker_slots"} <= names


@pytest.mark.slow
def test_each_supervised_worker_binds_the_given_address(start_worker):
    # given: two worker processes under the supervisor, bound to 127.0.0.2
    port = free_port("127.0.0.2", count=2)
    start_worker(
        "--processes", "2", "--metrics-port", str(port), "--metrics-addr", "127.0.0.2"
    )

    # then: each child serves on its own port of that address, and not on 127.0.0.1
    for child_port in (port, port + 1):
        names = wait_until(lambda p=child_port: try_scrape("127.0.0.2", p), message="a child")
        assert "pgqueue_task_outcomes" in names
        assert refused("127.0.0.1", child_port)


def test_the_worker_side_never_imports_the_web_collector_module():
    # given: a fresh interpreter
    # when: it imports the worker command, the supervisor and the worker's metrics server
    code = (
        "import sys\n"
        "import django_pgqueue.management.commands.runtaskworker\n"
        "import django_pgqueue.worker.metrics_server\n"
        "import django_pgqueue.worker.supervisor\n"
        "print('django_pgqueue.ops.metrics' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )

    # then: the queue collector's module (the web side's) is not among its modules
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
