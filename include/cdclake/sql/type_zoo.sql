-- One column per PostgreSQL type the Debezium PostgreSQL connector documents, with edge
-- values; the lake must hold exactly what PostgreSQL holds.
CREATE EXTENSION IF NOT EXISTS hstore;
CREATE EXTENSION IF NOT EXISTS ltree;
CREATE EXTENSION IF NOT EXISTS citext;
DO $$ BEGIN CREATE TYPE inventory.mood AS ENUM ('sad', 'ok', 'happy');
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
DO $$ BEGIN CREATE DOMAIN inventory.posint AS integer CHECK (VALUE > 0);
EXCEPTION WHEN duplicate_object THEN NULL; END $$;

CREATE TABLE IF NOT EXISTS inventory.type_zoo (
    id int PRIMARY KEY,
    c_bool boolean, c_bit1 bit(1), c_bit8 bit(8), c_varbit bit varying(16),
    c_int2 smallint, c_int4 integer, c_int8 bigint, c_real real, c_double double precision,
    c_num numeric(12, 4), c_num_free numeric, c_money money,
    c_char char(5), c_varchar varchar(20), c_text text,
    c_ts0 timestamp(0), c_ts3 timestamp(3), c_ts6 timestamp(6), c_tstz timestamptz,
    c_date date, c_time time(6), c_time0 time(0), c_timetz timetz, c_interval interval,
    c_bytea bytea, c_json json, c_jsonb jsonb, c_xml xml, c_uuid uuid, c_point point,
    c_ltree ltree, c_citext citext, c_inet inet, c_cidr cidr, c_macaddr macaddr,
    c_macaddr8 macaddr8, c_int4range int4range, c_int8range int8range, c_numrange numrange,
    c_tsrange tsrange, c_tstzrange tstzrange, c_daterange daterange, c_enum inventory.mood,
    c_hstore hstore, c_int_arr int[], c_text_arr text[], c_domain inventory.posint,
    c_big_text text
);

INSERT INTO inventory.type_zoo VALUES (
    1, true, B'1', B'10100101', B'101', -32768, 2147483647, -9223372036854775808, 1.5, -2.25e300,
    -12345678.1234, 123456789012345678901234567890.123456789, 12.34,
    'ab', 'vär', 'ünïcödé ✓ 🐘', '2024-02-29 23:59:59', '2024-02-29 23:59:59.123',
    '1999-12-31 23:59:59.999999', '2024-01-02 03:04:05.678901+02', '0001-01-01',
    '23:59:59.999999', '10:15:30', '10:15:30.5+05:30', '1 year 2 months 3 days 04:05:06.789',
    '\x00ff10', '{"b": 1, "a": [1, 2]}', '{"b": 1, "a": [1, 2]}', '<a>x</a>',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '(1.5,-2)', 'a.b.c', 'MiXeD', '192.168.0.1/24',
    '10.0.0.0/8', '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05', '[1,10)', '[-5,5]',
    '(1.5,2.5]', '[2024-01-01 00:00,2024-01-02 00:00)',
    '[2024-01-01 00:00+00,2024-01-02 00:00+00)', '[2024-01-01,2024-02-01)', 'happy',
    'a=>1, b=>NULL', '{1,2,NULL}', '{"x","y z",NULL}', 7,
    (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) i)
), (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL),
   (3, false, B'0', B'00000000', B'', 0, -1, 9223372036854775807, 'NaN', '-Infinity',
    99999999.9999, -0.000000000000000000001, -92233720368547758.08, '', '', '',
    '1970-01-01 00:00:00', '1970-01-01 00:00:00.001', '2262-04-11 23:47:16.854775',
    '1970-01-01 00:00:00+00', '9999-12-31', '00:00:00', '24:00:00', '00:00:00-12', '-1 day',
    '\x', '[]', '{}', '<x/>', '00000000-0000-0000-0000-000000000000', '(0,0)', '', '', '::1',
    '::/0', '00:00:00:00:00:00', '00:00:00:00:00:00:00:00', 'empty', '(,)', '[-1e20,)',
    '(,infinity)', '[-infinity,infinity]', 'empty', 'sad', '', '{}', '{}', 1, '')
ON CONFLICT DO NOTHING;
