"""What an operator does beside running workers, checked before anything is written:

- ``ops``: bulk actions on jobs and tenants (``App.jobs``, ``App.retry``, ``App.cancel_tenant``,
  ``app.tenants.delete/reset``), carried out by ``fairq.store.ops``;
- ``tenant_file``: the tenant TOML file (``fairq tenants apply``, ``app.tenants.apply``);
- ``roles``: the least-privilege GRANTs (``fairq roles``).

It sits below the app, beside the runtime, and imports neither (``.importlinter``).
"""
