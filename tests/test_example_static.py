"""The example project's admin is styled with DEBUG=False: its static files are
collected (manage.py collectstatic) and served by WhiteNoise, as in production.

The site runs in a subprocess under its own settings, behind a real WSGI server
(wsgiref), and the test fetches the login page and the stylesheet it links to."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections

from tests.conftest import REPO, database_url

SERVE = """
from wsgiref.simple_server import make_server, WSGIRequestHandler

from example_project.wsgi import application

class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass

server = make_server("127.0.0.1", 0, application, handler_class=Quiet)
print(server.server_port, flush=True)
server.serve_forever()
"""


@pytest.fixture
def example_env(django_db_modify_db_settings: None, tmp_path: Path) -> dict[str, str]:
    """The example's settings with DEBUG off and a STATIC_ROOT of the test's own."""
    settings_dict = connections["default"].settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": database_url(settings_dict),
        "DEBUG": "False",
        "STATIC_ROOT": str(tmp_path / "static"),
        "PYTHONPATH": str(REPO),
    }


@pytest.fixture
def example_site(example_env: dict[str, str]) -> Iterator[str]:
    """The example site after collectstatic, served over HTTP: its base URL."""
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=REPO, env=example_env, check=True, timeout=120,
    )  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE], cwd=REPO, env=example_env, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def fetch(url: str) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Host": "localhost"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


def test_the_admin_stylesheet_is_served_with_debug_off(example_site: str):
    # given: the example site with DEBUG=False, its static files collected
    # when: the admin's login page is fetched, then the stylesheet it links to
    status, _, page = fetch(f"{example_site}/admin/login/")
    stylesheets = re.findall(r'<link rel="stylesheet" href="([^"]+)"', page)
    css_status, css_type, css = fetch(f"{example_site}{stylesheets[0]}")

    # then: the page links the admin's CSS, and the CSS is served
    assert status == 200
    assert stylesheets[0].startswith("/static/admin/css/")
    assert css_status == 200
    assert css_type.startswith("text/css")
    assert "body" in css
