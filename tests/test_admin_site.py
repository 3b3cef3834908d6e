"""django_pgqueue's admin on a project's own AdminSite (django_pgqueue.admin.register):
its pages are served there and every link they draw stays there, even with admin.site
mounted beside it."""

import re

import pytest
from django.contrib import admin
from django.contrib.admin.sites import AlreadyRegistered

from django_pgqueue.admin import register
from tests.factories import TaskFactory

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.custom_admin_urls")]


def links(response) -> list[str]:
    return re.findall(r'(?:href|action)="(/[^"]*)"', response.content.decode())


def pgqueue_links(response) -> list[str]:
    return [link for link in links(response) if "/django_pgqueue/" in link]


def test_the_custom_site_index_lists_the_queue_pages(admin_client):
    response = admin_client.get("/ops/")

    assert response.status_code == 200
    assert "/ops/django_pgqueue/queueoverview/" in links(response)
    assert "/ops/django_pgqueue/task/" in links(response)


def test_the_custom_site_shows_the_task_list_with_its_links_on_that_site(admin_client):
    # given: a task
    task = TaskFactory(task_name="tests.tasks.add", queue="default")

    # when: the custom site's task list is opened
    response = admin_client.get("/ops/django_pgqueue/task/")

    # then: the task is listed, and every link of the app's points into /ops/
    assert response.status_code == 200
    assert f"/ops/django_pgqueue/task/{task.pk}/change/" in links(response)
    assert pgqueue_links(response)
    assert all(link.startswith("/ops/") for link in pgqueue_links(response))


def test_the_custom_site_shows_the_overview_with_its_links_on_that_site(admin_client):
    # given: a task on the queue
    TaskFactory(task_name="tests.tasks.add", queue="default")

    # when: the custom site's queue overview is opened
    response = admin_client.get("/ops/django_pgqueue/queueoverview/")

    # then: it shows the queue, its breadcrumbs and counts link into /ops/ only
    assert response.status_code == 200
    assert "tests.tasks.add" in response.content.decode()
    assert "/ops/" in links(response)  # Home
    assert any(link.startswith("/ops/django_pgqueue/task/?") for link in links(response))
    assert all(link.startswith("/ops/") for link in pgqueue_links(response))


def test_a_task_page_on_the_custom_site_posts_its_operations_there(admin_client):
    # given: a pending task
    task = TaskFactory(task_name="tests.tasks.add", queue="default")

    # when: its page on the custom site is opened
    response = admin_client.get(f"/ops/django_pgqueue/task/{task.pk}/change/")

    # then: its operation buttons post to the custom site
    assert response.status_code == 200
    operations = [link for link in links(response) if "/operate/" in link]
    assert operations
    prefix = f"/ops/django_pgqueue/task/{task.pk}/operate/"
    assert all(link.startswith(prefix) for link in operations)


def test_registering_on_admin_site_again_is_refused():
    with pytest.raises(AlreadyRegistered):
        register(admin.site)
