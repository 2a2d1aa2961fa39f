-- PostGIS types, seeded when the extension is available: geometry (with and without a
-- type modifier and SRID, Z coordinates, empty) and geography.
CREATE EXTENSION IF NOT EXISTS postgis;

CREATE TABLE IF NOT EXISTS inventory.geo_zoo (
    id int PRIMARY KEY,
    g geometry,
    g_point geometry(PointZ, 4326),
    g_poly geography(Polygon, 4326)
);

INSERT INTO inventory.geo_zoo VALUES
    (1, 'LINESTRING(0 0, 1 1.5)', 'SRID=4326;POINT Z(1 2 3)',
     'SRID=4326;POLYGON((0 0, 1 0, 1 1, 0 0))'),
    (2, NULL, NULL, NULL),
    (3, 'GEOMETRYCOLLECTION EMPTY', 'SRID=4326;POINT Z(-180 -90 0)',
     'SRID=4326;POLYGON((-10 -10, 10 -10, 10 10, -10 10, -10 -10))'),
    (4, 'SRID=3857;MULTIPOINT((1e7 -1e7), (0.000001 2))', NULL, NULL)
ON CONFLICT DO NOTHING;
