from django.db import transaction
from django.http import JsonResponse

from orgs.tasks import build_report


def request_report(request, report):
    """Queue a report for the request's organisation; the job commits with this transaction."""
    with transaction.atomic():
        result = build_report.enqueue(report)
        if request.GET.get("fail"):
            transaction.set_rollback(True)  # as if a later write of this request failed
    return JsonResponse({"result_id": result.id})
