"""fairq for Django's Tasks framework (docs/django.md)."""
