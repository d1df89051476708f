from django.urls import path
from orgs import views

urlpatterns = [path("reports/<int:report>/", views.request_report)]
