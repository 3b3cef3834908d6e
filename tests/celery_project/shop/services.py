"""Stand-ins for what the tasks call (a Twitter client, a web API, a mailer). Each call
is recorded in the test's ledger (tests/ledger.py, when the test keeps one), and the
first ``fail`` calls of a label raise, so a test can count the tries."""

import os
import time

from tests.ledger import LEDGER_ENV, append, ledger_path, read


class RequestException(OSError):
    """Like requests.RequestException: a network error."""


class Twitter:
    class FailWhaleError(Exception):
        pass

    class LoginError(Exception):
        pass

    def __init__(self, oauth):
        self.oauth = oauth

    def update_status(self, tweet):
        if call("twitter", tweet) <= self.oauth.get("fail", 0):
            raise Twitter.FailWhaleError(f"over capacity ({tweet})")
        return f"posted {tweet}"


def fetch(url, fail=0):
    if call("http", url) <= fail:
        raise RequestException(f"connection reset by {url}")
    return f"<html>{url}</html>"


def call(service, label):
    """Record a call; returns its number (1 for the first call of this label)."""
    if not os.environ.get(LEDGER_ENV):
        return 1 << 30
    path = ledger_path()
    earlier = [e for e in read(path) if e.get("event") == "call" and e.get("label") == label]
    append(path, {"event": "call", "service": service, "label": label, "pid": os.getpid(),
                  "t": time.time()})  # fmt: skip
    return len(earlier) + 1


def released(label):
    """True once the test has appended a release event for ``label``."""
    if not os.environ.get(LEDGER_ENV):
        return True
    return any(e.get("event") == "release" and e.get("label") == label
               for e in read(ledger_path()))  # fmt: skip
