"""The example's own tests (``python manage.py test``): only Django's Tasks API, fairq's
documented settings and commands, and a real ``manage.py fairq_worker`` process."""

import datetime
import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction
from django.test import TransactionTestCase

try:  # Django 6 (its name for the invalid-task error is InvalidTask)
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2 with the django-tasks package
    from django_tasks import TaskResultStatus, task_backends
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist

from fairq.contrib.django import FairqBackend, close_connections
from orgs.tasks import broken, build_report

HERE = Path(__file__).resolve().parents[1]
SCHEMA = settings.FAIRQ["SCHEMA"]  # a checked name: lower-case letters, digits and _


def run_worker() -> subprocess.CompletedProcess:
    """manage.py fairq_worker --until-empty on this test run's database."""
    env = dict(os.environ, DJANGO_DB_NAME=connection.settings_dict["NAME"])
    return subprocess.run([sys.executable, "manage.py", "fairq_worker", "--until-empty"],
                          cwd=HERE, env=env, capture_output=True, text=True, timeout=120)


def count_jobs() -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {SCHEMA}.jobs")
        return cur.fetchone()[0]


class TasksOnFairq(TransactionTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        call_command("fairq_migrate", verbosity=0)

    @classmethod
    def tearDownClass(cls):
        close_connections()  # before Django drops the test database
        super().tearDownClass()

    def test_a_committed_enqueue_is_a_job_and_a_worker_runs_it(self):
        with transaction.atomic():
            result = build_report.enqueue(7, org="acme")
            bulk = build_report.using(queue_name="bulk").enqueue(8, org="acme")
        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertEqual(build_report.get_result(result.id).status, TaskResultStatus.READY)
        proc = run_worker()  # serves the tasks' queue and TASKS' QUEUES
        self.assertEqual(proc.returncode, 0, proc.stderr)
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, {"report": 7, "pages": 1})
        self.assertEqual(result.args, [7])
        bulk.refresh()
        self.assertEqual(bulk.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(bulk.return_value, {"report": 8, "pages": 2})

    def test_a_rolled_back_enqueue_leaves_no_job(self):
        result_id = None
        try:
            with transaction.atomic():
                result_id = build_report.enqueue(8, org="acme").id
                raise RuntimeError("the request failed after enqueueing")
        except RuntimeError:
            pass
        with self.assertRaises(TaskResultDoesNotExist):
            build_report.get_result(result_id)

    def test_the_tenant_comes_from_the_requests_organisation(self):
        answer = self.client.get("/reports/3/", headers={"X-Organisation": "globex"})
        result_id = answer.json()["result_id"]
        app = task_backends["default"]  # the backend; the job's tenant read back through SQL
        with connection.cursor() as cur:
            cur.execute(f"SELECT tenant FROM {SCHEMA}.jobs WHERE id = %s", [int(result_id)])
            self.assertEqual(cur.fetchone(), ("globex",))
        self.assertIsNotNone(app)
        rolled_back = self.client.get("/reports/4/?fail=1", headers={"X-Organisation": "globex"})
        with self.assertRaises(TaskResultDoesNotExist):
            build_report.get_result(rolled_back.json()["result_id"])

    def test_a_failing_task_is_failed_with_its_error(self):
        result = broken.enqueue("no paper", org="initech")
        proc = run_worker()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertEqual(result.errors[0].exception_class, ValueError)
        self.assertIn("no paper", result.errors[0].traceback)

    def test_a_bad_enqueue_is_one_clear_error_and_no_job(self):
        jobs_before = count_jobs()
        with self.assertRaises(InvalidTaskError) as err:
            build_report.enqueue(1)  # no request, no org=: the callable raises
        self.assertIn("TENANT_FROM orgs.tenancy.current_tenant raised LookupError",
                      str(err.exception))
        with self.assertRaises(InvalidTaskError) as err:
            build_report.enqueue(datetime.date(2026, 1, 1), org="acme")  # not JSON
        self.assertIn("orgs.tasks.build_report: the task's arguments must be JSON",
                      str(err.exception))
        self.assertEqual(count_jobs(), jobs_before)

    def test_bad_configuration_is_one_line_at_start_up(self):
        """A misspelt option: `manage.py check` (and runserver, fairq_worker) says so."""
        settings = HERE / "orgs" / "misspelt_settings.py"
        settings.write_text("from project.settings import *  # noqa\n"
                            "TASKS = {'default': {'BACKEND': 'fairq.contrib.django.FairqBackend',"
                            " 'OPTIONS': {'TENANT_FORM': 'orgs.tenancy.current_tenant'}}}\n")
        try:
            proc = subprocess.run([sys.executable, "manage.py", "check",
                                   "--settings", "orgs.misspelt_settings"], cwd=HERE,
                                  capture_output=True, text=True, timeout=60)
        finally:
            settings.unlink()
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("fairq.E001", proc.stderr)
        self.assertIn("unknown OPTIONS key(s) TENANT_FORM", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        backend = FairqBackend("other", {"OPTIONS": {"TENANT_FROM": "orgs.tenancy.nothing"}})
        (error,) = list(backend.check())
        self.assertIn("TENANT_FROM 'orgs.tenancy.nothing' does not import", error.msg)
        with self.settings(FAIRQ={"SCHEMA": "No-Such", "WORKER": {"concurency": 2}}):
            found = [e.msg for e in task_backends["default"].check()]
        self.assertEqual(len(found), 2, found)
        self.assertIn("settings.FAIRQ SCHEMA", found[0])
        self.assertIn("settings.FAIRQ WORKER: unknown option(s) concurency", found[1])
