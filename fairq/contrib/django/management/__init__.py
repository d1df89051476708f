"""manage.py commands: fairq_worker, fairq_migrate."""
