-- The demo source database, after Debezium's tutorial "inventory" example.
CREATE SCHEMA IF NOT EXISTS inventory;

CREATE TABLE IF NOT EXISTS inventory.customers (
    id         integer PRIMARY KEY,
    first_name varchar(255) NOT NULL,
    last_name  varchar(255) NOT NULL,
    email      varchar(255) NOT NULL UNIQUE
);

CREATE TABLE IF NOT EXISTS inventory.products (
    id          integer PRIMARY KEY,
    name        varchar(255) NOT NULL,
    description varchar(512),
    weight      double precision,
    price       numeric(10, 2)
);

CREATE TABLE IF NOT EXISTS inventory.products_on_hand (
    product_id integer PRIMARY KEY REFERENCES inventory.products (id),
    quantity   integer NOT NULL
);

CREATE TABLE IF NOT EXISTS inventory.orders (
    order_number integer PRIMARY KEY,
    order_date   date NOT NULL,
    purchaser    integer NOT NULL REFERENCES inventory.customers (id),
    quantity     integer NOT NULL,
    product_id   integer NOT NULL REFERENCES inventory.products (id),
    placed_at    timestamp(6) NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Debezium's signal table: exactly three string columns; ids are 42+ characters.
CREATE TABLE IF NOT EXISTS public.debezium_signal (
    id   varchar(64) PRIMARY KEY,
    type varchar(32) NOT NULL,
    data varchar(2048)
);

INSERT INTO inventory.customers VALUES
    (1001, 'Sally', 'Thomas', 'sally.thomas@acme.com'),
    (1002, 'George', 'Bailey', 'gbailey@foobar.com'),
    (1003, 'Edward', 'Walker', 'ed@walker.com'),
    (1004, 'Anne', 'Kretchmar', 'annek@noanswer.org')
ON CONFLICT DO NOTHING;

INSERT INTO inventory.products VALUES
    (101, 'scooter', 'Small 2-wheel scooter', 3.14, 39.99),
    (102, 'car battery', '12V car battery', 8.1, 89.50),
    (103, '12-pack drill bits', '12-pack of drill bits with sizes ranging from #40 to #3', 0.8, 12.00),
    (104, 'hammer', '12oz carpenter''s hammer', 0.75, 9.99),
    (105, 'hammer', '14oz carpenter''s hammer', 0.875, 10.99),
    (106, 'hammer', '16oz carpenter''s hammer', 1.0, 11.99),
    (107, 'rocks', 'box of assorted rocks', 5.3, 4.25),
    (108, 'jacket', 'water resistent black wind breaker', 0.1, 59.00),
    (109, 'spare tire', '24 inch spare tire', 22.2, -0.01)
ON CONFLICT DO NOTHING;

INSERT INTO inventory.products_on_hand VALUES
    (101, 3), (102, 8), (103, 18), (104, 4), (105, 5), (106, 0), (107, 44), (108, 2), (109, 5)
ON CONFLICT DO NOTHING;

INSERT INTO inventory.orders (order_number, order_date, purchaser, quantity, product_id,
                              placed_at, updated_at) VALUES
    (10001, '2016-01-16', 1001, 1, 102, '2016-01-16 10:00:00.123456', '2016-01-16 10:00:00+00'),
    (10002, '2016-01-17', 1002, 2, 105, '2016-01-17 11:30:00', '2016-01-17 11:30:00.5+02'),
    (10003, '2016-02-19', 1002, 2, 106, '2016-02-19 09:15:00', '2016-02-19 09:15:00+00'),
    (10004, '2016-02-21', 1003, 1, 107, '2016-02-21 17:45:00', '2016-02-21 17:45:00-05')
ON CONFLICT DO NOTHING;
