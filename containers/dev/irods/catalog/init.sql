-- The iRODS catalog database: run once by the postgres image on an empty data directory.
-- Database, role and password are those of provider/setup.json (plugin_configuration.database).
CREATE ROLE irods LOGIN PASSWORD 'irods-catalog';
CREATE DATABASE "ICAT" OWNER irods;
