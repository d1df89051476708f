"""Which organisation a request serves (the X-Organisation header here; a real app reads the
logged-in user's), kept in a context variable that the task backend's TENANT_FROM reads."""

from contextvars import ContextVar

current_organisation: ContextVar[str | None] = ContextVar("current_organisation", default=None)


class OrganisationMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = current_organisation.set(request.headers.get("X-Organisation"))
        try:
            return self.get_response(request)
        finally:
            current_organisation.reset(token)


def current_tenant(task, args, kwargs):
    """TENANT_FROM: the request's organisation; outside a request, an explicit org= kwarg."""
    org = current_organisation.get() or kwargs.get("org")
    if not org:
        raise LookupError("no organisation: enqueue inside a request or pass org=")
    return org
