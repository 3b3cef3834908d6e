"""Encrypted payloads (docs/security.md, "Encrypted payloads"): what an encrypted task's
row holds (no cleartext, looked for in the raw jsonb), the round trips through real
workers in thread and process mode, signals, workflows, the Tasks framework backend,
the testing helpers, key rotation with pgqueue_reencrypt, a missing key, the admin and
its search, and a project that never imports ``cryptography``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.contrib.auth.models import Permission
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue import get_task, signal
from django_pgqueue.core.conf import get_settings
from django_pgqueue.core.exceptions import EncryptionError
from django_pgqueue.db.encryption import MARKER
from django_pgqueue.models import Task
from django_pgqueue.ops.operations import requeue_dead
from django_pgqueue.testing import assert_enqueued, run_tasks
from tests import encrypt_tasks
from tests.conftest import REPO, wait_until
from tests.settings import PGQUEUE as TEST_PGQUEUE
from tests.settings import TEST_ENCRYPTION_KEY

SECRET = "4111-1111-1111-1111 ann@example.com"
OLD_KEY = TEST_ENCRYPTION_KEY
NEW_KEY = "ooLMPXQjoXjrQc4-TiruJ4IaXHUmb3pbozixgqE8EQk="
OTHER_KEY = "s03IRphbb8__Lh_XFqgKUZbwRxGoKov8ZicbBXshu_k="
QUEUE = ("--queues", "sealed")


def keys(*keys: str) -> override_settings:
    """PGQUEUE with these ENCRYPTION_KEYS (newest first), the rest as the suite's."""
    return override_settings(PGQUEUE={**TEST_PGQUEUE, "ENCRYPTION_KEYS": list(keys)})


def raw(task_id: int) -> dict[str, str | None]:
    """The task's payload columns as PostgreSQL stores them, as text."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT args::text, kwargs::text, result::text, checkpoint::text, "
            "progress::text, signals::text, wake::text FROM pgqueue_task WHERE id = %s",
            [task_id],
        )
        row = cursor.fetchone()
    names = ("args", "kwargs", "result", "checkpoint", "progress", "signals", "wake")
    return dict(zip(names, row, strict=True))


def assert_no_cleartext(task_id: int, *secrets: str) -> dict[str, str | None]:
    stored = raw(task_id)
    text = json.dumps(stored)
    for secret in secrets or (SECRET,):
        assert secret not in text
    return stored


# -- what the row holds ---------------------------------------------------------------
@pytest.mark.django_db
def test_an_encrypted_tasks_arguments_are_stored_sealed_with_no_cleartext():
    # when: an encrypted task is enqueued with a secret in its args and kwargs
    task_id = encrypt_tasks.echo.enqueue(SECRET, note=SECRET)

    # then: the raw jsonb holds no trace of it; args and kwargs are sealed objects
    stored = assert_no_cleartext(task_id)
    assert list(json.loads(stored["args"])) == [MARKER]
    assert list(json.loads(stored["kwargs"])) == [MARKER]
    # and the row reads back in clear through the model, and the testing helpers
    row = get_task(task_id)
    assert row.encrypted
    assert row.cleartext("args") == [SECRET]
    assert row.cleartext("kwargs") == {"note": SECRET}
    assert_enqueued(encrypt_tasks.echo, args=[SECRET], kwargs={"note": SECRET})


@pytest.mark.django_db
def test_a_plain_task_is_stored_as_before():
    task_id = encrypt_tasks.plain_echo.enqueue(SECRET)

    assert raw(task_id)["args"] == json.dumps([SECRET])
    assert not get_task(task_id).encrypted


@pytest.mark.django_db
def test_encrypt_all_encrypts_every_task_but_those_that_opt_out():
    with override_settings(PGQUEUE={**TEST_PGQUEUE, "ENCRYPT_ALL": True}):
        sealed = encrypt_tasks.plain_echo.enqueue(SECRET)
    assert_no_cleartext(sealed)
    assert get_task(sealed).encrypted


@pytest.mark.django_db
def test_enqueue_many_encrypts_each_call_on_its_own():
    # when: a batch of calls, each with its own secret
    ids = encrypt_tasks.echo.enqueue_many([(f"{SECRET} {n}",) for n in range(3)])

    # then: each row holds its own sealed args (different ciphertexts), no cleartext,
    # and runs with its own arguments
    tokens = {raw(task_id)["args"] for task_id in ids}
    assert len(tokens) == 3
    assert {raw(task_id)["kwargs"] for task_id in ids} == {"{}"}  # none: nothing to hide
    for task_id in ids:
        assert_no_cleartext(task_id)
    result = run_tasks(queues="sealed")
    assert [run.result["echo"] for run in result.runs] == [f"{SECRET} {n}" for n in range(3)]
    for task_id in ids:
        assert_no_cleartext(task_id)


@pytest.mark.django_db
def test_an_encrypted_enqueue_without_keys_raises_and_writes_nothing():
    with keys(), pytest.raises(EncryptionError, match="ENCRYPTION_KEYS'] is empty"):
        encrypt_tasks.echo.enqueue(SECRET)

    assert not Task.objects.exists()


# -- the worker -----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("execution", ["thread", "process"])
def test_a_worker_runs_an_encrypted_task_and_stores_its_result_checkpoint_and_progress_sealed(
    start_worker, execution
):
    # given: encrypted tasks whose arguments, checkpoint, progress and result hold a
    # secret, and an async one
    echo_id = encrypt_tasks.echo.enqueue(SECRET, note="n")
    sliced_id = encrypt_tasks.sliced.enqueue(SECRET)
    async_id = encrypt_tasks.echo_async.enqueue(SECRET)
    ids = [echo_id, sliced_id, async_id]

    # when: a real worker runs them
    worker = start_worker(*QUEUE, "--execution", execution, "--concurrency", "2")
    wait_until(
        lambda: Task.objects.filter(pk__in=ids, state="succeeded").count() == 3,
        message="the encrypted tasks to succeed",
    )

    # then: the handlers saw the cleartext (their results say so, read in clear) ...
    assert get_task(echo_id).cleartext("result") == {"echo": SECRET, "note": "n"}
    assert get_task(sliced_id).cleartext("result") == {"resumed": {"resume": SECRET}}
    assert get_task(sliced_id).cleartext("progress") == {"progress": SECRET}
    assert get_task(async_id).cleartext("result") == SECRET.upper()
    # ... and nothing they were given or wrote is in clear in a row, nor in the log
    for task_id in ids:
        assert_no_cleartext(task_id, SECRET, SECRET.upper())
    assert json.loads(raw(sliced_id)["checkpoint"]).keys() == {MARKER}
    assert SECRET not in worker.log()


@pytest.mark.django_db(transaction=True)
def test_a_signal_to_an_encrypted_task_is_stored_sealed_and_reaches_its_handler(start_worker):
    # given: an encrypted task waiting for a signal
    start_worker(*QUEUE)
    task_id = encrypt_tasks.waits.enqueue(SECRET)
    wait_until(lambda: get_task(task_id).state == "waiting", message="the task to wait")

    # when: the signal is sent with a secret
    assert signal(task_id, "go", {"card": SECRET}) == "resumed"

    # then: the handler saw the payload in clear, in signals and in wake, and its
    # checkpoint
    wait_until(lambda: get_task(task_id).state == "succeeded", message="the task to end")
    result = get_task(task_id).cleartext("result")
    assert result["signal"] == {"card": SECRET}
    assert result["woken"]["payload"] == {"card": SECRET}
    assert result["kept"] == {"before": SECRET}
    # while the row holds none of it
    stored = assert_no_cleartext(task_id)
    assert json.loads(stored["signals"])["go"].keys() == {MARKER}
    assert get_task(task_id).cleartext("signals") == {"go": {"card": SECRET}}


@pytest.mark.django_db
def test_the_wake_up_of_an_encrypted_task_holds_the_signals_payload_sealed():
    # given: an encrypted task waiting for a signal
    task_id = encrypt_tasks.waits.enqueue(SECRET)
    run_tasks(queues="sealed")

    # when: the signal resumes it
    assert signal(task_id, "go", SECRET) == "resumed"

    # then: what woke it names the signal in clear, its payload sealed
    stored = assert_no_cleartext(task_id)
    wake = json.loads(stored["wake"])
    assert (wake["reason"], wake["signal"], wake["payload"].keys()) == ("signal", "go", {MARKER})
    assert get_task(task_id).cleartext("wake")["payload"] == SECRET
    assert run_tasks(queues="sealed").runs[0].result["woken"]["payload"] == SECRET


@pytest.mark.django_db
def test_no_cleartext_of_an_encrypted_task_is_sent_to_the_database():
    # when: an encrypted task is enqueued, and signalled, under Django's query log
    with CaptureQueriesContext(connection) as queries:
        task_id = encrypt_tasks.waits.enqueue(SECRET)
        signal(task_id, "go", {"card": SECRET})

    # then: no statement carried the secret (a server's log, pg_stat_activity and a
    # statement's error would show it), and the signal was stored, sealed
    assert len(queries.captured_queries) >= 3
    assert not [q["sql"] for q in queries.captured_queries if SECRET in q["sql"]]
    assert get_task(task_id).cleartext("signals") == {"go": {"card": SECRET}}


@pytest.mark.django_db
def test_a_signal_to_an_encrypted_task_without_keys_is_refused_and_writes_nothing():
    task_id = encrypt_tasks.waits.enqueue(SECRET)

    with keys(), pytest.raises(EncryptionError, match="the task is encrypted"):
        signal(task_id, "go", SECRET)

    assert get_task(task_id).signals == {}
    # a plain task takes a signal all the same
    plain = encrypt_tasks.plain_echo.enqueue("x")
    with keys():
        assert signal(plain, "go", "in clear") == "stored"


@pytest.mark.django_db
def test_a_child_reads_its_encrypted_parents_result_in_clear():
    # given: an encrypted parent, and a child that waits for it
    parent = encrypt_tasks.echo.enqueue(SECRET)
    child = encrypt_tasks.reads_parents.using(after=[parent]).enqueue()

    # when: both run
    result = run_tasks(queues="sealed")

    # then: the child saw the parent's result decrypted; both rows hold it sealed
    assert result.counts["success"] == 2
    assert get_task(child).cleartext("result") == {str(parent): {"echo": SECRET, "note": None}}
    assert_no_cleartext(parent)
    assert_no_cleartext(child)


@pytest.mark.django_db
def test_an_atomic_encrypted_task_commits_its_result_and_progress_sealed():
    task_id = encrypt_tasks.atomic_echo.enqueue(SECRET)

    assert run_tasks(queues="sealed").counts["success"] == 1

    assert_no_cleartext(task_id)
    task = get_task(task_id)
    assert (task.cleartext("result"), task.cleartext("progress")) == (SECRET, {"at": SECRET})


# -- a missing key --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_without_the_key_fails_the_task_clearly_and_keeps_its_ciphertext(
    start_worker,
):
    # given: a task encrypted with a key the worker does not have
    task_id = encrypt_tasks.echo.using(max_attempts=2).enqueue(SECRET)
    sealed = raw(task_id)

    # when: the worker (with another key only) claims it
    worker = start_worker(*QUEUE, env={"PGQUEUE_TEST_ENCRYPTION_KEYS": OTHER_KEY})
    wait_until(lambda: get_task(task_id).state == "failed", message="the task to fail")

    # then: each attempt failed with an error saying why, nothing was run, and the
    # row's ciphertext is what the enqueue wrote
    task = get_task(task_id)
    assert [e["type"] for e in task.errors] == ["EncryptionError", "EncryptionError"]
    assert "cannot be decrypted" in task.errors[-1]["message"]
    assert "put that key back" in task.errors[-1]["message"]
    assert task.result is None
    assert raw(task_id)["args"] == sealed["args"]
    assert raw(task_id)["kwargs"] == sealed["kwargs"]
    assert SECRET not in worker.log()
    worker.stop()

    # and once the key is back, the requeued task runs
    assert list(requeue_dead([task_id])) == [task_id]
    start_worker(*QUEUE)
    wait_until(lambda: get_task(task_id).state == "succeeded", message="the task to run")
    assert get_task(task_id).cleartext("result") == {"echo": SECRET, "note": None}


@pytest.mark.django_db(transaction=True)
def test_a_worker_with_encrypted_tasks_and_no_key_refuses_to_start(start_worker):
    worker = start_worker(*QUEUE, env={"PGQUEUE_TEST_ENCRYPTION_KEYS": ""}, wait=False)

    assert worker.wait() != 0
    assert "PGQUEUE['ENCRYPTION_KEYS'] is empty" in worker.log()
    assert "encrypted tasks cannot run without it" in worker.log()


# -- rotation -------------------------------------------------------------------------
@pytest.mark.django_db
def test_pgqueue_reencrypt_moves_every_payload_to_the_newest_key(capsys):
    # given: tasks encrypted with the old key, in several states, with every payload
    # column filled: a finished one (result, progress), one waiting with a signal
    # delivered (signals, wake, checkpoint), and a pending one
    done = encrypt_tasks.sliced.enqueue(SECRET)
    run_tasks(queues="sealed", max_tasks=2)
    waiting = encrypt_tasks.waits.enqueue(SECRET)
    run_tasks(queues="sealed")
    signal(waiting, "other", SECRET)
    pending = encrypt_tasks.echo.enqueue(SECRET)
    plain = encrypt_tasks.plain_echo.enqueue(SECRET)
    ids = [done, waiting, pending]
    before = {task_id: raw(task_id) for task_id in ids}

    # when: the new key is put first, and the command runs
    with keys(NEW_KEY, OLD_KEY):
        call_command("pgqueue_reencrypt", "--batch", "2")

    # then: every sealed value changed, and the new key alone decrypts them all
    out = capsys.readouterr().out
    assert "re-encrypted 3 task(s) with the newest key; 0 already were" in out
    for task_id in ids:
        after = raw(task_id)
        for column, value in before[task_id].items():
            if value is not None and MARKER in value:
                assert after[column] != value, (task_id, column)
        assert_no_cleartext(task_id)
    with keys(NEW_KEY):
        assert get_task(done).cleartext("result") == {"resumed": {"resume": SECRET}}
        assert get_task(done).cleartext("progress") == {"progress": SECRET}
        assert get_task(waiting).cleartext("signals") == {"other": SECRET}
        assert get_task(pending).cleartext("args") == [SECRET]
        signal(waiting, "go", "now")
        assert run_tasks(queues="sealed").counts["success"] == 3  # with the plain one
    assert raw(plain)["args"] == json.dumps([SECRET])
    # and a second run finds nothing to do
    with keys(NEW_KEY, OLD_KEY):
        call_command("pgqueue_reencrypt")
    assert "re-encrypted 0 task(s) with the newest key; 3 already were" in capsys.readouterr().out


@pytest.mark.django_db
def test_pgqueue_reencrypt_leaves_running_rows_and_reports_rows_no_key_decrypts(capsys):
    # given: a running encrypted task, and one encrypted with a key that is gone
    running = encrypt_tasks.echo.enqueue(SECRET)
    Task.objects.filter(pk=running).update(state="running")
    with keys(OTHER_KEY):
        lost = encrypt_tasks.echo.enqueue(SECRET)
    before = {task_id: raw(task_id) for task_id in (running, lost)}

    # when: the command runs with the new key first
    with keys(NEW_KEY, OLD_KEY), pytest.raises(CommandError, match="1 task"):
        call_command("pgqueue_reencrypt")

    # then: neither row was touched; the output names both
    captured = capsys.readouterr()
    assert f"left 1 task(s) running or busy, for a later run: {running}" in captured.out
    assert f"task {lost}'s args cannot be decrypted" in captured.err
    for task_id in (running, lost):
        assert raw(task_id) == before[task_id]


# -- the Tasks framework backend ------------------------------------------------------
@pytest.mark.django_db
def test_the_tasks_framework_backend_reads_an_encrypted_tasks_result_back_in_clear():
    from tests.framework_tasks import add

    with override_settings(PGQUEUE={**TEST_PGQUEUE, "ENCRYPT_ALL": True}):
        # when: a framework task is enqueued and run with every task encrypted
        result = add.enqueue(123456, 2)
        assert_no_cleartext(int(result.id), "123456")
        run_tasks()

        # then: get_result gives its arguments and return value in clear
        fetched = add.get_backend().get_result(result.id)
    assert fetched.args == [123456, 2]
    assert fetched.return_value == 123458
    stored = raw(int(result.id))
    assert json.loads(stored["result"]).keys() == {MARKER}


@pytest.mark.django_db
def test_the_celery_layer_reads_an_encrypted_chains_results_in_clear(settings):
    from tests.celery_project.proj import settings as proj_settings
    from tests.celery_project.shop import tasks as celery_tasks

    for name in dir(proj_settings):
        if name.startswith("CELERY_"):
            setattr(settings, name, getattr(proj_settings, name))
    with override_settings(PGQUEUE={**TEST_PGQUEUE, "ENCRYPT_ALL": True}):
        # when: a chain runs with every task encrypted (the second step reads the
        # first's result as its argument)
        result = (celery_tasks.add.s(123456, 1) | celery_tasks.mul.s(2)).apply_async()
        run_tasks()

        # then: its result, and its parent's, read back in clear
        assert result.get(timeout=5) == 246914
        assert result.parent.get(timeout=5) == 123457
        assert result.parent.args == [123456, 1]
    for task_id in (int(result.id), int(result.parent.id)):
        stored = assert_no_cleartext(task_id, "123456", "123457", "246914")
        assert json.loads(stored["result"]).keys() == {MARKER}


# -- the admin ------------------------------------------------------------------------
@pytest.fixture
def staff(client, django_user_model):
    """Log in a staff user with the given permissions of django_pgqueue."""

    def login(*codenames: str):
        user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="django_pgqueue", codename__in=codenames
            )
        )
        client.force_login(user)
        return client

    return login


def detail(client, task_id: int) -> str:
    response = client.get(reverse("admin:django_pgqueue_task_change", args=[task_id]))
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_the_admin_shows_an_encrypted_tasks_payloads_only_with_decrypt_task(staff):
    # given: an encrypted task that ran (args, kwargs, result, progress, checkpoint),
    # and one waiting with a signal delivered
    done = encrypt_tasks.sliced.enqueue(SECRET)
    run_tasks(queues="sealed")
    waiting = encrypt_tasks.waits.enqueue(SECRET)
    run_tasks(queues="sealed")
    signal(waiting, "other", SECRET)

    # when: a user who may only view tasks opens their pages
    viewer = staff("view_task")
    pages = [detail(viewer, done), detail(viewer, waiting)]

    # then: no payload is in clear (nor as ciphertext); each says it is encrypted
    for page in pages:
        assert SECRET not in page
        assert MARKER not in page
        assert "needs the permission django_pgqueue.decrypt_task" in page
    # args, kwargs, result, progress, checkpoint
    assert pages[0].count('class="pgqueue-hidden pgqueue-encrypted quiet"') == 5


@pytest.mark.django_db
def test_a_user_with_decrypt_task_sees_an_encrypted_tasks_payloads_in_clear(staff):
    done = encrypt_tasks.sliced.enqueue(SECRET)
    run_tasks(queues="sealed")
    waiting = encrypt_tasks.waits.enqueue(SECRET)
    run_tasks(queues="sealed")
    signal(waiting, "other", SECRET)

    reader = staff("view_task", "decrypt_task")

    assert detail(reader, done).count(SECRET) == 4  # args, result, progress, checkpoint
    page = detail(reader, waiting)
    assert page.count(SECRET) == 3  # args, checkpoint, the signal
    assert MARKER not in page
    # and ADMIN_SHOW_PAYLOADS = False hides them from this user too
    with override_settings(PGQUEUE={**TEST_PGQUEUE, "ADMIN_SHOW_PAYLOADS": False}):
        assert SECRET not in detail(reader, done)


@pytest.mark.django_db
def test_the_admins_search_never_matches_an_encrypted_tasks_arguments(staff):
    # given: an encrypted task and a plain one
    sealed = encrypt_tasks.echo.enqueue(SECRET, note="x")
    plain = encrypt_tasks.plain_echo.enqueue(SECRET)
    stored_kwargs = raw(sealed)["kwargs"]
    client = staff("view_task", "decrypt_task")
    changelist = reverse("admin:django_pgqueue_task_changelist")

    # when: a user searches the arguments for what each row stores
    by_ciphertext = client.get(changelist, {"kwargs": stored_kwargs})
    by_args = client.get(changelist, {"args": json.dumps([SECRET])})

    # then: the encrypted row is matched by neither its ciphertext nor its cleartext
    assert list(by_ciphertext.context["cl"].result_list) == []
    assert [t.pk for t in by_args.context["cl"].result_list] == [plain]
    # and the search form says so
    form = client.get(changelist).content.decode()
    assert "Encrypted tasks' arguments are never searched" in form


# -- checks and the optional dependency -----------------------------------------------
def test_a_check_reports_encrypted_tasks_without_cryptography(monkeypatch):
    # given: cryptography cannot be imported
    monkeypatch.setitem(sys.modules, "cryptography.fernet", None)

    # when: the checks run (a task of the suite has encrypt=True)
    errors = [m for m in run_checks() if m.id == "django_pgqueue.E050"]

    # then: one error says what to install, and which tasks need it
    [error] = errors
    assert 'pip install "django-pgqueue-tasks[encrypt]"' in error.msg
    assert "tests.encrypt_tasks.echo" in error.msg


def test_a_check_reports_a_value_that_is_no_key_without_quoting_it():
    bad = "not-a-key-" + "s" * 30
    with override_settings(PGQUEUE={**TEST_PGQUEUE, "ENCRYPTION_KEYS": [OLD_KEY, bad]}):
        errors = [m for m in run_checks() if m.id == "django_pgqueue.E050"]
        shown = repr(get_settings())  # as a log or an error report would print them
    with override_settings(PGQUEUE={**TEST_PGQUEUE, "ENCRYPTION_KEYS": bad}):
        kind = [m for m in run_checks() if m.id == "django_pgqueue.E010"]

    [error] = errors
    assert "PGQUEUE['ENCRYPTION_KEYS'][1] is not a Fernet key" in error.msg
    [wrong_kind] = kind
    assert "must be a list of strings, not a str" in wrong_kind.msg
    for message in (error, wrong_kind):
        assert bad not in f"{message.msg} {message.hint}"
    assert OLD_KEY not in shown and bad not in shown


@pytest.mark.django_db(transaction=True)
def test_a_project_that_encrypts_nothing_never_imports_cryptography(db_url):
    # A fresh interpreter where cryptography cannot be imported enqueues and runs a
    # plain task: django_pgqueue, its worker's code and the testing helpers load.
    script = (
        "import sys; sys.modules['cryptography'] = None\n"
        "import django; django.setup()\n"
        "from django_pgqueue.testing import run_tasks\n"
        "from tests.encrypt_tasks import plain_echo\n"
        "plain_echo.enqueue('x')\n"
        "assert run_tasks(queues='sealed').counts['success'] == 1\n"
        "print('ok')\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": db_url,
           "PYTHONPATH": str(REPO)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
