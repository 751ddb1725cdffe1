"""The store: the only room that writes SQL, and the contract an engine implements.

Everything outside `store/` calls typed functions of its modules with a `db.Connection` (the
engine's connection, a type alias) and never holds a cursor or an SQL string
(tests/unit/test_layout_sql.py). Today's engine is SQLite; DESIGN.md section 9's PostgreSQL
engine is an added module that provides the same names:

- `connect(...) -> Connection`: a connection in autocommit, no transaction opened implicitly;
  writes fully durable at COMMIT (SQLite: WAL, synchronous=FULL, a busy timeout).
- `write_txn(conn) -> Transaction` (transaction.py, reached as `db.write_txn`): the write lock,
  taken before the first statement so writers serialize instead of failing at COMMIT (SQLite:
  BEGIN IMMEDIATE; PostgreSQL: BEGIN, the advisory lock and, on a leader, the leadership row
  FOR KEY SHARE and the term check, so a fenced node's write rolls back). Any exception rolls
  back; `Transaction.after_commit(effect)` runs the in-memory changes in order only after
  COMMIT succeeded.
- `commits_without_fsync(conn)`: commits inside may be lost to a power cut, for writes recovery
  derives again (SQLite: synchronous=NORMAL; PostgreSQL: synchronous_commit off for them).
- `commit_counter(conn) -> int` and `read_only(conn)`: the notification of new rows. A watcher
  (the doorbell) keeps a connection of its own, refuses writes on it, and polls a number that
  changes whenever another connection commits, querying only when it moved (SQLite: PRAGMA
  data_version; PostgreSQL: a counter bumped by LISTEN, polled as well: a NOTIFY is a wake-up,
  not a delivery). It says something changed, never what: the query finds out.
- `ERRORS`: the driver's exception classes. Store functions let them out (or wrap them in
  `errors.StoreError`); code outside catches `db.ERRORS`, and `storage.classify` names a fault
  (disk full, locked, corrupt) whatever the engine.
- migrations (migrations.py): one ordered list per engine, names `NNNN_what`, applied by
  `migrations.apply(conn)` under the engine's lock (SQLite: BEGIN IMMEDIATE around reading the
  ledger and applying; PostgreSQL: pg_advisory_xact_lock in the same transaction), each step
  once, recorded in `schema_migrations`. A ledger name the list does not know is a newer schema:
  `errors.SchemaTooNew`, exit 2 with one line.

The typed functions (`inbox.record_batch`, `outbox.lease_due`, `owner_outbox.claim_due` and
`settle`, `feed.FeedStore`, `summary.read`, ...) take the connection or run inside a caller's
`Transaction`; a second engine gives each its own statement where the SQL differs.
"""
