"""What a schema holds, read from PostgreSQL's catalog, with the schema's name taken out: two
schemas built different ways (the migration chain, the engine files) compare equal exactly when
they define the same tables, columns, defaults, constraints, indexes, storage parameters,
policies, grants, functions (body, SET clauses, SECURITY DEFINER, grants) and triggers."""

from __future__ import annotations

from typing import Any

import psycopg

# Each query takes the schema name as its one parameter and returns (kind, name, definition).
QUERIES = {
    "column": """
        SELECT c.relname || '.'
               || lpad(row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum)::text, 3, '0')
               || ' ' || a.attname,
               format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
               || CASE a.attidentity WHEN 'd' THEN ' IDENTITY BY DEFAULT' WHEN 'a' THEN ' IDENTITY ALWAYS'
                  ELSE '' END
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = %s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped""",
    "table": """
        SELECT c.relname, 'options ' || coalesce(array_to_string(c.reloptions, ','), '')
               || ' rls ' || c.relrowsecurity || ' acl '
               || coalesce((SELECT string_agg(x::text, ',' ORDER BY x::text) FROM unnest(c.relacl) x), '')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relkind = 'r'""",
    "constraint": """
        SELECT t.relname || '.' || c.conname, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = %s""",
    "index": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s""",
    "policy": """
        SELECT c.relname || '.' || p.polname,
               p.polcmd::text || ' ' || p.polpermissive::text || ' ' || p.polroles::text || ' using '
               || coalesce(pg_get_expr(p.polqual, p.polrelid), '-') || ' check '
               || coalesce(pg_get_expr(p.polwithcheck, p.polrelid), '-')
        FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s""",
    "function": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
               pg_get_functiondef(p.oid) || ' acl '
               || (SELECT string_agg(a::text, ',' ORDER BY a::text)
                   FROM unnest(coalesce(p.proacl, acldefault('f', p.proowner))) a)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s""",
    "trigger": """
        SELECT c.relname || '.' || t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND NOT t.tgisinternal""",
}
# Alembic's own table is the chain's bookkeeping, not the engine.
SKIP = "alembic_version"


def snapshot(conn: psycopg.Connection[Any], schema: str) -> dict[tuple[str, str], str]:
    """{(kind, name): definition} of everything ``schema`` holds, its name and NOTIFY channel
    written as ``{schema}`` and ``{channel}`` as the engine files write them."""
    out: dict[tuple[str, str], str] = {}
    for kind, query in QUERIES.items():
        for name, definition in conn.execute(query, (schema,)).fetchall():
            if name.startswith(SKIP):
                continue
            out[(kind, normalize(name, schema))] = normalize(definition, schema)
    return out


def normalize(text: str, schema: str) -> str:
    return (text.replace(f"'fairq_{schema}'", "{channel}").replace(f'"{schema}".', "{schema}.")
            .replace(f"{schema}.", "{schema}."))


def differences(a: dict[tuple[str, str], str], b: dict[tuple[str, str], str]
                ) -> list[tuple[str, str, str | None, str | None]]:
    """(kind, name, in a, in b) for everything the two snapshots do not share, sorted."""
    return sorted((k[0], k[1], a.get(k), b.get(k))
                  for k in a.keys() | b.keys() if a.get(k) != b.get(k))
