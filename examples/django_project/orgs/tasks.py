"""The example's tasks: ordinary Django Tasks; nothing here names fairq."""

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2 with the django-tasks package


@task()
def build_report(report: int, org: str | None = None) -> dict:
    return {"report": report, "pages": report % 7 + 1}


@task()
def broken(reason: str, org: str | None = None) -> None:
    raise ValueError(reason)
