// A Node.js producer: enqueues fairq jobs with the SQL function, as any non-Python service
// sharing the database would. Connects with libpq's environment variables (PGHOST, PGPORT,
// PGUSER, PGDATABASE, PGPASSWORD); prints what it got as one JSON line for
// tests/test_sql_enqueue.py to check against the database.
import pg from "pg";

const schema = process.env.FAIRQ_SCHEMA || "fairq";
const client = new pg.Client();
await client.connect();
try {
  // The job commits with this client's own transaction.
  await client.query("BEGIN");
  const { rows } = await client.query(
    `SELECT ${schema}.enqueue(task => $1, tenant => $2, payload => $3::jsonb) AS id`,
    ["send_report", "acme", JSON.stringify({ report: 7 })],
  );
  await client.query("COMMIT");

  // An idempotency key: the second call returns the first job's id and writes nothing.
  const keyed = `SELECT ${schema}.enqueue(task => $1, tenant => $2, payload => $3::jsonb,
                                         key => $4) AS id`;
  const args = ["send_report", "globex", JSON.stringify({ report: 8 }), "invoice-42"];
  const first = await client.query(keyed, args);
  const again = await client.query(keyed, args);

  // Bad input: a PostgreSQL error with fairq's SQLSTATE and a one-line message.
  let refused = null;
  try {
    await client.query(`SELECT ${schema}.enqueue(task => 'send_report', tenant => 'acme', cost => 0)`);
  } catch (err) {
    refused = { code: err.code, message: err.message };
  }
  console.log(JSON.stringify({
    id: Number(rows[0].id), keyed: Number(first.rows[0].id), again: Number(again.rows[0].id),
    refused,
  }));
} finally {
  await client.end();
}
