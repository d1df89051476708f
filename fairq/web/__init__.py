"""The operator console (``fairq web``): pages and their JSON twins over the store's console
reads and the operator API, served by Starlette (the ``web`` extra)."""
