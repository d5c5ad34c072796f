"""A tiny application for samples/attach_demo.sh: a shop that records orders in its own SQLite
file with plain SQL through Python's sqlite3 module.  It knows nothing of syncpack.

    python3 attach_app.py shop.db init
    python3 attach_app.py shop.db order SITE N      # N orders, one transaction each
    python3 attach_app.py shop.db restock SKU QTY
    python3 attach_app.py shop.db show
"""

import sqlite3
import sys

db, cmd, args = sys.argv[1], sys.argv[2], sys.argv[3:]
# The busy timeout: while syncpack writes peers' rows into the file, we wait for the lock
# instead of failing with "database is locked".
con = sqlite3.connect(db, timeout=30)
with con:
    if cmd == "init":
        con.execute("PRAGMA journal_mode=WAL")
        # key columns NOT NULL: SQLite would otherwise let a row be keyed by NULL
        con.execute("CREATE TABLE IF NOT EXISTS stock(sku TEXT PRIMARY KEY NOT NULL, qty INTEGER "
                    "NOT NULL, price REAL, photo BLOB)")
        con.execute("CREATE TABLE IF NOT EXISTS orders(site TEXT NOT NULL, n INTEGER NOT NULL, "
                    "sku TEXT REFERENCES stock(sku), qty INTEGER, PRIMARY KEY(site, n))")
    elif cmd == "order":
        site, count = args[0], int(args[1])
        for i in range(count):
            with con:
                n = con.execute("SELECT coalesce(max(n), 0) + 1 FROM orders WHERE site=?",
                                (site,)).fetchone()[0]
                con.execute("INSERT INTO orders VALUES (?, ?, 'bolt', 1)", (site, n))
                con.execute("UPDATE stock SET qty = qty - 1 WHERE sku = 'bolt'")
    elif cmd == "restock":
        con.execute("INSERT INTO stock(sku, qty, price, photo) VALUES (?, ?, 0.25, x'89504e47') "
                    "ON CONFLICT(sku) DO UPDATE SET qty = qty + excluded.qty",
                    (args[0], int(args[1])))
    elif cmd == "show":
        for table in ("stock", "orders"):
            for row in con.execute(f"SELECT *, typeof(qty) FROM {table} ORDER BY 1, 2"):
                print(table, *row, sep="\t")
con.close()
