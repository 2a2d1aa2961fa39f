"""A small demo workload on the inventory database: inserts, updates, deletes and a
primary-key change, different each round."""

from __future__ import annotations

import psycopg


def next_round(conn: psycopg.Connection) -> int:
    row = conn.execute("select coalesce(max(id), 0) from inventory.customers where id >= 5000")
    top = row.fetchone()[0]
    return 0 if top < 5000 else (top - 5000) // 100 + 1


def apply_workload(dsn: str) -> dict[str, int]:
    """Apply one round in a few transactions; returns counts of what was done."""
    with psycopg.connect(dsn) as conn:
        n = next_round(conn)
        base = 5000 + n * 100
        with conn.transaction():
            for i in range(5):
                conn.execute(
                    "insert into inventory.customers values (%s, %s, %s, %s)",
                    (base + i, f"First{n}_{i}", f"Last{n}_{i}", f"c{base + i}@example.com"),
                )
            conn.execute(
                "insert into inventory.products values (%s, %s, %s, %s, %s)",
                (base, f"widget {n}", "a widget — ünïcode", 1.5 + n, f"{n}.99"),
            )
            conn.execute("insert into inventory.products_on_hand values (%s, %s)", (base, 10))
            conn.execute(
                "insert into inventory.orders (order_number, order_date, purchaser, quantity, "
                "product_id) values (%s, current_date, %s, %s, %s)",
                (base, base, 2, base),
            )
        with conn.transaction():  # updates, several to the same row
            conn.execute("update inventory.customers set last_name = 'Changed' where id = %s",
                         (base + 1,))  # fmt: skip
            conn.execute("update inventory.customers set last_name = last_name || '!' "
                         "where id = %s", (base + 1,))  # fmt: skip
            conn.execute("update inventory.products set price = price + 1, weight = weight * 2 "
                         "where id = 101")  # fmt: skip
            conn.execute("update inventory.products_on_hand set quantity = quantity + 1 "
                         "where product_id = %s", (base,))  # fmt: skip
            conn.execute("update inventory.orders set quantity = quantity + 1, "
                         "updated_at = now() where order_number = %s", (base,))  # fmt: skip
        with conn.transaction():  # deletes, and a row inserted then deleted
            conn.execute("delete from inventory.customers where id = %s", (base + 2,))
            conn.execute("insert into inventory.customers values (%s, 'Brief', 'Row', %s)",
                         (base + 50, f"brief{base}@example.com"))  # fmt: skip
            conn.execute("delete from inventory.customers where id = %s", (base + 50,))
        with conn.transaction():  # a primary-key change: delete + tombstone + create
            conn.execute("update inventory.customers set id = %s where id = %s",
                         (base + 60, base + 3))  # fmt: skip
    return {"round": n, "inserts": 9, "updates": 6, "deletes": 2, "key_changes": 1}
