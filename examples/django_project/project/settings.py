"""The example's settings: PostgreSQL from the environment, Django's Tasks on fairq, the tenant
of each enqueue from the organisation of the request being served."""

import os

import django

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "project.urls"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    # Django 5.2: the Tasks framework's package (built in from Django 6)
    *(["django_tasks"] if django.VERSION < (6,) else []),
    "fairq.contrib.django",   # manage.py fairq_worker, fairq_migrate
    "orgs",
]
MIDDLEWARE = ["orgs.tenancy.OrganisationMiddleware"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3
        "NAME": os.environ.get("DJANGO_DB_NAME", "fairq_django_example"),
        "USER": os.environ.get("DJANGO_DB_USER", "postgres"),
        "PASSWORD": os.environ.get("DJANGO_DB_PASSWORD", ""),
        "HOST": os.environ.get("DJANGO_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DJANGO_DB_PORT", "5432"),
        # The test run's database (default: test_ and NAME), made and dropped by the runner.
        "TEST": {"NAME": os.environ.get("DJANGO_TEST_DB_NAME")},
    }
}

TASKS = {
    "default": {
        "BACKEND": "fairq.contrib.django.FairqBackend",
        "QUEUES": ["default", "bulk"],  # build_report.using(queue_name="bulk") goes to fairq's "bulk"
        "OPTIONS": {"TENANT_FROM": "orgs.tenancy.current_tenant", "MAX_ATTEMPTS": 1},
    }
}

FAIRQ = {
    "DATABASE": "default",
    "SCHEMA": os.environ.get("FAIRQ_SCHEMA", "fairq"),
    "WORKER": {"concurrency": 4},
}
