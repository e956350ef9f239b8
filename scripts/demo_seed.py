"""Seed the embedded demo: a SQLite file with raw_orders (source) and an empty orders (sink).

Deterministic rows (no randomness, no clock) so every newcomer sees the same numbers.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import sys
from pathlib import Path


def seed(path: Path, rows_per_day: int = 40) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE raw_orders (order_id INTEGER PRIMARY KEY, order_date TEXT NOT NULL,
                                 customer TEXT NOT NULL, amount_cents INTEGER NOT NULL);
        CREATE TABLE orders (order_id INTEGER PRIMARY KEY, order_date TEXT NOT NULL,
                             customer TEXT NOT NULL, amount_cents INTEGER NOT NULL);
        CREATE INDEX orders_order_date ON orders (order_date);
        """)
    day, end, order_id, rows = dt.date(2024, 1, 1), dt.date(2024, 3, 1), 1, []
    while day < end:
        for _ in range(rows_per_day):
            rows.append(
                (
                    order_id,
                    day.isoformat(),
                    f"customer-{(order_id * 7) % 97:02d}",
                    100 + (order_id * 37) % 9000,
                )
            )
            order_id += 1
        day += dt.timedelta(days=1)
    con.executemany("INSERT INTO raw_orders VALUES (?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    return len(rows)


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".dpone-demo/demo.db")
    print(f"demo: seeded {seed(target)} source rows into {target}")
